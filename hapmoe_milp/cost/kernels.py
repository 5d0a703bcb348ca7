"""How many kernels one layer launches per micro-batch, and how many device-to-host syncs it makes.

The host has to issue every kernel; when a layer's kernels are short (fine-grained experts, short
sequences, small micro-batches) the host, not the device, sets the pace. The counts below follow
Megatron-Core's layer structure with Transformer Engine and the fusions Megatron's performance recipes
turn on (fused norm+GEMM, fused rotary, fused attention, bias-dropout-add, SwiGLU, router fusion,
permute fusion). They are estimates of the structure, not measurements: a stack with other fusions
launches more or fewer kernels, which the device's calibrated ``launch_us`` absorbs because time is
``kernels x launch_us``.

Counted per forward (each is one kernel unless said otherwise):

- attention (GQA/MHA): input norm, QKV GEMM, rotary on Q and on K, fused attention, output GEMM,
  bias-dropout-add = 7 (2 GEMMs); QK-norm adds 2; MLA: input norm, Q down/up and KV down/up GEMMs with
  their two norms, rotary split/concat (4), fused attention, output GEMM, bias-dropout-add = 15 (5 GEMMs).
- dense MLP: pre-MLP norm, fc1, SwiGLU, fc2, bias-dropout-add = 5 (2 GEMMs).
- MoE MLP: pre-MLP norm, router GEMM, fused top-k/softmax (2), auxiliary/z losses (3) (the router, 7, 1 GEMM:
  its FP32 logits come straight out of the GEMM, ``RouterGatingLinearFunction.forward`` in
  ``megatron/core/transformer/moe/moe_utils.py``@core_v0.16.0 (3bec9aa97d) calling Transformer Engine's
  ``general_gemm`` with the router dtype as output dtype on the params-dtype weight, so no separate cast); token
  counts per expert and per destination rank (2: ``routing_map.sum(dim=0)``, whose ``.long()`` is a no-op on
  the int64 sum, and the ``input_splits`` sum in ``MoEAlltoAllTokenDispatcher.preprocess``, token_dispatcher.py
  same commit), the count exchange (1: the all-gather of the counts over TP x EP), permute (2), dispatch (1),
  chunk sort (1), one fc1 and one fc2 GEMM *per local expert* (Transformer Engine's GroupedLinear issues a cuBLAS
  GEMM per expert, round-robin over 4 compute streams: ``cost.primitives.EXPERT_GEMM_STREAMS``, which prices
  their device time with the same structure), activation, chunk sort back, combine, unpermute (2),
  bias-dropout-add = 7 + 2 + 1 + 2 + 1 + 1 + 1 + 1 + 1 + 2 + 1 = 20 + 2 x local experts (``MOE_FIXED``);
  shared experts add fc1, activation, fc2 and the add (4, 2 GEMMs). The flex dispatcher (DeepEP/HybridEP)
  fuses the count exchange, permute and unpermute into its dispatch/combine kernels (5 fewer); its token
  counts (2) are, on the DeepEP path, the routing map's conversion to top-k indices (``_DeepepManager.setup_metadata``)
  and the dispatch layout (``get_dispatch_layout`` in ``fused_a2a.py``, same commit).
- ModelLink's legacy GShard MoE (``Settings.gshard_capacity_factor``; MindSpeed ascendspeed/components/moe
  @224ae35e gate.py, moe_layer.py, experts.py, utils.py; experts ModelLink modellink/model/moe.py @0c8163f9de),
  counted from the code instead of the MoE MLP above: pre-MLP norm and residual add (2); the gate's FP32 cast
  and linear (2), softmax, top-k, one-hot (3), two cumsums and their -1 (4), the first choice's count and the
  second's offset (2), the expert counts and their copy to the host (2), the auxiliary loss (8: two means, a
  cast, a mean of the product and three scalings), the two capacity masks (4), the two slot locations (4),
  two casts (2), two bmm gate sums (2), their normalisation (4: add, clamp, two divides), two weighted masks
  (2), two one-hot slot tensors with their casts (4), two [S, E, C] products and their sum (3), the bool
  dispatch mask (1); the layer's two casts of the masks (2), dispatch and combine matmuls (2, plus the
  transposed operand's copy, 1), the all-to-all each way (2) and the concatenation of the experts' outputs
  (1) = 57 (5 GEMMs: gate, two bmm, dispatch, combine); per local expert its input copy, w1 and w3 GEMMs, SiLU, product and w2 GEMM (6, 3 GEMMs), and
  under sequence-parallel TP the all-gathers before w1 and w3 and the reduce-scatter after w2 (3).
- sequence-parallel TP adds an all-gather and a reduce-scatter around each block (4); expert-TP adds an
  all-gather and a reduce-scatter of the routed tokens (2); each context-parallel ring step adds a send,
  a receive and an attention-output correction (3).
- FP8 quantises each GEMM's activation input in the forward and its output gradient in the backward
  (weights once per step: Transformer Engine caches their FP8 copy across the micro-batches of a step).
  Dense GEMMs get one cast kernel each (their inputs come from norms and activations). Routed experts'
  inputs arrive by permute and are quantised per expert: Transformer Engine's ``GroupedLinear`` calls
  ``tex.split_quantize`` (``transformer_engine/pytorch/module/grouped_linear.py``@v2.12 (5671fd3675),
  forward and backward), which quantises each expert's split on its own unless every quantizer is a
  delayed-scaling one (``pytorch/csrc/extensions/cast.cpp``@v2.12, ``multi_tensor_quantize_impl`` and
  ``split_quantize``: only ``Float8Quantizer`` takes the fused ``nvte_multi_cast_transpose``). Megatron's
  ``tensorwise`` recipe is TE's ``Float8CurrentScaling`` (``megatron/core/fp8_utils.py``@core_v0.16.0
  (3bec9aa97d), lines 561-562), whose quantize is four launches per tensor: zero the amax and reduce it
  (``common/recipe/current_scaling.cu``@v2.12 ``launch_amax_kernel``: ``zero_amax_kernel`` then the amax
  kernel), compute the scale (``compute_scale_from_amax_kernel``) and cast (``pytorch/csrc/quantizer.cpp``
  @v2.12, ``Float8CurrentScalingQuantizer::quantize_impl``); block-scaled recipes (mxfp8, blockwise) are
  one fused cast (``MXFP8Quantizer::quantize``: one ``nvte_quantize_v2``; their GEMM-swizzled scales come
  out of that cast, ``optimize_for_gemm`` set by ``GroupedLinear._get_quantizers``@v2.12, so no separate
  swizzle kernel). The router GEMM stays in BF16.
- gated DeltaNet and Mamba mixers: ``cost.mixers`` (``GDN_KERNELS``, ``MAMBA2_KERNELS``, ``MAMBA1_KERNELS``);
  a hybrid model's one-sub-layer layers count only their sub-layer (and half the SP collectives).

Backward: two GEMMs (data and weight gradient) per forward GEMM, and 1.5 kernels per other forward
kernel (its gradient plus gradient accumulation/casts on about half of them). Full recompute re-runs the
forward inside the backward.

CUDA graphs (``Settings.cuda_graph_scope``): a captured part's kernels are replayed from the device
without the host issuing them one by one, so they add no launch idle. Megatron captures per part of a layer,
so a layer's kernels are counted per group (``_groups``) and only the captured groups' kernels drop out,
forward and backward (Transformer Engine graphs both passes), each with the FP8 casts of its own GEMMs and the
collectives issued inside it. What each scope wraps is read from Megatron-LM core_v0.16.0 (3bec9aa97d):
``megatron/core/transformer/transformer_layer.py`` ``TransformerLayer._get_submodules_under_cudagraphs`` and
``_te_cuda_graph_capture``, ``megatron/core/transformer/moe/moe_layer.py`` ``MoELayer.forward``,
``megatron/core/transformer/moe/moe_utils.py`` ``maybe_skip_or_early_return_by_cudagraph``:

- ``attn``: the input norm and the self-attention block with its bias-dropout-add (``_forward_attention``), its
  sequence-parallel all-gather/reduce-scatter (inside TE's parallel linears) and context-parallel ring steps;
  a GDN mixer sits in the same slot. ``mamba``: a Mamba mixer, likewise.
- ``mlp``: a dense layer's pre-MLP norm and MLP with its SP collectives (Megatron refuses it on MoE layers).
- ``moe``: the whole MoE block (Megatron accepts it only with drop-and-pad MoE, TransformerConfig.__post_init__).
- ``moe_router``: the pre-MLP norm and the router (7 kernels above), and the shared experts with their SP
  collectives: ``MoELayer.forward`` computes them before routing and the capture returns early after
  ``route`` (with ``moe_shared_expert_overlap`` off, Megatron's default, they are among the graph's submodules).
- ``moe_preprocess`` (accepted only with ``moe_router``, TransformerConfig.__post_init__): the capture then ends
  after ``MoELayer.preprocess``, i.e. the dispatcher's ``dispatch_preprocess`` (token_dispatcher.py). For the
  all-to-all dispatcher that is ``preprocess`` (token counts 2, count exchange 1) and the first permute (2),
  whose map is one of the graph's outputs (``cudagraph_attrs``): ``MOE_PREPROCESS_A2A`` = 5; for allgather only
  reshapes (its counting and permute follow the all-gather, in ``dispatch_postprocess``): 0; for flex the DeepEP
  manager's routing-map-to-top-k-indices conversion (``_DeepepManager.setup_metadata``; HybridEP's is reshapes
  only): 1. The counts' copy to the host moves out of that graph (``cuda_dtoh_point = "before_ep_alltoall"``).
- dispatch, experts, combine, unpermute and bias-dropout-add (with expert-TP collectives, and the block's SP
  pair when it has no shared expert) stay eager under every partial scope; MTP's extra kernels and ModelLink's
  GShard layer are captured only by whole-layer graphs (GShard also by ``moe``).
- ``layer``: every group. The dropless router's host sync always stays: a graph cannot wait on a host-read count.

Calls (``LayerKernels.calls_fwd`` / ``calls_bwd``): what the host spends CPU time on is its calls, not the
kernels they launch. Each structural kernel above stands for one call (inside Transformer Engine's
``GroupedLinear`` each expert's GEMM has its own set-up on the host: the split, two ``torch.empty`` per GEMM and
a quantizer per expert, TE issue #1499); the FP8 casts and the collectives are launched from inside the call
they serve and add none. The backward makes one call per forward call, full recompute repeats the forward's,
and captured parts make none. A span whose calls take the host longer than the device takes to run it is
host-bound (``cost.primitives.host_bound_excess``).

Syncs: the dropless router needs each expert's token count on the host to size the grouped GEMM and
the dispatch buffers, one sync per MoE layer forward (the backward reuses the counts). Read from the code:
the all-to-all dispatcher copies its counts and splits to the host on a side stream at one point and
waits once (``megatron/core/transformer/moe/token_dispatcher.py``@core_v0.16.0 (3bec9aa97d),
``_maybe_dtoh_and_synchronize``: one ``d2h_event.synchronize()`` at ``cuda_sync_point``, the earliest point
that needs a host value); its backward all-to-alls reuse those host split lists and the grouped GEMM's
backward its saved ``m_splits`` (``grouped_linear.py``@v2.12 ``ctx.m_splits``), so the backward makes none.
The flex dispatcher's DeepEP path reads ``tokens_per_expert.sum().item()`` once per forward (same file).
"""

