"""The MoE-aware cost model: one place that prices every layer, edge, boundary and sync.

Everything the search optimises is linear in the per-stage layer counts of each layer kind, with
coefficients produced here; :mod:`hapmoe_milp.cost.estimate` sums the same coefficients to evaluate a
plan. That is what lets the DP, CP-SAT and MILP optimise exactly the quantity `estimate` reports.

Conventions (per rank, per micro-batch of ``b`` samples on that stage's replica):
``t = b*S/CP`` tokens of sequence; with sequence parallelism (always on when TP > 1, as Megatron requires
for MoE) element-wise work and stored activations are further split by TP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from hapmoe_milp.config import ParallelConfig, Recompute, Settings
from hapmoe_milp.cost.attention import core_time
from hapmoe_milp.cost.kernels import layer_kernels
from hapmoe_milp.cost.layer import ELEMENTWISE_PASSES_H, layer_comm, layer_compute  # noqa: F401 (re-exported)
from hapmoe_milp.cost.mixers import mixer_cost, recomputed_activations
from hapmoe_milp.cost.primitives import (
    BF16,
    FP32,
    GIB,
    collective_time,
    dispatch_time,
    gemm_time,
    host_overhead,
    memory_time,
)
from hapmoe_milp.cost.routing import distinct_destinations
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.model import LayerKind, ModelSpec

# Megatron's default DDP bucket: max(40M, 1M * dp) parameters (distributed_data_parallel_config.py).
BUCKET_PARAMS = 40_000_000
# Adam step on the fp32 shard: read master, grad, m, v (16 B), write master, m, v (12 B), bf16 param (2 B).
ADAM_BYTES_PER_PARAM = 30
# Framework/allocator overhead per rank, as Sailor's simulator uses (reference/papers.md §6.4).
OVERHEAD_TP1 = 2.0 * GIB
OVERHEAD_TP = 3.0 * GIB


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

    # ------------------------------------------------------------------ helpers
    def _cached(self, tag: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, computed once per cost model: the same option is priced again and again (every
        instance, every solver, the final estimate), and its price depends only on ``args``."""
        key = (tag, *args)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = fn(*args)
        return hit

    def device(self, did: str) -> DeviceSpec:
        return self.cluster.device(did)

    def node(self, did: str) -> int:
        return self.cluster.node_size(did)

    def collective(self, dev: DeviceSpec, did: str, prim: str, size: float, n: int, span: int, **kw: float) -> float:
        node = self.node(did)
        link = link_for_span(span, node)
        frac = dev.intra.group_bandwidth_fraction(n, node) if link == "intra" else 1.0
        return collective_time(dev, prim, link, size, n, bw_fraction=frac, **kw)

    # ------------------------------------------------------------------ one layer
    def layer(self, did: str, cfg: ParallelConfig, b: int, kind: LayerKind, recompute: Recompute) -> LayerCost:
        return self._cached("L", self._layer, did, cfg, b, kind, recompute)

    def _layer(self, did: str, cfg: ParallelConfig, b: int, kind: LayerKind, recompute: Recompute) -> LayerCost:
        """One layer on one micro-batch of ``b`` samples: kernel time and communication
        (:mod:`hapmoe_milp.cost.layer`), then EP overlap, recompute, host overheads and memory, composed here."""
        m, st, dev = self.model, self.settings, self.device(did)
        prec = st.precision
        tp = cfg.tp
        t = b * st.seq_length / cfg.cp
        ts = t / tp  # sequence-parallel shard
        mixer, mlp_kind = m.kind_parts(kind)
        is_moe = mlp_kind == "moe"
        c = layer_compute(self, dev, did, cfg, t, ts, kind, mixer, mlp_kind)
        f_comp, b_comp, elem, routed_rows = c.f_comp, c.b_comp, c.elem, c.routed_rows
        tp_f, cp_f, cp_b, ep_f = layer_comm(self, dev, did, cfg, t, ts, mixer, is_moe, c)
        # EP overlap (--overlap-moe-expert-parallel-comm) runs one micro-batch's dispatch/combine beside another's
        # computation, so it hides at most that computation: a share ep_overlap of min(comm, compute). Backward
        # repeats the forward traffic.
        ep_exposed = 1.0
        if st.overlap_ep_comm and ep_f > 0:
            share = dev.runtime.flex_overlap if st.dispatcher == "flex" else dev.runtime.ep_overlap
            hidden = share * min(2 * ep_f, f_comp + b_comp)
            ep_exposed = 1.0 - hidden / (2 * ep_f)
        ep_total = 2 * ep_f * ep_exposed
        # TP overlap (userbuffers / MC2) splits each TP collective into chunks pipelined with the GEMM it feeds
        # or drains, so it hides behind that pass's computation: a share tp_overlap of min(comm, compute) each way.
        tp_b = tp_f
        if st.tp_comm_overlap and tp_f > 0:
            tp_b = tp_f - dev.runtime.tp_overlap * min(tp_f, b_comp)
            tp_f = tp_f - dev.runtime.tp_overlap * min(tp_f, f_comp)

        # ---- recompute: extra forward work during backward
        rec = rec_tp = rec_cp = rec_ep = 0.0
        if recompute == "full":
            # the re-run forward repeats its communication too; book it under tp/cp/ep, not compute
            rec_tp, rec_cp, rec_ep = tp_f, cp_f, ep_f * ep_exposed
            rec = f_comp + tp_f + cp_f + ep_f * ep_exposed
        elif recompute == "selective":
            rec = elem + (memory_time(dev, 3 * routed_rows * m.expert_ffn / cfg.etp * BF16) if is_moe else 0.0)

        gpu_f = f_comp + tp_f + cp_f + (ep_total / 2)
        gpu_b = b_comp + tp_b + cp_b + (ep_total / 2) + rec
        # ---- host: kernels issued per micro-batch, and the dropless router's token-count sync
        kern = layer_kernels(m, cfg, kind, st.dispatcher, prec, recompute, st.fp8_recipe, st.cuda_graph_scope)
        host_f = host_overhead(kern.fwd, dev, kern.syncs_fwd)
        host_b = host_overhead(kern.bwd, dev, kern.syncs_bwd)
        fwd, bwd, host = gpu_f + host_f, gpu_b + host_b, host_f + host_b

        # ---- memory: weights + optimizer state, stored activations
        p = m.layer_params(kind)
        dense_local = p["tp"] / tp + p["replicated"]
        exp_local = p["expert"] / (cfg.ep * cfg.etp) if p["expert"] else 0.0
        act, work = self._activations(cfg, t, kind, is_moe, recompute, routed_rows)
        if mixer != "attention" or mlp_kind is None:
            act, work = self._hybrid_activations(dev, cfg, t, kind, recompute, routed_rows)
        weights, rs, ag, opt = self.state_and_sync(dev, did, cfg, dense_local, exp_local)
        return LayerCost(
            fwd=fwd,
            bwd=bwd,
            compute=f_comp + b_comp + rec - rec_tp - rec_cp - rec_ep,
            tp=tp_f + tp_b + rec_tp,
            cp=cp_f + cp_b + rec_cp,
            ep=ep_total + rec_ep,
            act=act,
            weights=weights,
            params_dense=dense_local,
            params_expert=exp_local,
            rs=rs,
            ag=ag,
            opt=opt,
            work=work,
            host=host,
            parts={"recompute": rec, "kernels_fwd": kern.fwd, "kernels_bwd": kern.bwd},
        )

    def expert_gemms(self, did: str, rows_per_expert: float, local: int, etp: int) -> float:
        """Forward of ``local`` routed experts with ``rows_per_expert`` rows each at width F/ETP: the two
        grouped GEMMs and the activation function (backward is twice this; imbalance not included)."""
        m, dev = self.model, self.device(did)
        fe, h, prec = m.expert_ffn, m.hidden_size, self.settings.precision
        t = gemm_time(dev, rows_per_expert, (m.glu - 1) * fe / etp, h, prec, groups=local)
        t += gemm_time(dev, rows_per_expert, h, fe / etp, prec, groups=local)
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
        routed = st.imbalance * self.expert_gemms(did, k * ts / E, E, 1)
        full = recompute == "full"
        glu_out = 2 if m.swiglu else 1
        routed_act = k * ts * st.imbalance * (2 * m.hidden_size + 2 * glu_out * m.expert_ffn + 2 * m.expert_ffn)
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
        m = self.model
        glu_out = 2 if m.swiglu else 1
        h, fe = m.hidden_size, m.expert_ffn / etp
        return 2 * h if recompute == "full" else 2 * h + 2 * glu_out * fe + 2 * fe

    def cross_dispatch(self, src: str, dst: str, total_bytes: float, src_devices: int, dst_devices: int) -> float:
        """One dispatch (or combine) of ``total_bytes`` between two device types over the cross link:
        bipartite, so the side with fewer devices sets the time; plus the link latency."""
        bw = self.cluster.cross.bandwidth(self.device(src), self.device(dst)) * 1e9
        return max(total_bytes / src_devices, total_bytes / dst_devices) / bw + self.cluster.cross.latency_us * 1e-6

    def _mixer_time(
        self, dev: DeviceSpec, mixer: str | None, t: float, tp: int, prec: str
    ) -> tuple[float, float, float, float]:
        """Forward and backward compute of a layer's token mixer, and of the attention core alone (what
        context parallelism's ring exchange can hide behind); zeros for a layer without a mixer."""
        m, S = self.model, self.settings.seq_length
        if mixer == "attention":
            attn_lin = self._attention_gemms(dev, t, tp, prec)
            # causal: each query sees S/2 keys on average (fewer under a sliding window or in chunks)
            core_f, core_b = core_time(m, dev, t * self._core_macs() * 2 / tp, S)
            return attn_lin + core_f, 2 * attn_lin + core_b, core_f, core_b
        if mixer in ("gdn", "mamba"):
            mc = mixer_cost(m, dev, mixer, t, tp, S, prec)
            return mc.fwd, mc.bwd, 0.0, 0.0
        return 0.0, 0.0, 0.0, 0.0

    def _attention_act(self, ts: float) -> float:
        """Stored bytes of an attention sub-layer for ``ts`` tokens of the sequence-parallel shard (see
        :meth:`_activations`)."""
        m, h = self.model, self.model.hidden_size
        if m.multi_latent_attention:
            n = m.num_attention_heads
            qkv = 2 * n * (m.qk_head_dim + m.qk_pos_emb_head_dim) + n * m.v_head_dim
            latent = (m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_pos_emb_head_dim
            return ts * (5 * h + 2 * qkv + 2 * n * m.v_head_dim + 2 * latent)
        qkv = m.q_dim + 2 * m.groups * m.head_dim
        return ts * (5 * h + 2 * qkv + 2 * m.q_dim)

    def _hybrid_activations(
        self, dev: DeviceSpec, cfg: ParallelConfig, t: float, kind: LayerKind, recompute: Recompute, routed: float
    ) -> tuple[float, float]:
        """Stored bytes and working set of a layer that is not attention + MLP: a gated-DeltaNet mixer with
        its MLP, or one of a hybrid model's one-sub-layer layers. The MLP part is :meth:`_activations`'
        (an attention+MLP layer's bytes less its attention part), the mixer part :func:`mixer_cost`'s."""
        m = self.model
        mixer, mlp_kind = m.kind_parts(kind)
        ts = t / cfg.tp
        is_moe = mlp_kind == "moe"
        mlp_act = mlp_work = 0.0
        attn_only = self._attention_act(ts)
        if mlp_kind:
            ref = "moe" if is_moe else "dense"
            full_act, full_work = self._activations(cfg, t, ref, is_moe, "none", routed)
            mlp_act, mlp_work = full_act - attn_only, full_work - attn_only
        if mixer == "attention":
            mix_act = attn_only
        elif mixer in ("gdn", "mamba"):
            mix_act = mixer_cost(m, dev, mixer, t, cfg.tp, self.settings.seq_length, "bf16").act
        else:
            mix_act = 0.0
        saved_moe = routed * self.settings.imbalance * 2 * m.expert_ffn / cfg.etp if is_moe else 0.0
        return recomputed_activations(
            mix_act,
            mlp_act,
            mlp_work,
            (mixer is not None) + (mlp_kind is not None),
            ts * 2 * m.hidden_size,
            saved_moe,
            recompute,
        )

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

    def _mlp_gemms(self, dev: DeviceSpec, t: float, f_local: float, prec: str) -> float:
        m, h = self.model, self.model.hidden_size
        fc1 = gemm_time(dev, t, (m.glu - 1) * f_local, h, prec)
        fc2 = gemm_time(dev, t, h, f_local, prec)
        act = memory_time(dev, 3 * t * f_local * BF16)
        return fc1 + fc2 + act

    def _head(self, dev: DeviceSpec, t: float, tp: int, prec: str) -> tuple[float, float]:
        """Output projection to the vocabulary and cross-entropy (fp32 logits)."""
        m = self.model
        v_local = m.padded_vocab(tp) / tp
        g = gemm_time(dev, t, v_local, m.hidden_size, "bf16")
        ce = memory_time(dev, 3 * t * v_local * FP32)
        return g + ce, 2 * g + ce

    def _ep_comm(self, dev: DeviceSpec, did: str, cfg: ParallelConfig, ts: float) -> float:
        """Forward dispatch + combine for one layer (backward repeats it)."""
        m, st, h = self.model, self.settings, self.model.hidden_size
        k = m.moe_router_topk
        n_ep = cfg.ep * cfg.etp
        if st.dispatcher == "allgather":
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
            if st.dispatcher == "flex":
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
            tok = ts * h * BF16 * st.imbalance
            frac = dev.intra.group_bandwidth_fraction(min(cfg.ep * cfg.etp, node), node)
            out += 2 * dispatch_time(dev, st.dispatcher, intra * tok, inter * tok, frac)
        if cfg.etp > 1:
            size = cfg.etp * k * ts * h * BF16
            out += self.collective(dev, did, "all_gather", size, cfg.etp, cfg.etp)
            out += self.collective(dev, did, "reduce_scatter", size, cfg.etp, cfg.etp)
        return out

    def _activations(
        self, cfg: ParallelConfig, t: float, kind: LayerKind, is_moe: bool, recompute: Recompute, routed_rows: float
    ) -> tuple[float, float]:
        """Stored bytes per micro-batch, and the transient working set of the layer.

        Component accounting per token of the rank's sequence-parallel shard ``ts = b*S/(CP*TP)``, after
        Korthikanti et al. (arXiv 2205.05198, Table 2) with flash attention (no ``s^2`` softmax/dropout
        terms), bf16 (2 bytes) tensors and 1-byte dropout masks:

        - attention: ``5h`` (norm input 2h, QKV-GEMM input 2h, dropout mask h) + ``2(q + 2kv)`` (Q, K, V)
          + ``2q`` (output-projection input);
        - dense MLP: ``5h`` (norm input 2h, fc1 input 2h, dropout mask h) + ``2*glu_out*F`` (fc1 output,
          the activation's input) + ``2F`` (fc2 input).

        For a dense MHA (``q = kv = h``) non-gated (``glu_out = 1``) layer this is ``ts*(18h + 4F)``, i.e.
        exactly Megatron's SP formula ``s*b*h*(18 + 4F/h)/TP`` per layer (reference/megatron.md §3.2, which
        Megatron applies with selective recompute of the attention core -- what flash attention does
        anyway, so it corresponds to our ``none``). Where we differ from Megatron's formula, and why:

        - GQA/MLA: Q, K and V are stored at their real widths (``heads*head_dim`` for Q, ``groups*head_dim``
          for K and V; MLA latents, rope keys and per-head up-projections); Megatron's formula assumes MHA
          with ``q = kv = h``, so it overstates GQA's K/V and misses wide Q (Qwen3: 32x128 > h = 2048) and MLA.
        - gated MLPs (SwiGLU): fc1's output is ``2F`` wide; Megatron's formula ignores ``--swiglu``.
        - MoE layers: the routed tokens (``k*ts*ETP`` rows per rank after dispatch and the ETP all-gather,
          times the load-imbalance factor) at the expert width, the fp32 router probabilities and shared
          experts. Megatron's formula uses the dense ``ffn_hidden_size`` for every layer and ignores top-k,
          ``moe_ffn_hidden_size`` and the dispatcher, so it badly understates fine-grained MoE.
        - dispatch/combine buffers are a transient working set (``work``), not stored per micro-batch.
        - CP divides the tokens (Megatron's formula ignores CP).
        - recompute: ``selective`` is Megatron's ``--recompute-modules layernorm`` (+ ``moe_act`` on MoE
          layers, as the exporter emits): it drops the two norm outputs (``4h``) and the routed experts'
          activation output; ``full`` keeps only the layer input (``2h``). Megatron's formula has no full
          recompute.
        - embedding and output-layer terms live on the edge costs (``first_edge``/``last_edge``), and the
          in-flight multiplier in :func:`hapmoe_milp.cost.pipeline.in_flight` (``min(M, P - s)``; for
          interleaved 1F1B it equals Megatron's ``1 + (P-1)/(P*v)`` factor on the first stage).
        """
        m, h = self.model, self.model.hidden_size
        tp = cfg.tp
        ts = t / tp
        glu_out = 2 if m.swiglu else 1
        attn = self._attention_act(ts)
        if is_moe:
            fe = m.expert_ffn / cfg.etp
            mlp = ts * 5 * h + routed_rows * self.settings.imbalance * (2 * h + 2 * glu_out * fe + 2 * fe)
            mlp += ts * 4 * (m.num_experts or 0)  # fp32 router probabilities
            if m.moe_shared_expert_intermediate_size:
                fs = m.moe_shared_expert_intermediate_size
                mlp += ts * (2 * glu_out * fs + 2 * fs)
            sel_saved = ts * 2 * h + routed_rows * self.settings.imbalance * 2 * fe
            dispatch_buf = 2 * routed_rows * self.settings.imbalance * h * BF16
        else:
            f = m.ffn
            mlp = ts * (5 * h + 2 * glu_out * f + 2 * f)
            sel_saved = ts * 2 * h  # `layernorm` only: dense MLPs have no activation-only recompute module
            dispatch_buf = 0.0
        if kind == "mtp":
            mlp += ts * 2 * 2 * h
        full = attn + mlp
        if recompute == "none":
            stored = full
        elif recompute == "selective":
            stored = full - sel_saved - ts * 2 * h
        else:
            stored = ts * 2 * h
        work = full + dispatch_buf
        return stored, work

    def state_and_sync(
        self, dev: DeviceSpec, did: str, cfg: ParallelConfig, dense_local: float, exp_local: float
    ) -> tuple[float, float, float, float]:
        """Weights/grads/optimizer bytes, and gradient RS / param AG / Adam times for those params."""
        st = self.settings
        dp_dense = cfg.dp * cfg.cp
        edp = cfg.edp or 1
        g = cfg.devices
        if st.optimizer_offload:
            # fp32 master weights and Adam moments live in host memory; bf16 params + fp32 grads stay
            weights = 6 * (dense_local + exp_local)
        elif st.distributed_optimizer:
            weights = (6 + 12 / dp_dense) * dense_local + (6 + 12 / edp) * exp_local
        else:
            weights = 18 * (dense_local + exp_local)
        rs = ag = 0.0
        # gradients travel in FP32 unless the run reduces them in BF16 (--grad-reduce-in-bf16, the NeMo and
        # Megatron-Bridge performance recipes); parameters are gathered in BF16, or FP8 with --fp8-param-gather
        gb = FP32 if st.grad_reduce_in_fp32 else BF16
        pb = 1.0 if st.precision == "fp8" and st.fp8_param_gather else BF16
        for params, n in ((dense_local, dp_dense), (exp_local, edp)):
            if params <= 0 or n <= 1:
                continue
            bucket = max(BUCKET_PARAMS, 1_000_000 * n)
            if st.distributed_optimizer:
                rs += self.collective(dev, did, "reduce_scatter", gb * params, n, g, table_size=gb * bucket)
                ag += self.collective(dev, did, "all_gather", pb * params, n, g, table_size=pb * bucket)
            else:
                rs += self.collective(dev, did, "all_reduce", gb * params, n, g, table_size=gb * bucket)
        shard = (dense_local / dp_dense + exp_local / edp) if st.distributed_optimizer else dense_local + exp_local
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
        dense_local = m.padded_vocab(cfg.tp) * m.hidden_size / cfg.tp
        return self._edge_cost(
            dev,
            did,
            cfg,
            dense_local,
            fwd=lookup + tp_c,
            bwd=2 * lookup + tp_c,
            compute=3 * lookup,
            tp_c=tp_c,
            act=ts * m.hidden_size * BF16,
        )

    def last_edge(self, did: str, cfg: ParallelConfig, b: int) -> LayerCost:
        """Final norm, output projection and loss on the last stage (plus a tied embedding copy)."""
        return self._cached("H", self._last_edge, did, cfg, b)

    def _last_edge(self, did: str, cfg: ParallelConfig, b: int) -> LayerCost:
        m, dev = self.model, self.device(did)
        t = b * self.settings.seq_length / cfg.cp
        head_f, head_b = self._head(dev, t, cfg.tp, self.settings.precision)
        head_f, head_b = head_f / dev.runtime.stack_compute_scale, head_b / dev.runtime.stack_compute_scale
        tp_c = self.collective(dev, did, "all_gather", t * m.hidden_size * BF16, cfg.tp, cfg.tp) if cfg.tp > 1 else 0.0
        dense_local = m.padded_vocab(cfg.tp) * m.hidden_size / cfg.tp + m.hidden_size * m.norm_params
        v_local = m.padded_vocab(cfg.tp) / cfg.tp
        return self._edge_cost(
            dev,
            did,
            cfg,
            dense_local,
            fwd=head_f + tp_c,
            bwd=head_b + tp_c,
            compute=head_f + head_b,
            tp_c=tp_c,
            act=t / cfg.tp * m.hidden_size * BF16,
            work=2 * t * v_local * FP32,  # fp32 logits and their gradient, transient
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
        )

    def fixed_memory(self, did: str, cfg: ParallelConfig, b: int) -> float:
        """Per-rank bytes independent of layer count: one layer's working set (the largest kind, so the
        bound does not depend on which kinds a stage holds) plus framework overhead."""
        return self._cached("F", self._fixed_memory, did, cfg, b)

    def _fixed_memory(self, did: str, cfg: ParallelConfig, b: int) -> float:
        work = max(self.layer(did, cfg, b, k, "none").work for k in set(self.model.layer_kinds))
        return work + (OVERHEAD_TP if cfg.tp > 1 else OVERHEAD_TP1)

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

    def capacity(self, did: str) -> float:
        return self.device(did).memory_gib * GIB * (1.0 - self.settings.memory_headroom)

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
