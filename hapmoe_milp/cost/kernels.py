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
- MoE MLP: pre-MLP norm, router GEMM, fp32 cast, fused top-k/softmax (2), auxiliary/z losses (3),
  token counts per expert (2), the count exchange (1), permute (2), dispatch (1), chunk sort (1),
  one fc1 and one fc2 GEMM *per local expert* (Transformer Engine's GroupedLinear issues a cuBLAS GEMM
  per expert, round-robin over 4 compute streams: ``cost.primitives.EXPERT_GEMM_STREAMS``, which prices their
  device time with the same structure), activation, chunk sort back, combine, unpermute (2), bias-dropout-add = 20 + 2 x local
  experts; shared experts add fc1, activation, fc2 and the add (4, 2 GEMMs). The flex dispatcher
  (DeepEP/HybridEP) fuses the count exchange, permute and unpermute into its dispatch/combine kernels
  (5 fewer).
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
without the host issuing them one by one, so they add no launch idle; Megatron captures per part of a
layer (``attn`` the token mixer with its norm, ``mamba`` a Mamba mixer, ``mlp`` a dense MLP, ``moe`` a whole
MoE block, ``moe_router`` its pre-MLP norm and router, ``moe_preprocess`` its token counting) or whole
layers. The captured share of a layer's structural kernels (before the SP/CP/FP8 additions) is applied to
all its kernels, forward and backward (Transformer Engine captures both passes). The dropless router's
host sync stays: a graph cannot wait on a host-read count.

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
MOE_ROUTER = 8  # of MOE_FIXED: pre-MLP norm, router GEMM, fp32 cast, top-k/softmax (2), aux/z losses (3)
MOE_PREPROCESS = 2  # of MOE_FIXED: token counts per expert
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
    mixer, mlp = m.kind_parts(kind)
    is_moe = mlp == "moe"
    k, g = _mixer_kernels(m, mixer)
    parts = graph_parts(cuda_graph_scope)
    captured = (
        float(k) if (mixer == "mamba" and "mamba" in parts) or (mixer and mixer != "mamba" and "attn" in parts) else 0.0
    )
    syncs = 0.0
    local = max(1, (m.num_experts or 1) // cfg.ep) if is_moe else 0
    if is_moe and gshard:
        per = GSHARD_PER_EXPERT[0] + (GSHARD_EXPERT_COLLECTIVES if cfg.etp > 1 else 0)
        k += GSHARD_FIXED[0] + local * per
        g += GSHARD_FIXED[1] + local * GSHARD_PER_EXPERT[1]
        syncs = 1.0
    elif is_moe:
        moe_k = MOE_FIXED[0] + 2 * local - (FLEX_FUSED if dispatcher == "flex" else 0)
        k += moe_k
        g += MOE_FIXED[1] + 2 * local
        if m.moe_shared_expert_intermediate_size:
            k += SHARED_EXPERT[0]
            moe_k += SHARED_EXPERT[0]
            g += SHARED_EXPERT[1]
        if cfg.etp > 1:
            k += ETP_COLLECTIVES
        if "moe" in parts:
            captured += moe_k
        else:
            captured += MOE_ROUTER * ("moe_router" in parts) + MOE_PREPROCESS * ("moe_preprocess" in parts)
        syncs = 1.0
    elif mlp == "dense":
        k += DENSE_MLP[0]
        g += DENSE_MLP[1]
        captured += DENSE_MLP[0] * ("mlp" in parts)
    if kind == "mtp":
        k += MTP_EXTRA[0]
        g += MTP_EXTRA[1]
    eager = 1.0 if cuda_graph_scope == "none" else (0.0 if cuda_graph_scope == "layer" else 1.0 - captured / max(k, 1))
    if cfg.tp > 1:
        k += SP_COLLECTIVES * ((mixer is not None) + (mlp is not None)) // 2
    if cfg.cp > 1:
        k += CP_PER_STEP * (cfg.cp - 1)
    bwd = BWD_PER_GEMM * g + BWD_PER_OTHER * (k - g)
    if precision == "fp8":
        # dense GEMM inputs: one cast each, fused with its producer's gradient in the backward (as before);
        # routed experts: the recipe's quantisation kernels per expert GEMM, forward and backward
        expert = 2 * local
        dense = g - expert - (MOE_FIXED[1] if is_moe else 0)  # the router GEMM stays BF16
        quant = FP8_QUANT_KERNELS[fp8_recipe] * expert
        k += dense + quant
        bwd += BWD_PER_OTHER * dense + quant
    syncs_b = 0.0
    if recompute == "full":
        bwd += k
        syncs_b = syncs
    return LayerKernels(fwd=float(k) * eager, bwd=float(bwd) * eager, syncs_fwd=syncs, syncs_bwd=syncs_b)


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