from __future__ import annotations

from dataclasses import dataclass

from hapmoe_milp.config import ParallelConfig, graph_parts
from hapmoe_milp.cost.mixers import GDN_KERNELS, MAMBA1_KERNELS, MAMBA2_KERNELS
from hapmoe_milp.specs.model import LayerKind, ModelSpec

ATTN_GQA = (7, 2)  # (kernels, of which GEMMs)
ATTN_MLA = (15, 5)
QK_NORM = 2
DENSE_MLP = (5, 2)
MOE_FIXED = (20, 1)  # plus 2 GEMMs per local expert
MOE_ROUTER = (7, 1)  # of MOE_FIXED: pre-MLP norm, router GEMM, top-k/softmax (2), aux/z losses (3)
#: of MOE_FIXED, what ``moe_preprocess`` captures (``dispatch_preprocess``), by dispatcher (see above)
MOE_PREPROCESS_A2A = 5  # token counts (2), the count exchange (1), permute (2)
MOE_PREPROCESS = {"alltoall": MOE_PREPROCESS_A2A, "allgather": 0, "flex": 1}
SHARED_EXPERT = (4, 2)
GSHARD_FIXED = (57, 5)  # legacy GShard MoE, plus GSHARD_PER_EXPERT per local expert (see above)
GSHARD_PER_EXPERT = (6, 3)
GSHARD_EXPERT_COLLECTIVES = 3  # per local expert, under sequence-parallel TP
FLEX_FUSED = 5  # kernels the flex dispatcher folds into dispatch/combine
SP_COLLECTIVES = 4
ETP_COLLECTIVES = 2
CP_PER_STEP = 3
BWD_PER_GEMM = 2.0
BWD_PER_OTHER = 1.5
MTP_EXTRA = (6, 2)  # 2h->h projection, its norms, logits GEMM, cross-entropy
#: FP8 quantisation kernels per routed-expert FP8 GEMM, forward (input) and backward (output gradient), by
#: recipe: current scaling zeroes and reduces the amax, computes the scale and casts (TE v2.12, see above)
FP8_QUANT_KERNELS = {"tensorwise": 4, "blockwise": 1, "mxfp8": 1}


