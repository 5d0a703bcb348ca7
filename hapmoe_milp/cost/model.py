"""The MoE-aware cost model: one place that prices every layer, edge, boundary and sync.

Everything the search optimises is linear in the per-stage layer counts of each layer kind, with
coefficients produced here; :mod:`hapmoe_milp.cost.estimate` sums the same coefficients to evaluate a
plan. That is what lets the DP, CP-SAT and MILP optimise exactly the quantity `estimate` reports.

Conventions (per rank, per micro-batch of ``b`` samples on that stage's replica):
``t = b*S/CP`` tokens of sequence; with sequence parallelism (always on when TP > 1, as Megatron requires
for MoE) element-wise work and stored activations are further split by TP.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

import numpy as np

from hapmoe_milp.config import ParallelConfig, Recompute, Settings, parse_recompute
from hapmoe_milp.cost.attention import core_time, layer_groups
from hapmoe_milp.cost.fsdp import fsdp_exposed, fsdp_sync
from hapmoe_milp.cost.kernels import layer_kernels
from hapmoe_milp.cost.layer import ELEMENTWISE_PASSES_H, layer_comm, layer_compute  # noqa: F401 (re-exported)
from hapmoe_milp.cost.memory import (
    MemoryModel,
    StateBytes,
    activation_terms,
    embedding_bytes,
    expert_row_bytes,
    fsdp_buffer_bytes,
    head_bytes,
    layer_state,
    layer_working_bytes,
    stored_bytes,
)
from hapmoe_milp.cost.mixers import mixer_cost
from hapmoe_milp.cost.primitives import (
    BF16,
    FP32,
    collective_time,
    dispatch_time,
    ep_overlap_host_hidden,
    ep_overlap_share,
    expert_gemm_time,
    gemm_time,
    host_bound_excess,
    host_overhead,
    memory_time,
)
from hapmoe_milp.cost.recompute import offload_time, recompute_forward
from hapmoe_milp.cost.routing import distinct_destinations
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.model import LayerKind, ModelSpec

# Megatron's default DDP bucket: max(40M, 1M * dp) parameters (distributed_data_parallel_config.py).
BUCKET_PARAMS = 40_000_000
# Adam step on the fp32 shard: read master, grad, m, v (16 B), write master, m, v (12 B), bf16 param (2 B).
ADAM_BYTES_PER_PARAM = 30
#: HBM bytes per logit of the rank's vocabulary shard that the unfused cross-entropy moves, (forward, backward).
#: Megatron casts the BF16 logits to FP32 before its vocabulary-parallel cross-entropy (legacy
#: post_language_model_processing and Megatron-Core LanguageModule.compute_language_model_loss without
#: --cross-entropy-loss-fusion: ``vocab_parallel_cross_entropy(logits.float(), labels)``), whose forward (Megatron
#: core_r0.6 tensor_parallel/cross_entropy.py; MindSpeed's patched forward, mindspeed/core/tensor_parallel/
#: cross_entropy.py@2b0edd2, the MindSpeed commit of MindSpeed-LLM@104cd47479 CHANGELOG.md Version 1.1, moves the same tensors):
#: the cast (read 2, write 4) 6, max (read) 4, subtract the max (read, write) 8, exp in place 8, the sum 4, the
#: in-place normalisation to the softmax it saves 8 = 38; backward: scale the saved softmax by the loss gradient in
#: place 8 and the cast's gradient back to BF16 (read 4, write 2) 6 = 14. (The fused TE / Triton kernels of
#: --cross-entropy-loss-fusion move less; not distinguished here.) Derived from the code, not measured.
CE_BYTES = (38.0, 14.0)
#: The fused kernels (``Settings.cross_entropy_fusion``): assumed three FP32 passes each way, the price every
#: cross-entropy had before CE_BYTES (not derived from the fused kernels' code).
CE_FUSED_BYTES = (12.0, 12.0)


@dataclass(frozen=True)
class LayerCost:
    """Per-rank, per-micro-batch cost of one layer (or edge) under one stage option."""

    fwd: float
    bwd: float
    compute: float
    tp: float
    cp: float
    ep: float
    act: float  # bytes stored per micro-batch in flight
    weights: float  # bytes: params + grads + optimizer state on this rank
    params_dense: float  # local dense params (after TP)
    params_expert: float  # local expert params (after EP*ETP)
    rs: float  # seconds: gradient reduce-scatter (or all-reduce) of this layer's grads, once per iteration
    ag: float  # seconds: parameter all-gather after the step (distributed optimizer)
    opt: float  # seconds: optimizer step for this layer's shard
    work: float = 0.0  # transient bytes needed while this layer runs (not multiplied by in-flight count)
    host: float = 0.0  # seconds the host adds beyond device work: launch-bound excess and syncs (fwd + bwd)
    parts: dict[str, float] = field(default_factory=dict, compare=False)
    state: StateBytes = field(default_factory=StateBytes, compare=False)  # itemized ``weights`` (cost/memory.py)


@dataclass(frozen=True)
class _LayerBase:
    """A layer's recompute-independent pieces (:meth:`CostModel._layer_base`): shared by the recompute
    ladder's rungs of one (device, config, micro-batch, kind), which the search prices side by side."""

    compute: Any  # cost.layer's kernel-time breakdown
    is_moe: bool
    fparts: dict[str, float]  # forward pieces recompute repeats (cost/recompute.py)
    terms: Any  # activation terms (cost/memory.py)
    tp_f: float
    tp_b: float
    cp_f: float
    cp_b: float
    ep_total: float
    gpu_f: float
    gpu_b: float  # before recompute
    dense_local: float
    exp_local: float
    state: Any
    weights: float
    rs: float
    ag: float
    opt: float
    fsdp_f: float
    fsdp_b: float


