"""Memory per rank, itemized: the one place the planner computes memory.

A rank's device memory at its peak is

``device = allocated * (1 + fragmentation) + context + flex buffers``

where ``allocated`` is what ``torch.cuda.max_memory_allocated`` reports (Megatron's ``max allocated``):

- **model state** per local parameter (:class:`StateBytes`): the model copy (BF16, or FP8 with
  ``--fp8-param-gather``), FP8 weight copies Transformer Engine caches, the main gradients (FP32, or BF16
  with ``--grad-reduce-in-bf16``), the FP32 (or 16-bit remainder) main parameters and the Adam moments
  (FP32 or BF16 with the precision-aware optimizer). The distributed optimizer shards main parameters and
  moments over the DP x CP group for dense parameters and over the expert-DP group for experts;
  Megatron-FSDP also shards gradients (``optim_grads``) and parameters (``optim_grads_params``); optimizer
  CPU offload moves main parameters and moments to the host.
- **stored activations** per micro-batch (:func:`activation_terms`): a list of named tensors per layer kind
  with the recompute modules that regenerate them and the offload module that moves them to the host, so
  every recompute choice (none, Megatron's selective modules, full) and fine-grained activation offload
  prices from one table; times the micro-batches in flight under 1F1B or the interleaved schedule
  (:func:`hapmoe_milp.cost.pipeline.in_flight`).
- **working set**: what one layer (or the loss) needs transiently -- the regenerated tensors and
  gradients while a layer runs backward, dispatcher buffers, FP32 logits, Megatron-FSDP's unsharded
  parameter buffers.

Not an allocator item: the tied-embedding gradient all-reduce between the first and last stage at PP > 1
runs in place on the word embedding's main gradient (Megatron core_v0.6.0 cac60ce4c8
``megatron/core/distributed/finalize_model_grads.py`` ``_allreduce_word_embedding_grads``), so it adds
only its NCCL communicator, which lives outside the caching allocator with the context.

The three device terms come from the device table (:mod:`hapmoe_milp.specs.memory_terms`). The planner's
feasibility test (:meth:`MemoryModel.budget`) is the same inequality rearranged: a stage fits when its
allocated bytes are at most ``(capacity * (1 - headroom) - context - buffers) / (1 + fragmentation)``.

Megatron's own accounting (``megatron/training/theoretical_memory_usage.py``) is the oracle in
``tests/test_cost_memory_oracle.py``; the places we deliberately differ are listed there and in
:func:`activation_terms`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from hapmoe_milp.config import ParallelConfig, RecomputeSpec, Settings, parse_recompute
from hapmoe_milp.cost.primitives import BF16, FP32, GIB
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.mixers import Mamba2Shape
from hapmoe_milp.specs.model import LayerKind, ModelSpec

#: Megatron-FSDP keeps this many layers' parameters unsharded at once (the layer running and the prefetched
#: next one: its double buffer), with one layer's unsharded gradients before their reduce-scatter.
FSDP_UNSHARDED_LAYERS = 2


# ====================================================================== model state
@dataclass(frozen=True)
class StateBytes:
    """Bytes of model state on one rank (parameters, FP8 copies, gradients, main parameters, moments)."""

    params: float = 0.0
    fp8_weights: float = 0.0
    grads: float = 0.0
    main_params: float = 0.0
    optimizer: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.fp8_weights + self.grads + self.main_params + self.optimizer

    # spelled out, not through dataclasses.fields(): these run ~10^5 times while a large cluster is priced
    def __add__(self, o: StateBytes) -> StateBytes:
        return StateBytes(
            self.params + o.params,
            self.fp8_weights + o.fp8_weights,
            self.grads + o.grads,
            self.main_params + o.main_params,
            self.optimizer + o.optimizer,
        )

    def scaled(self, k: float) -> StateBytes:
        return StateBytes(
            self.params * k, self.fp8_weights * k, self.grads * k, self.main_params * k, self.optimizer * k
        )

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def bytes_per_param(st: Settings, shard: int) -> StateBytes:
    """Model-state bytes of one local parameter whose optimizer state shards over ``shard`` ranks.

    Megatron's defaults with ``--bf16``: BF16 parameter (2) + FP32 main gradient (4) + FP32 main parameter
    and two FP32 Adam moments (12), i.e. ``6 + 12/shard`` with the distributed optimizer and 18 without
    (``theoretical_memory_usage.py``). FP8 training caches the weights' FP8 rowwise and columnwise copies
    (2 bytes) between micro-batches; with ``--fp8-param-gather`` the parameter itself is FP8 (1 byte) and
    only the columnwise copy (1 byte) is cached -- Transformer Engine's weight caching, an assumption
    checked against the FP8 rows of bench/calibration/memory_runs.yaml.
    """
    d = shard if (st.distributed_optimizer or st.fsdp != "none") else 1
    fp8 = st.precision == "fp8"
    param = 1.0 if st.fp8_param_gather else 2.0
    fp8_w = (1.0 if st.fp8_param_gather else 2.0) if fp8 else 0.0
    grad = 2.0 if st.grad_reduce_in_bf16 else 4.0
    main = 4.0 if st.main_params_dtype == "fp32" else 2.0
    moments = 8.0 if st.optimizer_state_dtype == "fp32" else 4.0
    if st.optimizer_offload:
        main = moments = 0.0
    if st.fsdp in ("optim_grads", "optim_grads_params"):
        grad /= d
    if st.fsdp == "optim_grads_params":
        param /= d
        fp8_w /= d
    return StateBytes(param, fp8_w, grad, main / d, moments / d)


def layer_state(st: Settings, cfg: ParallelConfig, dense_local: float, expert_local: float) -> StateBytes:
    """Model state of ``dense_local`` parameters sharded over DP x CP and ``expert_local`` over expert-DP."""
    dense = bytes_per_param(st, cfg.dp * cfg.cp).scaled(dense_local)
    if expert_local <= 0:
        return dense
    return dense + bytes_per_param(st, cfg.edp or 1).scaled(expert_local)


# ====================================================================== activations
@dataclass(frozen=True)
class ActTerm:
    """One tensor a layer keeps for its backward, per micro-batch on this rank.

    ``dropped_by``: recompute modules that regenerate it in backward instead of keeping it (Megatron's
    ``--recompute-modules``); ``offload``: the fine-grained activation offload module that moves it to the
    host (``--offload-modules``). ``layer_input`` marks what full recompute still keeps.
    """

    name: str
    nbytes: float
    dropped_by: frozenset[str] = frozenset()
    offload: str | None = None
    layer_input: bool = False


def _t(name: str, nbytes: float, dropped: tuple[str, ...] = (), offload: str | None = None) -> ActTerm:
    return ActTerm(name, nbytes, frozenset(dropped), offload)


def _mixer_terms(m: ModelSpec, mixer: str, ts: float, q8: float, dropout: bool) -> list[ActTerm]:
    """Gated-DeltaNet / Mamba mixer (widths of :func:`hapmoe_milp.cost.mixers.mixer_widths`): norm input,
    in-projection input, and at TP-sharded widths what the mixer keeps for its backward (no Megatron
    recompute module regenerates it; see :func:`_mamba2_states` for Mamba-2)."""
    from hapmoe_milp.cost.mixers import mixer_widths

    h = m.hidden_size
    out = [
        ActTerm("mixer_norm_input", 2 * h * ts, layer_input=True),
        _t("mixer_in_proj_input", q8 * h * ts, ("layernorm",)),
    ]
    if mixer == "mamba" and isinstance(m.mamba_shape, Mamba2Shape):
        out += _mamba2_states(m.mamba_shape, ts, q8)
    else:
        # gated DeltaNet and Mamba-1: the in-projection output, the conv output, the scan output and the
        # out-projection input
        in_out, conv, inner = mixer_widths(m, mixer)
        out.append(_t("mixer_states", 2 * (in_out + conv + 2 * inner) * ts))
    if dropout:
        out.append(_t("mixer_dropout_mask", h * ts))
    return out


def _mamba2_states(shape: Mamba2Shape, ts: float, q8: float) -> list[ActTerm]:
    """What Megatron-Core's Mamba-2 mixer keeps in training (``MambaMixer._ssm_training``, the memory-
    efficient path, megatron-core 0.16.1 ``megatron/core/ssm/mamba_mixer.py``): the fused
    ``mamba_split_conv1d_scan_combined`` (state-spaces/mamba ``mamba_ssm/ops/triton/ssd_combined.py``
    @01b717ae0d, ``MambaSplitConv1dScanCombinedFn``) saves its BF16 input ``zxBCdt`` (the in-projection
    output) and the scan output before gating, and recomputes the convolution output from ``zxBCdt`` in
    backward, so the conv channels are not kept; the separate gated RMSNorm keeps its input, the
    out-projection its (FP8 under FP8 training) input."""
    return [
        _t("mamba_in_proj_output", 2 * shape.in_proj_out * ts),
        _t("mamba_scan_output", 2 * shape.inner * ts),
        _t("mamba_norm_input", 2 * shape.inner * ts),
        _t("mamba_out_proj_input", q8 * shape.inner * ts),
    ]


def _attention_terms(m: ModelSpec, ts: float, q8: float, fp8: bool, dropout: bool) -> list[ActTerm]:
    """Attention block, per token of the sequence-parallel shard (Korthikanti et al. 2205.05198 Table 2,
    flash attention: no s^2 terms). GEMM inputs Transformer Engine keeps in FP8 under FP8 training (``q8``
    bytes per element); the attention core keeps Q, K, V and its output in BF16."""
    h = m.hidden_size
    out: list[ActTerm] = [ActTerm("attn_norm_input", 2 * h * ts, offload="attn_norm", layer_input=True)]
    if m.multi_latent_attention:
        n = m.num_attention_heads
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        out.append(_t("mla_down_input", q8 * h * ts, ("layernorm",), "qkv_linear"))
        if m.q_lora_rank:
            out.append(_t("mla_q_latent", 2 * m.q_lora_rank * ts))
            out.append(_t("mla_q_up_input", q8 * m.q_lora_rank * ts, ("mla_up_proj",)))
        out.append(_t("mla_kv_latent", 2 * (m.kv_lora_rank + m.qk_pos_emb_head_dim) * ts))
        out.append(_t("mla_kv_up_input", q8 * m.kv_lora_rank * ts, ("mla_up_proj",)))
        out.append(_t("qkv", 2 * (2 * n * qk + n * m.v_head_dim) * ts, ("mla_up_proj",), "core_attn"))
        o = n * m.v_head_dim
    else:
        out.append(_t("qkv_input", q8 * h * ts, ("layernorm",), "qkv_linear"))
        out.append(_t("qkv", 2 * (m.q_dim + 2 * m.groups * m.head_dim) * ts, (), "core_attn"))
        o = m.q_dim
    if fp8:
        # the core's BF16 output is kept by the core (dropped by core_attn recompute), its FP8 copy by the proj
        out.append(_t("attn_output", 2 * o * ts, ("core_attn",)))
        out.append(_t("proj_input", o * ts, (), "attn_proj"))
    else:
        # BF16: the core's output is the projection's input, one tensor kept by both
        out.append(_t("attn_output", 2 * o * ts, (), "attn_proj"))
    if dropout:
        out.append(_t("attn_dropout_mask", h * ts))
    return out


def _legacy_terms(m: ModelSpec, ts: float, attention: bool, dense_mlp: bool) -> list[ActTerm]:
    """What Megatron-LM's pre-Core GPT (``megatron/model/transformer.py``, local implementation with
    flash-attn; read at FlagScale 26cd664, the code FlagPerf's Llama-2-70B H800 runs name) keeps beyond
    Megatron-Core with Transformer Engine, per layer in BF16:

    - ``ParallelAttention`` repeats K and V to all query heads (``repeat_interleave``) before flash
      attention, and the contiguous copies flash attention keeps are full width: ``2 x 2(q - g d)`` more;
    - flash attention keeps its output in (b, s) order and the dense projection keeps a second, contiguous
      (s, b) copy of it (``rearrange(...).contiguous()``): ``2q`` more;
    - ``ParallelMLP`` runs SwiGLU as plain PyTorch (``F.silu(x[0]) * x[1]``), whose multiply keeps the SiLU
      output besides the fc1 output and the product: ``2F`` more (MLP recompute regenerates it).
    """
    out = []
    if attention and not m.multi_latent_attention:
        out.append(_t("legacy_kv_expanded", 2 * 2 * (m.q_dim - m.groups * m.head_dim) * ts))
        out.append(_t("legacy_attn_output_copy", 2 * m.q_dim * ts))
    if dense_mlp and m.swiglu:
        out.append(_t("legacy_swiglu_silu_output", 2 * m.ffn * ts, ("mlp",)))
    return out


def _mlp_terms(m: ModelSpec, ts: float, q8: float, dropout: bool) -> list[ActTerm]:
    h, f = m.hidden_size, m.ffn
    glu_out = 2 if m.swiglu else 1
    out = [
        _t("mlp_norm_input", 2 * h * ts, (), "mlp_norm"),
        _t("fc1_input", q8 * h * ts, ("layernorm", "mlp")),
        _t("fc1_output", 2 * glu_out * f * ts, ("mlp",)),
        _t("fc2_input", q8 * f * ts, ("mlp",)),
    ]
    if dropout:
        out.append(_t("mlp_dropout_mask", h * ts))
    return out


def _moe_terms(m: ModelSpec, cfg: ParallelConfig, ts: float, rows: float, q8: float, dropout: bool) -> list[ActTerm]:
    """MoE block. ``rows``: routed (token, expert) rows on this rank after dispatch and the expert-TP
    all-gather (``k * ts * ETP`` times the load-imbalance factor)."""
    h = m.hidden_size
    fe = m.expert_ffn / cfg.etp
    glu_out = 2 if m.swiglu else 1
    out = [
        _t("mlp_norm_input", 2 * h * ts, (), "mlp_norm"),
        _t("router_input", 2 * h * ts, ("layernorm", "moe")),
        _t("router_probs", FP32 * (m.num_experts or 0) * ts, ("moe",)),
        _t("expert_fc1_input", q8 * h * rows, ("moe",), "expert_fc1"),
        _t("expert_fc1_output", 2 * glu_out * fe * rows, ("moe",), "moe_act"),
        _t("expert_fc2_input", q8 * fe * rows, ("moe_act", "moe")),
    ]
    fs = m.moe_shared_expert_intermediate_size
    if fs:
        out.append(_t("shared_fc1_output", 2 * glu_out * fs * ts, ("shared_experts", "moe")))
        out.append(_t("shared_fc2_input", q8 * fs * ts, ("shared_experts", "moe")))
    if dropout:
        out.append(_t("mlp_dropout_mask", h * ts))
    return out


def activation_terms(
    m: ModelSpec, st: Settings, cfg: ParallelConfig, b: int, kind: LayerKind, routed_rows: float = 0.0
) -> tuple[ActTerm, ...]:
    """Every tensor one layer of ``kind`` keeps per micro-batch of ``b`` samples on this rank.

    Tokens per rank ``ts = b*S/(CP*TP)`` (context parallelism splits the sequence, sequence parallelism the
    rest). For a dense MHA non-gated layer in BF16 with dropout this is ``ts*(18h + 4F)``, Megatron's SP
    formula (``compute_activation_memory``). Where we differ from that formula, deliberately:

    - dropout masks only when dropout is on (current LLM recipes train without it; Megatron's default is on);
    - GQA / MLA / wide-Q attention at their real widths, gated MLPs (``2F`` fc1 output);
    - FP8 training keeps GEMM inputs in FP8 (1 byte), the attention core's tensors in BF16;
    - MoE layers store routed rows (``k`` copies per token, ETP-gathered, imbalance-weighted) at the expert
      width, the FP32 router probabilities and the shared experts (Megatron uses the dense FFN width);
    - CP divides the tokens; recompute follows the module list (Megatron only knows selective ``core_attn``);
    - ``legacy_model`` adds what the pre-Core transformer keeps on top (:func:`_legacy_terms`).
    """
    ts = b * st.seq_length / (cfg.cp * cfg.tp)
    fp8 = st.precision == "fp8"
    q8 = 1.0 if fp8 else 2.0
    mixer, mlp_kind = m.kind_parts(kind)
    out: list[ActTerm] = []
    if mixer == "attention":
        out += _attention_terms(m, ts, q8, fp8, st.dropout)
    elif mixer is not None:
        out += _mixer_terms(m, mixer, ts, q8, st.dropout)
    if mlp_kind == "moe":
        out += _moe_terms(m, cfg, ts, routed_rows * st.expert_rows_factor, q8, st.dropout)
    elif mlp_kind == "dense":
        out += _mlp_terms(m, ts, q8, st.dropout)
    if st.legacy_model:
        out += _legacy_terms(m, ts, mixer == "attention", mlp_kind == "dense")
    if mixer is None and out:  # a hybrid model's MLP-only layer: its norm's input is the layer's input
        out[0] = replace(out[0], layer_input=True)
    if kind == "mtp":
        h = m.hidden_size
        # embedding and hidden norms' inputs, and the 2h -> h projection's input
        out += [_t("mtp_norm_inputs", 2 * 2 * h * ts), _t("mtp_proj_input", q8 * 2 * h * ts)]
    return tuple(out)


def stored_bytes(terms: tuple[ActTerm, ...], spec: RecomputeSpec, offload: tuple[str, ...] = ()) -> float:
    """Bytes a layer keeps per micro-batch under a recompute choice and activation offload.

    Full recompute keeps only the layer input; uniform groups of N layers keep one input per group;
    selective recompute drops the terms its modules regenerate; offloaded terms live on the host.
    """
    if spec.granularity == "full":
        inp = sum(t.nbytes for t in terms if t.layer_input)
        return inp / spec.num_layers if spec.method == "uniform" else inp
    mods = set(spec.modules)
    return sum(t.nbytes for t in terms if not (t.dropped_by & mods) and t.offload not in offload)


def offloaded_bytes(terms: tuple[ActTerm, ...], spec: RecomputeSpec, offload: tuple[str, ...]) -> float:
    """Bytes per micro-batch that fine-grained activation offload moves to the host (and back)."""
    if spec.granularity == "full" or not offload:
        return 0.0
    mods = set(spec.modules)
    return sum(t.nbytes for t in terms if t.offload in offload and not (t.dropped_by & mods))


def working_bytes(terms: tuple[ActTerm, ...], spec: RecomputeSpec, dispatch_rows: float, h: int) -> float:
    """Transient bytes while one layer runs: its whole activation set (regenerated under recompute, or
    the matching gradients while its backward runs), plus the alltoall dispatch and combine buffers of
    the routed rows; uniform recompute regenerates a whole group of layers at once."""
    full = sum(t.nbytes for t in terms)
    group = spec.num_layers if (spec.granularity == "full" and spec.method == "uniform") else 1
    return group * full + 2 * dispatch_rows * h * BF16


def layer_working_bytes(
    m: ModelSpec,
    st: Settings,
    cfg: ParallelConfig,
    b: int,
    kind: LayerKind,
    terms: tuple[ActTerm, ...],
    spec: RecomputeSpec,
    routed_rows: float,
) -> float:
    """One layer's working set (:func:`working_bytes`) with its dispatch rows (``routed_rows`` times the
    load imbalance, MoE layers only) and, for an MTP layer, its own logits and loss (:func:`head_bytes`)."""
    moe = m.kind_parts(kind)[1] == "moe"
    work = working_bytes(terms, spec, routed_rows * st.expert_rows_factor if moe else 0.0, m.hidden_size)
    if kind == "mtp":
        work += head_bytes(m, st, cfg, b)[1]
    return work


def expert_row_bytes(m: ModelSpec, st: Settings, etp: int, recompute: str) -> float:
    """Bytes kept per routed row by the experts alone (for attention/expert disaggregation, where the
    experts run on other devices): the fc1 input, fc1 output and fc2 input at width ``F/ETP``; full
    recompute keeps the dispatched input only."""
    spec = parse_recompute(recompute)
    q8 = 1.0 if st.precision == "fp8" else 2.0
    terms = tuple(t for t in _moe_terms(m, ParallelConfig(etp=etp, dp=etp), 0.0, 1.0, q8, False) if t.nbytes)
    if spec.granularity == "full":
        return q8 * m.hidden_size
    return stored_bytes(terms, spec)


def embedding_bytes(m: ModelSpec, st: Settings, cfg: ParallelConfig, b: int) -> float:
    """What the input embedding keeps per micro-batch: the int64 token ids of the rank's sequence shard
    (every TP rank holds them) and, with dropout, the embedding dropout mask. Its output is the first
    layer's input, counted there. Megatron's formula charges ``8sb + sbh`` over TP."""
    t = b * st.seq_length / cfg.cp
    return 8.0 * t + (m.hidden_size * t / cfg.tp if st.dropout else 0.0)


def head_bytes(m: ModelSpec, st: Settings, cfg: ParallelConfig, b: int) -> tuple[float, float]:
    """(kept per micro-batch, transient) of the final norm, output layer and loss: the norm's input and
    the output GEMM's (local, sequence-parallel) input in BF16 -- Megatron runs the output layer in BF16 --
    and, transiently, the logits of the rank's vocabulary shard: BF16 out of the GEMM, FP32 in the
    vocabulary-parallel cross entropy, and their FP32 gradient (8 bytes per logit in all)."""
    t = b * st.seq_length / cfg.cp
    ts = t / cfg.tp
    kept = 2 * 2 * m.hidden_size * ts
    logits = (BF16 + 2 * FP32) * t * m.padded_vocab(cfg.tp) / cfg.tp
    return kept, logits


def fsdp_buffer_bytes(st: Settings, layer_params: float) -> float:
    """Megatron-FSDP's transient buffers with sharded parameters: :data:`FSDP_UNSHARDED_LAYERS` layers of
    unsharded BF16 parameters and one layer of unsharded gradients before their reduce-scatter."""
    if st.fsdp != "optim_grads_params":
        return 0.0
    grad = BF16 if st.grad_reduce_in_bf16 else FP32
    return layer_params * (FSDP_UNSHARDED_LAYERS * BF16 + grad)


# ====================================================================== the rank's total
@dataclass(frozen=True)
class MemoryModel:
    """Device-level terms and the capacity rule for one device type under one run's settings."""

    device: DeviceSpec
    settings: Settings

    def outside_bytes(self, cfg: ParallelConfig | None) -> float:
        """Bytes outside the caching allocator: context, and DeepEP/HybridEP buffers when the flex
        dispatcher runs expert parallelism on this rank."""
        t = self.device.memory
        flex = self.settings.dispatcher == "flex" and cfg is not None and cfg.ep > 1
        return (t.context_gib + (t.flex_buffer_gib if flex else 0.0)) * GIB

    def usable(self) -> float:
        """The capacity rule: the device's memory less the reserved headroom (``--memory-headroom``)."""
        return self.device.memory_gib * GIB * (1.0 - self.settings.memory_headroom)

    def budget(self, cfg: ParallelConfig | None = None) -> float:
        """Allocated bytes a rank may reach: the feasibility test of search and estimate alike."""
        return max(0.0, self.usable() - self.outside_bytes(cfg)) / (1.0 + self.device.memory.fragmentation)

    def device_total(self, allocated: float, cfg: ParallelConfig | None) -> float:
        return allocated * (1.0 + self.device.memory.fragmentation) + self.outside_bytes(cfg)

    def items(self, allocated_items: dict[str, float], cfg: ParallelConfig | None) -> dict[str, float]:
        """The itemized device total: the allocator items, then fragmentation, context and buffers."""
        t = self.device.memory
        alloc = sum(allocated_items.values())
        out = dict(allocated_items)
        out["fragmentation"] = alloc * t.fragmentation
        out["context"] = t.context_gib * GIB
        out["flex_buffers"] = self.outside_bytes(cfg) - t.context_gib * GIB
        return out


def recompute_spec(value: str) -> RecomputeSpec:
    return parse_recompute(value)


__all__ = [
    "FSDP_UNSHARDED_LAYERS",
    "ActTerm",
    "MemoryModel",
    "StateBytes",
    "activation_terms",
    "bytes_per_param",
    "embedding_bytes",
    "expert_row_bytes",
    "fsdp_buffer_bytes",
    "head_bytes",
    "layer_state",
    "layer_working_bytes",
    "offloaded_bytes",
    "recompute_spec",
    "stored_bytes",
    "working_bytes",
]