@dataclass(frozen=True)
class LayerKernels:
    fwd: float
    bwd: float
    syncs_fwd: float
    syncs_bwd: float
    calls_fwd: float = 0.0  # host calls made eagerly (see ``_Group.calls``)
    calls_bwd: float = 0.0


@dataclass(frozen=True)
class _Group:
    """One capturable part of a layer: its structural forward kernels (``kernels``, of which ``gemms`` GEMMs,
    ``bf16_gemms`` of those kept in BF16 under FP8 and ``expert_gemms`` quantised per expert), the
    parallelism's collectives issued inside it (``collectives``: SP, expert-TP, CP ring steps), and the
    graph parts that capture it (``scopes``; ``moe_preprocess`` is captured only together with ``moe_router``)."""

    name: str
    kernels: int
    gemms: int
    scopes: frozenset[str]
    collectives: int = 0
    bf16_gemms: int = 0
    expert_gemms: int = 0

    def calls(self, full_recompute: bool) -> tuple[float, float]:
        """(forward, backward) host calls of this group on one micro-batch, for the host-CPU bound
        (:func:`hapmoe_milp.cost.primitives.host_bound_excess`).

        Each structural kernel stands for one call the host makes: a framework op, or inside Transformer
        Engine's ``GroupedLinear`` one expert's GEMM with its own set-up (the split, two ``torch.empty`` per GEMM
        and a quantizer per expert, TE issue #1499). FP8 casts and collectives are issued from inside the call
        they serve, so they add kernels but no calls. Backward: one call back per forward call (autograd runs
        each op's backward); full recompute repeats the forward's calls.
        """
        fwd = float(self.kernels)
        return fwd, fwd + (fwd if full_recompute else 0.0)

    def counts(self, precision: str, fp8_recipe: str, full_recompute: bool) -> tuple[float, float]:
        """(forward, backward) kernels of this group on one micro-batch."""
        k = self.kernels + self.collectives
        bwd = BWD_PER_GEMM * self.gemms + BWD_PER_OTHER * (k - self.gemms)
        if precision == "fp8":
            # dense GEMM inputs: one cast each, fused with its producer's gradient in the backward;
            # routed experts: the recipe's quantisation kernels per expert GEMM, forward and backward
            dense = self.gemms - self.expert_gemms - self.bf16_gemms
            quant = FP8_QUANT_KERNELS[fp8_recipe] * self.expert_gemms
            k += dense + quant
            bwd += BWD_PER_OTHER * dense + quant
        if full_recompute:
            bwd += k
        return float(k), float(bwd)

    def captured(self, parts: frozenset[str]) -> bool:
        if self.name == "moe_preprocess":
            return "moe" in parts or {"moe_router", "moe_preprocess"} <= parts
        return bool(self.scopes & parts)