@dataclass(frozen=True)
class LayerSplit:
    """A MoE layer's attention side (attention, router, norms, permute, shared experts, TP comm, host
    overheads), per micro-batch on one rank, and the model's dense layers on the same mesh; routed
    experts are priced apart by :meth:`CostModel.expert_gemms`."""

    attention_fwd: float
    attention_bwd: float
    attention_act: float  # stored bytes without the routed experts' activations
    dense_fwd: float
    dense_bwd: float
    dense_act: float


ZERO = LayerCost(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


T = TypeVar("T")


def _clip0(x: Any) -> Any:
    """``max(0, x)`` for a float or, elementwise, a numpy array."""
    return np.maximum(x, 0.0) if isinstance(x, np.ndarray) else max(0.0, x)


def link_for_span(span: int, node_size: int) -> str:
    return "intra" if span <= node_size else "inter"


def rails_per_node(n: int, span: int, node_size: int) -> int:
    """Members a group of ``n`` ranks spread evenly over ``span`` consecutive ranks has in each node it spans
    (a DP group over a TP x CP mesh has ``node / (TP x CP)``): the NICs its ring collectives add up."""
    nodes = max(1, math.ceil(span / node_size))
    return max(1, min(node_size, n // nodes))


#: Memo tags of the priced things whose state terms (weights, optimizer) depend on optimizer offload:
#: layers, the first stage's embedding and the last stage's head (:meth:`CostModel.for_settings`).
_STATE_TAGS = ("L", "E", "H", "Hs")


class CostModel:
    """Prices layers for one (model, cluster, settings); memoised per option."""

    def __init__(
        self, model: ModelSpec, cluster: ClusterSpec, settings: Settings, *, ep_comm_visible: bool = True
    ) -> None:
        """``ep_comm_visible=False`` prices expert-parallel dispatch/combine at zero and nothing else
        differently: the view of an MoE-unaware planner (Metis-style), which profiles layers on one device."""
        self.model = model
        self.cluster = cluster
        self.settings = settings
        self.ep_comm_visible = ep_comm_visible
        self._memo: dict[tuple[Any, ...], Any] = {}
        self._shared: dict[tuple[Any, ...], Any] | None = None  # another offload setting's memo (for_settings)
        self._attn_groups: tuple[tuple[tuple[int, int], int], ...] | None = None  # attention.layer_groups, once

    def for_settings(self, settings: Settings) -> CostModel:
        """This cost model for ``settings`` that differ from its own only in optimizer offload (the retry
        of a search that found nothing fitting). Offload changes only the weights and optimizer terms of a
        layer or an edge (:meth:`state_and_sync`); everything else -- times, activations, working sets,
        p2p -- reads settings offload leaves alone. So layers either model priced are re-priced by the
        other only in those two terms, and the retry does not price every option again."""
        if settings == self.settings:
            return self
        if replace(settings, optimizer_offload=self.settings.optimizer_offload) != self.settings:
            raise ValueError("for_settings shares layer costs only across the optimizer-offload setting")
        out = CostModel(self.model, self.cluster, settings, ep_comm_visible=self.ep_comm_visible)
        out._shared = self._memo
        self._shared = out._memo
        return out

    # ------------------------------------------------------------------ helpers
    def _cached(self, tag: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, computed once per cost model: the same option is priced again and again (every
        instance, every solver, the final estimate), and its price depends only on ``args``; a layer or an
        edge the other offload setting priced is re-priced only in its state terms (:meth:`for_settings`)."""
        key = (tag, *args)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._reuse(key) if tag in _STATE_TAGS else None
            if hit is None:
                hit = fn(*args)
            self._memo[key] = hit
        return hit

    def _reuse(self, key: tuple[Any, ...]) -> Any:
        """The other offload setting's cost of ``key`` (a layer or an edge: ``(tag, device, config, ...)``),
        its weights and optimizer terms re-priced; None if it has not priced it."""
        other = self._shared.get(key) if self._shared is not None else None
        if other is None:
            return None
        did, cfg = key[1], key[2]
        weights, _rs, _ag, opt = self.state_and_sync(
            self.device(did), did, cfg, other.params_dense, other.params_expert
        )
        return replace(other, weights=weights, opt=opt)

    def device(self, did: str) -> DeviceSpec:
        return self.cluster.device(did)

    def node(self, did: str) -> int:
        return self.cluster.node_size(did)

    def collective(self, dev: DeviceSpec, did: str, prim: str, size: float, n: int, span: int, **kw: float) -> float:
        node = self.node(did)
        link = link_for_span(span, node)
        frac = dev.intra.group_bandwidth_fraction(n, node) if link == "intra" else 1.0
        return collective_time(dev, prim, link, size, n, bw_fraction=frac, rails=rails_per_node(n, span, node), **kw)

    # ------------------------------------------------------------------ one layer
    def layer(self, did: str, cfg: ParallelConfig, b: int, kind: LayerKind, recompute: Recompute) -> LayerCost:
        return self._cached("L", self._layer, did, cfg, b, kind, recompute)

    def _layer(self, did: str, cfg: ParallelConfig, b: int, kind: LayerKind, recompute: Recompute) -> LayerCost:
        """One layer on one micro-batch of ``b`` samples under ``recompute``: the recompute-independent pieces
        (:meth:`_layer_base`, priced once for every rung of the recompute ladder), then recompute, host
        overheads and the activations it keeps, composed here."""
        m, st, dev = self.model, self.settings, self.device(did)
        base = self._cached("Lb", self._layer_base, did, cfg, b, kind)
        c = base.compute
        # ---- recompute: extra forward work during backward, by Megatron module (cost/recompute.py)
        spec = parse_recompute(recompute)
        rec, rec_tp, rec_cp, rec_ep = recompute_forward(spec, base.fparts)
        rec += offload_time(dev, st, base.terms, spec, c.f_comp)
        gpu_b = base.gpu_b + rec
        # ---- host: kernels issued per micro-batch, and the dropless router's token-count sync
        kern = layer_kernels(
            m,
            cfg,
            kind,
            st.dispatcher,
            st.precision,
            "full" if spec.granularity == "full" else "none",
            st.fp8_recipe,
            st.cuda_graph_scope,
            gshard=bool(st.gshard_capacity_factor),
        )
        host_f = host_overhead(kern.fwd, dev, kern.syncs_fwd)
        host_b = host_overhead(kern.bwd, dev, kern.syncs_bwd)
        if st.overlap_ep_comm and base.is_moe and base.ep_total > 0:
            host_f -= ep_overlap_host_hidden(dev, st.dispatcher, host_f, c.b_comp)
        # ---- host-bound spans: the forward (bounded by its sync) and the backward each last at least as long as
        # their framework calls; under EP-communication overlap one micro-batch's forward layer and another's
        # backward layer are issued as one interleaved span, so their calls and device time pool
        dev_f, dev_b = base.gpu_f + host_f + base.fsdp_f, gpu_b + host_b + base.fsdp_b
        if st.overlap_ep_comm and base.is_moe and base.ep_total > 0:
            calls = kern.calls_fwd + kern.calls_bwd
            excess = host_bound_excess(dev, calls, dev_f + dev_b)
            share = kern.calls_fwd / calls if calls > 0 else 0.0
            host_f += share * excess
            host_b += (1.0 - share) * excess
        else:
            host_f += host_bound_excess(dev, kern.calls_fwd, dev_f)
            host_b += host_bound_excess(dev, kern.calls_bwd, dev_b)
        # ---- memory: stored activations and the working set under this recompute
        act = stored_bytes(base.terms, spec, st.offload_modules)
        work = layer_working_bytes(m, st, cfg, b, kind, base.terms, spec, c.routed_rows)
        return LayerCost(
            fwd=base.gpu_f + host_f + base.fsdp_f,
            bwd=gpu_b + host_b + base.fsdp_b,
            compute=c.f_comp + c.b_comp + rec - rec_tp - rec_cp - rec_ep,
            tp=base.tp_f + base.tp_b + rec_tp,
            cp=base.cp_f + base.cp_b + rec_cp,
            ep=base.ep_total + rec_ep,
            act=act,
            weights=base.weights,
            params_dense=base.dense_local,
            params_expert=base.exp_local,
            rs=base.rs,
            ag=base.ag,
            opt=base.opt,
            work=work,
            host=host_f + host_b,
            parts={
                "recompute": rec,
                "kernels_fwd": kern.fwd,
                "kernels_bwd": kern.bwd,
                "fsdp": base.fsdp_f + base.fsdp_b,
            },
            state=base.state,
        )

    def _layer_base(self, did: str, cfg: ParallelConfig, b: int, kind: LayerKind) -> _LayerBase:
        """The pieces of a layer's price that no recompute setting changes: kernel time and communication
        (:mod:`hapmoe_milp.cost.layer`) with EP and TP overlap, the forward pieces recompute repeats, the
        activation terms it chooses among, and model state with its gradient/parameter sync."""
        m, st, dev = self.model, self.settings, self.device(did)
        prec = st.precision
        tp = cfg.tp
        t = b * st.seq_length / cfg.cp
        ts = t / tp  # sequence-parallel shard
        mixer, mlp_kind = m.kind_parts(kind)
        is_moe = mlp_kind == "moe"
        c = layer_compute(self, dev, did, cfg, t, ts, kind, mixer, mlp_kind)
        f_comp, b_comp, routed_rows = c.f_comp, c.b_comp, c.routed_rows
        tp_f, cp_f, cp_b, ep_f = layer_comm(self, dev, did, cfg, t, ts, mixer, is_moe, c)
        # EP overlap (--overlap-moe-expert-parallel-comm) runs one micro-batch's dispatch/combine beside another's
        # computation, so it hides at most that computation: a share ep_overlap of min(comm, compute). Backward
        # repeats the forward traffic.
        ep_exposed = 1.0
        if st.overlap_ep_comm and ep_f > 0:
            hidden = ep_overlap_share(dev, st.dispatcher) * min(2 * ep_f, f_comp + b_comp)
            ep_exposed = 1.0 - hidden / (2 * ep_f)
        ep_total = 2 * ep_f * ep_exposed
        # TP overlap (userbuffers / MC2) splits each TP collective into chunks pipelined with the GEMM it feeds
        # or drains, so it hides behind that pass's computation: a share tp_overlap of min(comm, compute) each way.
        tp_b = tp_f
        if st.tp_comm_overlap and tp_f > 0:
            tp_b = tp_f - dev.runtime.tp_overlap * min(tp_f, b_comp)
            tp_f = tp_f - dev.runtime.tp_overlap * min(tp_f, f_comp)
        h = m.hidden_size
        fparts = {
            "compute": f_comp,
            "tp": tp_f,
            "cp": cp_f,
            "ep": ep_f * ep_exposed,
            "core_attn": c.attn_core_f,
            "layernorm": memory_time(dev, 2 * c.sublayers * ts * h * BF16),  # each sub-layer's norm, read + write
            "moe_act": memory_time(dev, 3 * routed_rows * m.expert_ffn / cfg.etp * BF16) if is_moe else 0.0,
            "mlp": c.mlp_f,
            "tp_mlp": tp_f / (c.n_tp_coll / 2) if tp > 1 and c.n_tp_coll else 0.0,
            "shared_experts": c.shared_f,
            "moe": (c.moe_f + c.shared_f) if is_moe else 0.0,
            "mla_up_proj": self._mla_up_gemms(dev, t, tp, prec)
            if mixer == "attention" and m.multi_latent_attention
            else 0.0,
        }
        p = m.layer_params(kind)
        dense_local = p["tp"] / tp + p["replicated"]
        exp_local = p["expert"] / (cfg.ep * cfg.etp) if p["expert"] else 0.0
        weights, rs, ag, opt = self.state_and_sync(dev, did, cfg, dense_local, exp_local)
        fsdp_f, fsdp_b = fsdp_exposed(self, dev, did, cfg, dense_local, exp_local, c.f_comp, c.b_comp)
        return _LayerBase(
            compute=c,
            is_moe=is_moe,
            fparts=fparts,
            terms=activation_terms(m, st, cfg, b, kind, routed_rows),
            tp_f=tp_f,
            tp_b=tp_b,
            cp_f=cp_f,
            cp_b=cp_b,
            ep_total=ep_total,
            gpu_f=f_comp + tp_f + cp_f + (ep_total / 2),
            gpu_b=b_comp + tp_b + cp_b + (ep_total / 2),
            dense_local=dense_local,
            exp_local=exp_local,
            state=layer_state(st, cfg, dense_local, exp_local),
            weights=weights,
            rs=rs,
            ag=ag,
            opt=opt,
            fsdp_f=fsdp_f,
            fsdp_b=fsdp_b,
        )

    def expert_gemms(self, did: str, rows_per_expert: float, local: int, etp: int, grouped: bool = True) -> float:
        """Forward of ``local`` routed experts with ``rows_per_expert`` rows each at width F/ETP: the two
        grouped GEMMs (as the stack runs them: :func:`expert_gemm_time`) and the activation function (backward
        is twice this; imbalance not included).
        ``grouped=False``: a loop of dense GEMMs, one expert at a time, with separate gate and up projections
        (the legacy GShard layer's Experts of MixtralParallelMLPBM: w1, w3, w2)."""
        m, dev = self.model, self.device(did)
        fe, h, prec = m.expert_ffn, m.hidden_size, self.settings.precision
        if grouped:
            t = expert_gemm_time(dev, rows_per_expert, (m.glu - 1) * fe / etp, h, prec, local)
            t += expert_gemm_time(dev, rows_per_expert, h, fe / etp, prec, local)
        else:
            t = local * (m.glu - 1) * gemm_time(dev, rows_per_expert, fe / etp, h, prec)
            t += local * gemm_time(dev, rows_per_expert, h, fe / etp, prec)
        return t + memory_time(dev, 3 * rows_per_expert * local * fe / etp * BF16)

    def layer_split(self, did: str, tp: int, b: int, recompute: Recompute) -> LayerSplit:
        """One MoE layer cut where attention/expert disaggregation (HeterMoE's zebra parallelism) cuts it:
        the attention side is the layer with every expert local (EP = ETP = 1, no dispatch) minus the
        routed-expert work, which :meth:`expert_gemms` prices wherever the experts run."""
        m, st = self.model, self.settings
        cfg = ParallelConfig(tp=tp, dp=1, ep=1, etp=1)
        lay = self.layer(did, cfg, b, "moe", recompute)
        E, k = m.num_experts or 1, m.moe_router_topk
        ts = b * st.seq_length / tp
        routed = st.expert_rows_factor * self.expert_gemms(did, k * ts / E, E, 1)
        full = parse_recompute(recompute).granularity == "full"
        routed_act = k * ts * st.expert_rows_factor * expert_row_bytes(m, st, 1, "none")
        dense_f = dense_b = dense_act = 0.0
        if "dense" in m.layer_kinds:
            dl = self.layer(did, cfg, b, "dense", recompute)
            dense_f, dense_b, dense_act = dl.fwd, dl.bwd, dl.act
        return LayerSplit(
            attention_fwd=lay.fwd - routed,
            attention_bwd=lay.bwd - 2 * routed - (routed if full else 0.0),
            attention_act=lay.act - (0.0 if full else routed_act),
            dense_fwd=dense_f,
            dense_bwd=dense_b,
            dense_act=dense_act,
        )

    def expert_act_per_row(self, etp: int, recompute: Recompute) -> float:
        """Stored bytes per routed row on an expert device (input, fc1 output and activation at F/ETP)."""
        return expert_row_bytes(self.model, self.settings, etp, recompute)

    def cross_dispatch(self, src: str, dst: str, total_bytes: float, src_devices: int, dst_devices: int) -> float:
        """One dispatch (or combine) of ``total_bytes`` between two device types over the cross link:
        bipartite, so the side with fewer devices sets the time; plus the link latency."""
        bw = self.cluster.cross.bandwidth(self.device(src), self.device(dst)) * 1e9
        return max(total_bytes / src_devices, total_bytes / dst_devices) / bw + self.cluster.cross.latency_us * 1e-6

    def _mixer_time(
        self, dev: DeviceSpec, mixer: str | None, t: float, tp: int, prec: str, cp: int = 1
    ) -> tuple[float, float, float, float]:
        """Forward and backward compute of a layer's token mixer, and of the attention core alone (what
        context parallelism's ring exchange can hide behind); zeros for a layer without a mixer."""
        m, S = self.model, self.settings.seq_length
        if mixer == "attention":
            attn_lin = self._attention_gemms(dev, t, tp, prec)
            # causal: each query sees S/2 keys on average (fewer under a sliding window or in chunks)
            if self._attn_groups is None:
                self._attn_groups = layer_groups(m, S)
            core_f, core_b = core_time(m, dev, t * self._core_macs() * 2 / tp, S, self._attn_groups, cp)
            return attn_lin + core_f, 2 * attn_lin + core_b, core_f, core_b
        if mixer in ("gdn", "mamba"):
            mc = mixer_cost(m, dev, mixer, t, tp, S, prec)
            return mc.fwd, mc.bwd, 0.0, 0.0
        return 0.0, 0.0, 0.0, 0.0

    def _core_macs(self) -> float:
        """Attention-core multiply-accumulates per (query token, key token) pair, all heads."""
        m = self.model
        if m.multi_latent_attention:
            return m.num_attention_heads * (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim) / 2
        return m.num_attention_heads * m.head_dim

    def _attention_gemms(self, dev: DeviceSpec, t: float, tp: int, prec: str) -> float:
        m, h = self.model, self.model.hidden_size
        if m.multi_latent_attention:
            n = m.num_attention_heads
            d_qk, d_r, d_v = m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim
            tt = 0.0
            if m.q_lora_rank:
                tt += gemm_time(dev, t, m.q_lora_rank, h, prec)
                tt += gemm_time(dev, t, n * (d_qk + d_r) / tp, m.q_lora_rank, prec)
            else:
                tt += gemm_time(dev, t, n * (d_qk + d_r) / tp, h, prec)
            tt += gemm_time(dev, t, m.kv_lora_rank + d_r, h, prec)
            tt += gemm_time(dev, t, n * (d_qk + d_v) / tp, m.kv_lora_rank, prec)
            tt += gemm_time(dev, t, h, n * d_v / tp, prec)
            return tt
        qkv = m.q_dim + 2 * m.groups * m.head_dim
        return gemm_time(dev, t, qkv / tp, h, prec) + gemm_time(dev, t, h, m.q_dim / tp, prec)

    def _mla_up_gemms(self, dev: DeviceSpec, t: float, tp: int, prec: str) -> float:
        """MLA's up-projections from the latents (what ``mla_up_proj`` recompute re-runs)."""
        m = self.model
        n, d_qk, d_r, d_v = m.num_attention_heads, m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim
        up = gemm_time(dev, t, n * (d_qk + d_v) / tp, m.kv_lora_rank, prec)
        if m.q_lora_rank:
            up += gemm_time(dev, t, n * (d_qk + d_r) / tp, m.q_lora_rank, prec)
        return up

    def _mlp_gemms(self, dev: DeviceSpec, t: float, f_local: float, prec: str) -> float:
        m, h = self.model, self.model.hidden_size
        fc1 = gemm_time(dev, t, (m.glu - 1) * f_local, h, prec)
        fc2 = gemm_time(dev, t, h, f_local, prec)
        act = memory_time(dev, 3 * t * f_local * BF16)
        return fc1 + fc2 + act

    def _head(self, dev: DeviceSpec, t: float, tp: int, prec: str) -> tuple[float, float]:
        """Output projection to the vocabulary and the vocabulary-parallel cross-entropy on FP32 logits
        (:data:`CE_BYTES` per logit of the rank's shard)."""
        m = self.model
        v_local = m.padded_vocab(tp) / tp
        g = gemm_time(dev, t, v_local, m.hidden_size, "bf16")
        n = t * v_local
        fwd, bwd = CE_FUSED_BYTES if self.settings.cross_entropy_fusion else CE_BYTES
        return g + memory_time(dev, fwd * n), 2 * g + memory_time(dev, bwd * n)

    def _ep_comm(self, dev: DeviceSpec, did: str, cfg: ParallelConfig, ts: float) -> float:
        """Forward dispatch + combine for one layer (backward repeats it)."""
        m, st, h = self.model, self.settings, self.model.hidden_size
        k = m.moe_router_topk
        n_ep = cfg.ep * cfg.etp
        gshard = st.gshard_capacity_factor
        if st.dispatcher == "allgather" and not gshard:
            if n_ep <= 1:
                return 0.0
            size = n_ep * ts * h * BF16
            span = n_ep
            return self.collective(dev, did, "all_gather", size, n_ep, span) + self.collective(
                dev, did, "reduce_scatter", size, n_ep, span
            )
        out = 0.0
        if cfg.ep > 1:
            # Each rank dispatches its own ts tokens over the EP group and only afterwards all-gathers them
            # over the expert-TP group (token_dispatcher.py), so the payload does not grow with ETP. EP ranks
            # are ETP apart, so node // ETP of them share a node.
            node = self.node(did)
            local = max(1, min(cfg.ep, node // cfg.etp))
            nodes = cfg.ep / local
            E = m.num_experts or 1
            if st.dispatcher == "flex" and not gshard:
                # DeepEP/HybridEP send a token once per distinct destination node over the network and once
                # per distinct destination rank over NVLink (forwarded inside the receiving node)
                # (group-limited routing bounds the distinct destinations: cost/routing.py)
                g, gk = m.moe_router_num_groups, m.moe_router_group_topk
                inter = (nodes - 1) / nodes * distinct_destinations(E, k, round(nodes), g, gk) if nodes > 1 else 0.0
                intra = distinct_destinations(E, k, cfg.ep, g, gk)
            else:
                # the alltoall dispatcher sends one copy per routed (token, expert) pair
                inter = k * (1.0 - local / cfg.ep)
                intra = k * local / cfg.ep
            # (the GShard layer all-to-alls its whole [E, C, h] capacity buffer: k x capacity factor rows per token)
            tok = ts * h * BF16 * st.expert_rows_factor
            frac = dev.intra.group_bandwidth_fraction(min(cfg.ep * cfg.etp, node), node)
            out += 2 * dispatch_time(dev, "alltoall" if gshard else st.dispatcher, intra * tok, inter * tok, frac)
        if cfg.etp > 1:
            size = cfg.etp * k * ts * h * BF16
            if gshard:
                # each expert of the GShard layer is a MixtralParallelMLPBM (ModelLink modellink/model/moe.py
                # @0c8163f9de): w1 and w3 are separate ColumnParallelLinears, each all-gathering the expert's
                # capacity rows under sequence parallelism, and w2 a RowParallelLinear reduce-scattering them
                size *= gshard
                out += 2 * self.collective(dev, did, "all_gather", size, cfg.etp, cfg.etp)
            else:
                out += self.collective(dev, did, "all_gather", size, cfg.etp, cfg.etp)
            out += self.collective(dev, did, "reduce_scatter", size, cfg.etp, cfg.etp)
        return out

    def state_and_sync(
        self, dev: DeviceSpec, did: str, cfg: ParallelConfig, dense_local: float, exp_local: float
    ) -> tuple[float, float, float, float]:
        """Model-state bytes (:func:`hapmoe_milp.cost.memory.layer_state`), and the once-per-iteration
        gradient RS / parameter AG / optimizer-step times for those parameters (Megatron-FSDP moves the
        sharded collectives into every micro-batch: :mod:`hapmoe_milp.cost.fsdp`)."""
        st = self.settings
        dp_dense = cfg.dp * cfg.cp
        edp = cfg.edp or 1
        g = cfg.devices
        weights = layer_state(st, cfg, dense_local, exp_local).total
        sharded = st.distributed_optimizer or st.fsdp != "none"
        grad_b = BF16 if st.grad_reduce_in_bf16 else FP32
        param_b = 1.0 if st.fp8_param_gather else BF16
        rs = ag = 0.0
        for params, n in ((dense_local, dp_dense), (exp_local, edp)):
            if params <= 0 or n <= 1:
                continue
            bucket = max(BUCKET_PARAMS, 1_000_000 * n)
            if sharded:
                rs += self.collective(dev, did, "reduce_scatter", grad_b * params, n, g, table_size=grad_b * bucket)
                ag += self.collective(dev, did, "all_gather", param_b * params, n, g, table_size=param_b * bucket)
            else:
                rs += self.collective(dev, did, "all_reduce", grad_b * params, n, g, table_size=grad_b * bucket)
        rs, ag = fsdp_sync(st, rs, ag)
        shard = (dense_local / dp_dense + exp_local / edp) if sharded else dense_local + exp_local
        if st.optimizer_offload:
            # grads out (fp32), updated params back (bf16), Adam on the host; not overlapped
            opt = (FP32 + BF16) * shard / (st.offload_host_GBps * 1e9) + shard / st.offload_adam_params_per_s
        else:
            opt = memory_time(dev, ADAM_BYTES_PER_PARAM * shard)
        return weights, rs, ag, opt

    # ------------------------------------------------------------------ stage edges
    def first_edge(self, did: str, cfg: ParallelConfig, b: int) -> LayerCost:
        """Input embedding on the first stage."""
        return self._cached("E", self._first_edge, did, cfg, b)

    def _first_edge(self, did: str, cfg: ParallelConfig, b: int) -> LayerCost:
        m, dev = self.model, self.device(did)
        t = b * self.settings.seq_length / cfg.cp
        ts = t / cfg.tp
        lookup = memory_time(dev, 2 * ts * m.hidden_size * BF16)
        tp_c = (
            self.collective(dev, did, "reduce_scatter", t * m.hidden_size * BF16, cfg.tp, cfg.tp) if cfg.tp > 1 else 0.0
        )
        dense_local = m.first_stage_embedding_params(cfg.tp, self.settings.seq_length)
        return self._edge_cost(
            dev,
            did,
            cfg,
            dense_local,
            fwd=lookup + tp_c,
            bwd=2 * lookup + tp_c,
            compute=3 * lookup,
            tp_c=tp_c,
            act=embedding_bytes(m, self.settings, cfg, b),
        )

    def last_edge(self, did: str, cfg: ParallelConfig, b: int) -> LayerCost:
        """Final norm, output projection and loss on the last stage of a deeper pipeline (tied embeddings:
        plus its own copy of the matrix, Megatron's ``word_embeddings_for_head``)."""
        return self._cached("H", self._last_edge, did, cfg, b, False)

    def single_edge(self, did: str, cfg: ParallelConfig, b: int) -> LayerCost:
        """Both edges of a one-stage pipeline (PP = 1) as one term, which every solver and ``estimate`` take:
        tied embeddings are one matrix there (Megatron's head reads the input embedding's weight, and
        ``theoretical_memory_usage`` adds an output matrix at PP = 1 only when untied)."""
        return self._cached("S", self._single_edge, did, cfg, b)

    def _single_edge(self, did: str, cfg: ParallelConfig, b: int) -> LayerCost:
        first = self.first_edge(did, cfg, b)
        head = self._cached("Hs", self._last_edge, did, cfg, b, True)
        sums = [f.name for f in fields(LayerCost) if f.name not in ("parts", "state")]
        num = {k: getattr(first, k) + getattr(head, k) for k in sums}
        parts = {k: first.parts.get(k, 0.0) + head.parts.get(k, 0.0) for k in {*first.parts, *head.parts}}
        return LayerCost(**num, parts=parts, state=first.state + head.state)

    def _last_edge(self, did: str, cfg: ParallelConfig, b: int, beside_embedding: bool) -> LayerCost:
        m, dev = self.model, self.device(did)
        t = b * self.settings.seq_length / cfg.cp
        head_f, head_b = self._head(dev, t, cfg.tp, self.settings.precision)
        head_f, head_b = head_f / dev.runtime.stack_compute_scale, head_b / dev.runtime.stack_compute_scale
        tp_c = self.collective(dev, did, "all_gather", t * m.hidden_size * BF16, cfg.tp, cfg.tp) if cfg.tp > 1 else 0.0
        # the output matrix, unless it is the input embedding's own (tied, on the embedding's stage)
        holds_matrix = m.untie_embeddings_and_output_weights or not beside_embedding
        dense_local = holds_matrix * m.padded_vocab(cfg.tp) * m.hidden_size / cfg.tp + m.hidden_size * m.norm_params
        head_act, logits = head_bytes(m, self.settings, cfg, b)
        return self._edge_cost(
            dev,
            did,
            cfg,
            dense_local,
            fwd=head_f + tp_c,
            bwd=head_b + tp_c,
            compute=head_f + head_b,
            tp_c=tp_c,
            act=head_act,
            work=logits,  # logits of the vocabulary shard and their gradient, transient (cost/memory.py)
        )

    def _edge_cost(
        self,
        dev: DeviceSpec,
        did: str,
        cfg: ParallelConfig,
        dense_local: float,
        *,
        fwd: float,
        bwd: float,
        compute: float,
        tp_c: float,
        act: float,
        work: float = 0.0,
    ) -> LayerCost:
        """An edge stage's extra work as a layer: dense parameters only (no experts, no CP exchange), its TP
        collective once each way, and the parameters' state and DP sync priced like any layer's."""
        weights, rs, ag, opt = self.state_and_sync(dev, did, cfg, dense_local, 0.0)
        return LayerCost(
            fwd=fwd,
            bwd=bwd,
            compute=compute,
            tp=2 * tp_c,
            cp=0.0,
            ep=0.0,
            act=act,
            weights=weights,
            params_dense=dense_local,
            params_expert=0.0,
            rs=rs,
            ag=ag,
            opt=opt,
            work=work,
            state=layer_state(self.settings, cfg, dense_local, 0.0),
        )

    def fixed_memory(self, did: str, cfg: ParallelConfig, b: int) -> float:
        """Allocated bytes of a rank independent of its layer count: the largest layer kind's working set
        (so the bound does not depend on which kinds a stage holds) and Megatron-FSDP's unsharded
        buffers (:func:`hapmoe_milp.cost.memory.fsdp_buffer_bytes`). Device-level terms outside the
        allocator (context, DeepEP buffers, fragmentation) are in :meth:`capacity`."""
        return self._cached("F", self._fixed_memory, did, cfg, b)

    def _fixed_memory(self, did: str, cfg: ParallelConfig, b: int) -> float:
        lays = [self.layer(did, cfg, b, k, "none") for k in set(self.model.layer_kinds)]
        biggest = max(c.params_dense + c.params_expert for c in lays)
        return max(c.work for c in lays) + fsdp_buffer_bytes(self.settings, biggest)

    def exposed_sync(self, did: str, rs: Any, ag: Any, fwd: Any, bwd: Any, opt: Any) -> Any:
        """Data-parallel sync and optimizer step a stage adds after its last micro-batch (floats, or numpy
        arrays of many stages of one device type at once, as the solvers price candidate stages in bulk).

        With overlap on, the gradient reduce-scatter runs beside the last micro-batch's backward and the
        parameter all-gather beside the next forward; ``dp_overlap`` is the share of that compute they
        can really hide behind (bucket granularity, NCCL sharing the SMs).
        """
        st, k = self.settings, self.device(did).runtime.dp_overlap
        rs_x = _clip0(rs - k * bwd) if st.overlap_grad_reduce else rs
        ag_x = _clip0(ag - k * fwd) if st.overlap_param_gather else ag
        return rs_x + ag_x + opt

    def memory_model(self, did: str) -> MemoryModel:
        return MemoryModel(self.device(did), self.settings)

    def capacity(self, did: str, cfg: ParallelConfig | None = None) -> float:
        """Allocated bytes a rank of ``did`` with mesh ``cfg`` may reach (:meth:`MemoryModel.budget`): the
        device's usable memory less what lives outside the caching allocator, over its fragmentation."""
        return self.memory_model(did).budget(cfg)

    # ------------------------------------------------------------------ boundaries
    def boundary_link(self, prev: str, prev_devices: int, cur: str, cur_devices: int) -> str:
        """Link class of the pipeline boundary between two stages (same rule in search and estimate)."""
        if prev != cur:
            return "cross"
        node = self.node(cur)
        return "intra" if prev_devices < node and cur_devices < node else "inter"

    def boundary_p2p(
        self, src: str, src_cfg: ParallelConfig, src_b: int, dst: str, dst_devices: int, vpp: int = 1
    ) -> float:
        """Transfers across a pipeline boundary per micro-batch: one (:meth:`p2p`) under plain 1F1B, one per
        virtual chunk under the interleaved schedule (each micro-batch crosses every rank boundary ``vpp``
        times). The interleaved schedule's wrap-around hop from the last rank back to the first is not
        priced (a ``(vpp-1)/vpp`` share of one boundary on the last stage)."""
        return vpp * self.p2p(src, src_cfg, src_b, dst, dst_devices)

    def p2p(self, src: str, src_cfg: ParallelConfig, src_b: int, dst: str, dst_devices: int) -> float:
        """One activation (or gradient) transfer across a boundary, per micro-batch, per rank.

        Sized on the sending stage's per-rank shard (sequence-parallel activations ``b*S/(CP*TP) x h``).
        """
        return self._cached("P", self._p2p, src, src_cfg, src_b, dst, dst_devices)

    def _p2p(self, src: str, src_cfg: ParallelConfig, src_b: int, dst: str, dst_devices: int) -> float:
        m = self.model
        nbytes = src_b * self.settings.seq_length / src_cfg.cp / src_cfg.tp * m.hidden_size * BF16
        link = self.boundary_link(src, src_cfg.devices, dst, dst_devices)
        if link == "cross":
            a, c = self.device(src), self.device(dst)
            bw = self.cluster.cross.bandwidth(a, c)
            val = self.cluster.cross.latency_us * 1e-6 + nbytes / (bw * 1e9)
        else:
            val = collective_time(self.device(src), "p2p", link, nbytes, 2)
        # the share of the transfer the schedule does not hide (batched send/recv beside compute)
        return val * self.device(src).runtime.p2p_exposed
