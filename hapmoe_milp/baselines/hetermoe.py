"""HeterMoE's zebra parallelism (arXiv 2504.03871) as a baseline: attention on one device type, routed
experts on the other, with Asym-EA.

Zebra parallelism cuts *inside* a layer, so it lies outside our plan space. It is priced by a small
schedule model (:func:`_zebra_best_offload`) whose every per-layer time and byte count comes from the
cost model's public pieces -- :meth:`CostModel.layer_split` (attention side and dense layers),
:meth:`CostModel.expert_gemms` / :meth:`CostModel.expert_act_per_row` (routed experts wherever they run),
:meth:`CostModel.cross_dispatch` (the cross-type transfer), :meth:`CostModel.collective` (ETP gathers),
:meth:`CostModel.state_and_sync` / :meth:`CostModel.exposed_sync` (weights, DP sync, optimizer) -- and is
carried by a proxy :class:`Plan`. This module computes no cost of its own: it only composes those pieces
into HeterMoE's schedule.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from hapmoe_milp.config import ParallelConfig, Recompute, Settings
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.deadline import NO_DEADLINE, Deadline
from hapmoe_milp.plan import Plan, Stage, check_plan
from hapmoe_milp.search.solution import Solution
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

from .common import SOLVER_NAMES, divisors, infeasible, make_plan, pow2_upto, stopped
from .megatron_uniform import megatron_uniform


@dataclass(frozen=True)
class ZebraPlan:
    """One zebra-parallel layout (ZP + DP, as the HeterMoE prototype implements it)."""

    attention_device: str
    expert_device: str
    zp_groups: int  # data-parallel replicas of the ZP group
    attention_devices: int  # per group (HeterMoE's M)
    expert_devices: int  # per group (N)
    attention_tp: int
    ep: int
    etp: int
    edp: int
    micro_batches: int  # R zebra micro-batches per accumulation step
    accumulation_steps: int
    offloaded_experts: int  # Asym-EA: (layer, expert) units moved to the attention devices, of E*L
    recompute: Recompute
    iteration_time_s: float
    step_time_s: float
    sync_s: float
    attention_memory_gib: float
    expert_memory_gib: float
    attention_capacity_gib: float
    expert_capacity_gib: float
    layer_times: dict[str, float]

    @property
    def fits(self) -> bool:
        return (
            self.attention_memory_gib <= self.attention_capacity_gib
            and self.expert_memory_gib <= self.expert_capacity_gib
        )

    def label(self) -> str:
        return (
            f"{self.zp_groups}x ZP[{self.attention_devices} {self.attention_device} attention TP{self.attention_tp} | "
            f"{self.expert_devices} {self.expert_device} experts EP{self.ep} ETP{self.etp} EDP{self.edp}] "
            f"R={self.micro_batches} x{self.accumulation_steps} Asym-EA {self.offloaded_experts} expert-layers, "
            f"recompute={self.recompute}"
        )

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["fits"] = self.fits
        return d


def _largest_ep(experts: int, n: int) -> int:
    return max(d for d in divisors(n) if experts % d == 0)


@dataclass(frozen=True)
class _ZebraSides:
    """f-independent pieces of one ZP layout, per layer and zebra micro-batch (seconds / bytes)."""

    a_f: float  # attention side, forward (incl. router, permute, norms, TP comm, shared experts)
    a_b: float
    x_f: float  # all of the layer's expert work if it ran on the attention devices
    e_f: float  # all expert work on the expert devices (incl. ETP comm)
    e_b: float
    cross_bytes: float  # one dispatch (or combine) of all routed tokens of a ZP group, bytes
    act_a: float  # stored bytes per layer and micro-batch, attention device (without offloaded experts)
    act_x: float  # ... extra on an attention device if all experts ran there (scaled by f)
    act_e: float  # ... on an expert device (scaled by 1-f)
    work_e: float  # transient bytes on an expert device while a layer runs (scaled by 1-f)
    dense_a_f: float  # dense (non-MoE) layers run entirely on the attention devices
    dense_a_b: float
    dense_act: float


def hetermoe_style(
    model: ModelSpec, cluster: ClusterSpec, settings: Settings, *, deadline: Deadline = NO_DEADLINE
) -> Solution:
    """HeterMoE (arXiv 2504.03871): zebra parallelism with Asym-EA, priced with our cost model's pieces.

    What is modelled: a ZP group is ``M`` attention devices of the faster type (faster attention per
    device, by the cost model) and ``N`` expert devices of the other type; attention, router, norms,
    shared experts, embedding and head run data-parallel (optionally TP) on the attention devices; the
    routed experts are spread over the expert devices (EP x ETP x EDP); ZP groups are data-parallel
    replicas (ZP + DP, as the prototype). Per layer, ``R`` micro-batches circulate through four
    resources -- attention compute, dispatch link, expert compute, combine link -- so a layer takes
    ``max(R * bottleneck, one micro-batch's round trip)`` forward and again backward (a closed loop with
    ``R`` jobs; dispatch and combine use opposite directions of the cross-type link, so zebra overlap
    hides all but that). Asym-EA moves ``u`` (layer, expert) units to the attention devices, scaling the
    expert work and cross traffic by ``1 - u/(E*L)`` and adding that share to the attention devices,
    bounded by both sides' memory (HeterMoE's alpha/beta). Zebra's order runs all ``R`` forwards
    before the backwards, so activations of ``R`` micro-batches x all layers are held per step.

    What is approximated (also in ``Solution.message``):
    - the layer-internal attention/expert split is not a :class:`Plan`; the returned plan is a *proxy*
      (one stage on the attention devices with the attention mesh), valid for ``check_plan`` but with
      its prediction overridden by the zebra model. ``objective_s`` is the zebra model's time, not an
      :func:`estimate` of the proxy (``stats['maps_to_plan']`` is False);
    - attention-side times are :meth:`CostModel.layer_split` (the cost model's layer with all experts
      local minus the routed expert GEMMs, which :meth:`CostModel.expert_gemms` prices again wherever
      the experts run);
    - Asym-EA offload is spread evenly over layers (the paper's per-layer ``o_l`` averaged), and the
      offloaded experts' token exchange among attention devices is assumed hidden (intra-type links);
    - MTP layers are priced as MoE layers; only two device types are supported (else, and on
      homogeneous clusters, the Megatron-uniform plan is returned).
    """
    name = SOLVER_NAMES["hetermoe"]
    t0 = time.perf_counter()
    types = cluster.device_types
    if len(types) != 2 or not model.is_moe:
        sol = megatron_uniform(model, cluster, settings, deadline=deadline)
        why = "homogeneous cluster" if len(types) == 1 else ("dense model" if not model.is_moe else ">2 device types")
        return replace(
            sol, solver=name, message=f"{why}: zebra parallelism does not apply; Megatron-uniform plan. " + sol.message
        )
    cm = CostModel(model, cluster, settings)
    speed = {t: _attention_probe(cm, t) for t in types}
    att, exp = sorted(types, key=lambda t: speed[t])
    best: ZebraPlan | None = None
    evaluated = 0
    for zp in _zebra_layouts(cm, att, exp):
        if deadline.passed():  # stop with the best layout so far; the row says the time limit stopped it
            break
        evaluated += 1
        if zp.fits and (best is None or zp.iteration_time_s < best.iteration_time_s - 1e-12):
            best = zp
    if best is None:
        if deadline.passed():
            return stopped(name, t0, None, evaluated, model, cluster, settings)
        return infeasible(name, t0, f"no zebra layout fits ({evaluated} candidates)", candidates=evaluated)
    proxy = _zebra_proxy(model, cluster, settings, best)
    devices = best.zp_groups * (best.attention_devices + best.expert_devices)
    tokens = settings.global_batch_size * settings.seq_length
    peak = (
        cluster.device(att).dense_peak_tflops * best.zp_groups * best.attention_devices
        + cluster.device(exp).dense_peak_tflops * best.zp_groups * best.expert_devices
    )
    flops = model.flops_per_token(settings.seq_length) * tokens
    proxy_est = estimate(model, cluster, proxy, settings)
    t = best.iteration_time_s
    predicted = {
        "iteration_time_s": t,
        "tokens_per_s": tokens / t,
        "tokens_per_s_per_device": tokens / t / devices,
        "model_tflops_per_device": flops / t / devices / 1e12,
        "mfu": flops / (t * peak * 1e12),
        "fits": best.fits,
        "devices": devices,
        "zebra": best.to_dict(),
        "zebra_label": best.label(),
        "proxy": True,
        "proxy_estimate": {"iteration_time_s": proxy_est.iteration_time_s, "fits": proxy_est.fits},
    }
    msg = (
        f"zebra model (outside the plan space): {best.label()}; the plan is a proxy (attention mesh on "
        f"{att}) whose prediction is overridden; approximated: attention/expert split by differencing the "
        f"layer cost, Asym-EA averaged over layers, offloaded experts' intra-type traffic hidden"
    )
    sol = Solution(
        name,
        "feasible",
        proxy,
        t,
        math.nan,
        time.perf_counter() - t0,
        message=msg,
        stats={"fits": best.fits, "maps_to_plan": False, "candidates": evaluated, "mfu": predicted["mfu"]},
    )
    return replace(sol, plan=proxy.with_predicted(predicted, sol.certificate()))


def _attention_probe(cm: CostModel, did: str) -> float:
    """Seconds of one MoE layer's attention side for one sample on one device (fwd + bwd)."""
    split = cm.layer_split(did, 1, 1, "none")
    return split.attention_fwd + split.attention_bwd


def _row_bytes(cm: CostModel) -> float:
    """Bytes of one routed token's hidden state, what dispatch, combine and the ETP gathers move: the
    cost model's stored bytes per routed row under full recompute, which keeps only that input."""
    return cm.expert_act_per_row(1, "full")


def _zebra_sides(
    cm: CostModel,
    att: str,
    exp: str,
    *,
    tp: int,
    b: int,
    tokens: float,
    ep: int,
    etp: int,
    edp: int,
    m_att: int,
    recompute: Recompute,
) -> _ZebraSides:
    """The per-layer pieces of one ZP layout from the cost model: ``tokens`` is one ZP group's
    micro-batch (all its attention replicas), ``m_att`` its attention devices."""
    m, st = cm.model, cm.settings
    k, E = m.moe_router_topk, m.num_experts or 1
    imb = st.imbalance
    full = recompute == "full"
    # attention side and dense layers: the cost model's layer with every expert local, minus the routed
    # experts, which the zebra model places elsewhere
    split = cm.layer_split(att, tp, b, recompute)
    # all of the layer's expert work on the attention devices (EP over them, replicas share tokens)
    ep_x = _largest_ep(E, m_att)
    edp_x = m_att // ep_x
    x_f = imb * cm.expert_gemms(att, k * tokens / (E * edp_x), E // ep_x, 1)
    act_x = k * tokens / (ep_x * edp_x) * imb * cm.expert_act_per_row(1, recompute)
    # expert side: EP x ETP x EDP over the expert devices, ETP all-gather + reduce-scatter of the rows
    e_g = imb * cm.expert_gemms(exp, k * tokens / (E * edp), E // ep, etp)
    rows_e = k * tokens / (ep * edp)
    row_bytes = _row_bytes(cm)
    etp_comm = 0.0
    if etp > 1:
        dev_e, size = cm.device(exp), rows_e * row_bytes
        etp_comm = cm.collective(dev_e, exp, "all_gather", size, etp, etp) + cm.collective(
            dev_e, exp, "reduce_scatter", size, etp, etp
        )
    e_f = e_g + etp_comm
    e_b = 2 * e_g + etp_comm + (e_f if full else 0.0)
    act_e = rows_e * imb * cm.expert_act_per_row(etp, recompute)
    # working set while a layer runs: its full activations plus dispatch/combine buffers
    work_e = rows_e * imb * (cm.expert_act_per_row(etp, "none") + 2 * row_bytes)
    return _ZebraSides(
        a_f=split.attention_fwd,
        a_b=split.attention_bwd,
        x_f=x_f,
        e_f=e_f,
        e_b=e_b,
        cross_bytes=k * tokens * row_bytes,
        act_a=split.attention_act,
        act_x=act_x,
        act_e=act_e,
        work_e=work_e,
        dense_a_f=split.dense_fwd,
        dense_a_b=split.dense_bwd,
        dense_act=split.dense_act,
    )


def _zebra_layouts(cm: CostModel, att: str, exp: str) -> Iterator[ZebraPlan]:
    """Every ZP + DP layout of the two types (groups, attention TP, EP x ETP x EDP, R, recompute), each
    with its best Asym-EA offload."""
    model, cluster, settings = cm.model, cm.cluster, cm.settings
    st = settings
    inv = cluster.inventory
    E = model.num_experts or 1
    L_moe = sum(1 for kd in model.layer_kinds if kd != "dense")
    L_dense = len(model.layer_kinds) - L_moe
    b = st.micro_batch_size
    gib = 1024**3
    cap_a, cap_e = cm.capacity(att), cm.capacity(exp)
    p_moe = model.layer_params("moe")
    p_dense = model.layer_params("dense") if L_dense else {"tp": 0, "replicated": 0, "expert": 0}
    for G in divisors(math.gcd(inv[att], inv[exp])):
        M, N = inv[att] // G, inv[exp] // G
        for tp in pow2_upto(min(M, cluster.node_size(att))):
            if M % tp or model.num_attention_heads % tp or (model.groups % tp and tp % model.groups):
                continue
            dp_a = M // tp
            ep_x = _largest_ep(E, M)
            for ep in (d for d in divisors(N) if E % d == 0):
                for etp in pow2_upto(min(N // ep, cluster.node_size(exp))):
                    if N % (ep * etp):
                        continue
                    edp = N // (ep * etp)
                    for R in pow2_upto(min(st.global_batch_size, 32)):
                        per_step = G * dp_a * b * R
                        if st.global_batch_size % per_step:
                            continue
                        K = st.global_batch_size // per_step
                        tokens = dp_a * b * st.seq_length  # per group micro-batch
                        for rec in ("none", "full"):
                            sides = _zebra_sides(
                                cm,
                                att,
                                exp,
                                tp=tp,
                                b=b,
                                tokens=tokens,
                                ep=ep,
                                etp=etp,
                                edp=edp,
                                m_att=M,
                                recompute=rec,
                            )  # type: ignore[arg-type]
                            yield from _zebra_best_offload(
                                cm,
                                model,
                                settings,
                                att,
                                exp,
                                sides,
                                G=G,
                                M=M,
                                N=N,
                                tp=tp,
                                dp_a=dp_a,
                                ep=ep,
                                etp=etp,
                                edp=edp,
                                ep_x=ep_x,
                                R=R,
                                K=K,
                                rec=rec,
                                L_moe=L_moe,
                                L_dense=L_dense,
                                p_moe=p_moe,
                                p_dense=p_dense,
                                cap_a=cap_a,
                                cap_e=cap_e,
                                gib=gib,
                            )


def _zebra_best_offload(
    cm: CostModel,
    model: ModelSpec,
    st: Settings,
    att: str,
    exp: str,
    s: _ZebraSides,
    *,
    G: int,
    M: int,
    N: int,
    tp: int,
    dp_a: int,
    ep: int,
    etp: int,
    edp: int,
    ep_x: int,
    R: int,
    K: int,
    rec: str,
    L_moe: int,
    L_dense: int,
    p_moe: dict[str, int],
    p_dense: dict[str, int],
    cap_a: float,
    cap_e: float,
    gib: int,
) -> Iterator[ZebraPlan]:
    """Asym-EA: the fastest offload ``u`` of (layer, expert) units that both sides can hold."""
    E = model.num_experts or 1
    units = E * L_moe
    b = st.micro_batch_size
    dev_a, dev_e = cm.device(att), cm.device(exp)
    cfg_a = ParallelConfig(tp=tp, dp=dp_a * G)
    edges = cm.single_edge(att, cfg_a, b)  # the attention side is one stage: embedding and head (tied: once)
    dense_local = L_moe * (p_moe["tp"] / tp + p_moe["replicated"]) + L_dense * (
        p_dense["tp"] / tp + p_dense["replicated"]
    )
    # weights, gradient RS / param AG and the optimizer step are linear in the parameters a device holds
    # (collectives are priced at the fixed gradient-bucket size), so price both sides once at f = 0 and
    # for all experts, and interpolate
    cfg_ax = ParallelConfig(tp=tp, dp=dp_a * G, ep=ep_x, etp=1)
    cfg_e = ParallelConfig(tp=1, dp=N * G, ep=ep, etp=etp)
    all_x = units * model.expert_params
    scan = _OffloadScan(
        cm=cm,
        s=s,
        att=att,
        exp=exp,
        rec=rec,
        R=R,
        K=K,
        M=M,
        N=N,
        L_moe=L_moe,
        L_dense=L_dense,
        units=units,
        a0=cm.state_and_sync(dev_a, att, cfg_ax, dense_local, 0.0),
        a1=cm.state_and_sync(dev_a, att, cfg_ax, 0.0, all_x / ep_x),
        e1=cm.state_and_sync(dev_e, exp, cfg_e, 0.0, all_x / (ep * etp)),
        edge=(edges.weights, edges.rs, edges.ag, edges.opt),
        edge_f=R * edges.fwd,
        edge_b=R * edges.bwd,
        # transient working set: the attention layer's (the cost model's, all experts local) plus the
        # logits of the head; context and fragmentation are in the capacity (cost/memory.py budget)
        fixed_a=cm.fixed_memory(att, ParallelConfig(tp=tp, dp=1), b) + edges.work,
        cap_a=cap_a,
        cap_e=cap_e,
        gib=gib,
        ident={
            "attention_device": att,
            "expert_device": exp,
            "zp_groups": G,
            "attention_devices": M,
            "expert_devices": N,
            "attention_tp": tp,
            "ep": ep,
            "etp": etp,
            "edp": edp,
            "micro_batches": R,
            "accumulation_steps": K,
            "recompute": rec,
        },
    )
    # feasible offload interval: memory is linear in f, rising on the attention side, falling on the
    # expert side (HeterMoE's alpha and beta)
    lo_f = _linear_root(scan.mem_e, cap_e, rising=False)
    hi_f = _linear_root(scan.mem_a, cap_a, rising=True)
    if lo_f is None or hi_f is None or lo_f > hi_f:
        return
    u_lo, u_hi = math.ceil(lo_f * units - 1e-9), math.floor(hi_f * units + 1e-9)
    if units == 0:
        u_lo, u_hi = 0, 0
    best = _best_offload(scan.at, u_lo, u_hi)
    if best is not None:
        yield best


@dataclass(frozen=True)
class _OffloadScan:
    """One Asym-EA configuration priced as a function of the offloaded share ``f`` of (layer, expert)
    units: memory and the sync terms are linear in ``f`` (``a0 + f*a1`` on the attention side,
    ``(1-f)*e1`` on the expert side), the per-layer times piecewise linear."""

    cm: CostModel
    s: _ZebraSides
    att: str
    exp: str
    rec: str
    R: int
    K: int
    M: int
    N: int
    L_moe: int
    L_dense: int
    units: int
    a0: tuple[float, float, float, float]
    a1: tuple[float, float, float, float]
    e1: tuple[float, float, float, float]
    edge: tuple[float, float, float, float]
    edge_f: float
    edge_b: float
    fixed_a: float
    cap_a: float
    cap_e: float
    gib: int
    ident: dict[str, Any]

    def side_a(self, f: float) -> tuple[float, float, float, float]:
        return tuple(x0 + f * x1 + xe for x0, x1, xe in zip(self.a0, self.a1, self.edge, strict=True))  # type: ignore[return-value]

    def side_e(self, f: float) -> tuple[float, float, float, float]:
        return tuple((1 - f) * x for x in self.e1)  # type: ignore[return-value]

    def mem_a(self, f: float) -> float:
        s = self.s
        return (
            self.side_a(f)[0]
            + self.R * (self.L_moe * (s.act_a + f * s.act_x) + self.L_dense * s.dense_act)
            + self.fixed_a
        )

    def mem_e(self, f: float) -> float:
        s = self.s
        return self.side_e(f)[0] + self.R * self.L_moe * (1 - f) * s.act_e + (1 - f) * s.work_e

    def at(self, u: int) -> ZebraPlan | None:
        """The plan offloading ``u`` units, or None when a side runs out of memory."""
        s, R, cm = self.s, self.R, self.cm
        f = u / self.units if self.units else 0.0
        m_a, m_e = self.mem_a(f), self.mem_e(f)
        if m_a > self.cap_a or m_e > self.cap_e:
            return None
        af = s.a_f + f * s.x_f
        ab = s.a_b + f * 2 * s.x_f + (f * s.x_f if self.rec == "full" else 0.0)
        ef = (1 - f) * s.e_f
        eb = (1 - f) * s.e_b
        # what is left of the routed tokens crosses the type boundary, bipartite between the two sides
        c = cm.cross_dispatch(self.att, self.exp, (1 - f) * s.cross_bytes, self.M, self.N) if f < 1 else 0.0
        fwd_layer = max(R * max(af, ef, c), af + c + ef + c)
        bwd_layer = max(R * max(ab, eb, c), ab + c + eb + c)
        step_f = self.L_moe * fwd_layer + self.L_dense * R * s.dense_a_f + self.edge_f
        step_b = self.L_moe * bwd_layer + self.L_dense * R * s.dense_a_b + self.edge_b
        step = step_f + step_b
        # each side's DP sync and optimizer step after the last backward; the slower side sets it
        sync = max(
            cm.exposed_sync(did, rs, ag, step_f, step_b, opt)
            for did, (_w, rs, ag, opt) in ((self.att, self.side_a(f)), (self.exp, self.side_e(f)))
        )
        t_iter = self.K * step + sync
        return ZebraPlan(
            **self.ident,
            offloaded_experts=u,
            iteration_time_s=t_iter,
            step_time_s=step,
            sync_s=sync,
            attention_memory_gib=m_a / self.gib,
            expert_memory_gib=m_e / self.gib,
            attention_capacity_gib=self.cap_a / self.gib,
            expert_capacity_gib=self.cap_e / self.gib,
            layer_times={
                "attention_f": af,
                "attention_b": ab,
                "expert_f": ef,
                "expert_b": eb,
                "cross": c,
                "layer_f": fwd_layer,
                "layer_b": bwd_layer,
            },
        )


def _best_offload(at: Callable[[int], ZebraPlan | None], u_lo: int, u_hi: int) -> ZebraPlan | None:
    """Time is piecewise linear and (nearly) convex in the offload share: scan a coarse grid over the
    feasible interval, then every unit around the best coarse point."""
    step = max(1, (u_hi - u_lo) // 32)
    best: ZebraPlan | None = None
    for u in [*range(u_lo, u_hi + 1, step), u_hi]:
        r = at(u)
        if r is not None and (best is None or r.iteration_time_s < best.iteration_time_s - 1e-12):
            best = r
    if best is not None and step > 1:
        c0 = best.offloaded_experts
        for u in range(max(u_lo, c0 - step + 1), min(u_hi, c0 + step - 1) + 1):
            r = at(u)
            if r is not None and r.iteration_time_s < best.iteration_time_s - 1e-12:
                best = r
    return best


def _linear_root(fn: Callable[[float], float], cap: float, *, rising: bool) -> float | None:
    """For ``fn`` linear on [0, 1]: the largest f with fn(f) <= cap (rising) or the smallest (falling);
    None when no f in [0, 1] qualifies."""
    y0, y1 = fn(0.0), fn(1.0)
    if rising:
        if y0 > cap:
            return None
        return 1.0 if y1 <= cap else (cap - y0) / (y1 - y0)
    if y1 > cap:
        return None
    return 0.0 if y0 <= cap else (y0 - cap) / (y0 - y1)


def _zebra_proxy(model: ModelSpec, cluster: ClusterSpec, settings: Settings, zp: ZebraPlan) -> Plan:
    """The closest :class:`Plan`: one stage on all attention devices with the attention mesh (TP, DP over
    every ZP group) and EP over them; its own estimate is *not* the zebra time."""
    g = zp.zp_groups * zp.attention_devices
    dp = g // zp.attention_tp
    ep = max(d for d in divisors(dp) if (model.num_experts or 1) % d == 0) if model.is_moe else 1
    cfg = ParallelConfig(tp=zp.attention_tp, cp=1, dp=dp, ep=ep, etp=1)
    stage = Stage(zp.attention_device, cfg, 0, len(model.layer_kinds), zp.recompute)
    plan = make_plan(model, cluster, settings, "hetero", [stage])
    check_plan(plan, model, cluster)
    return plan