def layer_kernels(
    m: ModelSpec,
    cfg: ParallelConfig,
    kind: LayerKind,
    dispatcher: str,
    precision: str,
    recompute: str,
    fp8_recipe: str = "tensorwise",
    cuda_graph_scope: str = "none",
    gshard: bool = False,
) -> LayerKernels:
    groups = _groups(m, cfg, kind, dispatcher, gshard)
    parts = graph_parts(cuda_graph_scope)
    whole = cuda_graph_scope == "layer"
    fwd = bwd = calls_f = calls_b = 0.0
    for grp in groups:
        if whole or grp.captured(parts):
            continue
        f, b = grp.counts(precision, fp8_recipe, recompute == "full")
        fwd += f
        bwd += b
        cf, cb = grp.calls(recompute == "full")
        calls_f += cf
        calls_b += cb
    syncs = 1.0 if m.kind_is_moe(kind) else 0.0  # the dropless host sync: a graph cannot wait on a host-read count
    return LayerKernels(
        fwd=fwd,
        bwd=bwd,
        syncs_fwd=syncs,
        syncs_bwd=syncs if recompute == "full" else 0.0,
        calls_fwd=calls_f,
        calls_bwd=calls_b,
    )


def _groups(m: ModelSpec, cfg: ParallelConfig, kind: LayerKind, dispatcher: str, gshard: bool) -> list[_Group]:
    """A layer's kernels by the part of it a CUDA graph captures (see the module docstring)."""
    mixer, mlp = m.kind_parts(kind)
    sp = SP_COLLECTIVES // 2 if cfg.tp > 1 else 0  # per block (mixer or MLP) under sequence-parallel TP
    k, g = _mixer_kernels(m, mixer)
    # a Mamba mixer is the ``mamba`` part; attention and GDN sit in the self-attention slot (``attn``)
    mixer_scope = frozenset() if mixer is None else frozenset({"mamba" if mixer == "mamba" else "attn"})
    out = [
        _Group(
            "mixer",
            k,
            g,
            mixer_scope,
            collectives=(sp if mixer else 0) + (CP_PER_STEP * (cfg.cp - 1) if cfg.cp > 1 else 0),
        )
    ]
    if mlp == "moe":
        local = max(1, (m.num_experts or 1) // cfg.ep)
        moe = frozenset({"moe"})
        if gshard:
            per = GSHARD_PER_EXPERT[0] + (GSHARD_EXPERT_COLLECTIVES if cfg.etp > 1 else 0)
            out.append(
                _Group(
                    "gshard",
                    GSHARD_FIXED[0] + local * per,
                    GSHARD_FIXED[1] + local * GSHARD_PER_EXPERT[1],
                    moe,
                    collectives=sp,  # its expert-TP collectives are per expert (GSHARD_EXPERT_COLLECTIVES)
                    bf16_gemms=MOE_FIXED[1],
                    expert_gemms=2 * local,
                )
            )
        else:
            shared = bool(m.moe_shared_expert_intermediate_size)
            pre = MOE_PREPROCESS[dispatcher]
            rest = MOE_FIXED[0] - MOE_ROUTER[0] - pre - (FLEX_FUSED if dispatcher == "flex" else 0)
            router = frozenset({"moe", "moe_router"})
            out.append(_Group("moe_router", *MOE_ROUTER, router, bf16_gemms=MOE_ROUTER[1]))
            out.append(_Group("moe_preprocess", pre, 0, moe))
            out.append(
                _Group(
                    "moe_experts",
                    rest + 2 * local,
                    2 * local,
                    moe,
                    collectives=(0 if shared else sp) + (ETP_COLLECTIVES if cfg.etp > 1 else 0),
                    expert_gemms=2 * local,
                )
            )
            if shared:  # computed before the router, inside its graph (not overlapped: Megatron's default)
                out.append(_Group("shared_expert", *SHARED_EXPERT, router, collectives=sp))
    elif mlp == "dense":
        out.append(_Group("dense_mlp", *DENSE_MLP, frozenset({"mlp"}), collectives=sp))
    if kind == "mtp":
        out.append(_Group("mtp", *MTP_EXTRA, frozenset()))
    return out


def _mixer_kernels(m: ModelSpec, mixer: str | None) -> tuple[int, int]:
    """(kernels, of which GEMMs) of a layer's token mixer, forward."""
    if mixer == "attention":
        k, g = ATTN_MLA if m.multi_latent_attention else ATTN_GQA
        return (k + QK_NORM if m.qk_layernorm and not m.multi_latent_attention else k), g
    if mixer in ("gdn", "mamba"):
        if mixer == "gdn":
            return GDN_KERNELS
        return MAMBA1_KERNELS if m.mamba_version == 1 else MAMBA2_KERNELS
    return 0, 0
