"""Metis (USENIX ATC'24) as HAPMoE adapts it: a heterogeneous PP/DP/TP planner that does not see MoE.

An adapter over the shared plan type and cost model: Metis's own search (stage orders and sizes, its
pure-DP-first intra-stage conversion, its speed-proportional layer balancer) chooses a :class:`Plan`
using :class:`MoEUnawareCostModel` (the cost model with the EP all-to-all invisible, as in Metis's
estimator), and the chosen plan is then scored truthfully with :func:`~hapmoe_milp.cost.estimate.estimate`.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from hapmoe_milp.config import ParallelConfig, Recompute, Settings
from hapmoe_milp.cost.estimate import estimate, plan_stage_totals
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.deadline import NO_DEADLINE, Deadline
from hapmoe_milp.errors import PlanError
from hapmoe_milp.plan import Plan, Stage, check_config
from hapmoe_milp.search.solution import Solution
from hapmoe_milp.space import stage_sizes
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

from .common import (
    SOLVER_NAMES,
    divisors,
    finish,
    infeasible,
    is_valid,
    make_plan,
    pow2_upto,
    stopped,
    sub_cluster,
)
from .megatron_uniform import megatron_uniform


def MoEUnawareCostModel(model: ModelSpec, cluster: ClusterSpec, settings: Settings) -> CostModel:
    """Metis's view of an MoE layer: per-layer times as profiled on one device/TP group, so the EP
    dispatch/combine traffic is invisible to its estimator (reference §3.4 has no EP term). Memory is
    unaffected (dispatch buffers are activations), so only the plan *choice* changes."""
    return CostModel(model, cluster, settings, ep_comm_visible=False)


def _partitions(total: int, sizes: Sequence[int], max_parts: int) -> list[tuple[int, ...]]:
    """Non-increasing tuples of allowed sizes summing to ``total`` with at most ``max_parts`` parts."""
    out: list[tuple[int, ...]] = []
    desc = sorted(set(sizes), reverse=True)

    def rec(rem: int, cap: int, acc: tuple[int, ...]) -> None:
        if rem == 0:
            out.append(acc)
            return
        if len(acc) >= max_parts:
            return
        for s in desc:
            if s <= cap and s <= rem:
                rec(rem - s, s, (*acc, s))

    rec(total, total, ())
    return out


def _fixed_expert_layout(
    model: ModelSpec, cluster: ClusterSpec, settings: Settings, deadline: Deadline = NO_DEADLINE
) -> tuple[dict[str, tuple[int, int]], str]:
    """EP/ETP per device type "from homogeneous profiling": the best uniform Megatron plan on a
    cluster made of that type alone. FlagScale's "EP on in all meshes or none" is then enforced by
    giving every type the fastest type's value where they disagree."""
    if not model.is_moe:
        return {t: (1, 1) for t in cluster.device_types}, "dense model"
    found: dict[str, tuple[int, int]] = {}
    for did in cluster.device_types:
        sub = sub_cluster(cluster, did)
        sol = megatron_uniform(model, sub, settings, vpp=False, deadline=deadline)
        if sol.plan is None and not settings.optimizer_offload:
            sol = megatron_uniform(model, sub, replace(settings, optimizer_offload=True), vpp=False, deadline=deadline)
        if sol.plan is not None:
            c = sol.plan.stages[0].cfg
            found[did] = (c.ep, c.etp)
    note = "homogeneous profiling per type"
    if not found:
        sol = megatron_uniform(model, cluster, settings, vpp=False, deadline=deadline)
        if sol.plan is not None:
            c = sol.plan.stages[0].cfg
            ref = (c.ep, c.etp)
            note = "no type fits alone; EP/ETP of the uniform plan on the whole cluster"
        else:
            ref = (math.gcd(model.num_experts or 1, min(cluster.node_size(t) for t in cluster.device_types)), 1)
            note = "no uniform plan fits; EP = experts within a node"
        return {t: ref for t in cluster.device_types}, note
    fastest = max(found, key=lambda t: cluster.device(t).dense_peak_tflops)
    out: dict[str, tuple[int, int]] = {}
    for did in cluster.device_types:
        val = found.get(did, found[fastest])
        if (val[0] > 1) != (found[fastest][0] > 1):
            val = found[fastest]
        out[did] = val
    return out, note


def _stage_cfg(
    model: ModelSpec, g: int, node: int, tp: int, cp: int, ep0: int, etp0: int, seq: int
) -> ParallelConfig | None:
    """The stage mesh Metis would run: its (DP, TP), the shared CP, and the frozen EP/ETP clamped to
    what divides the stage (EP stays on if it was on)."""
    if g % (tp * cp):
        return None
    etp = max(v for v in pow2_upto(min(etp0, g, node)))
    eps = [d for d in divisors(ep0) if g % (d * etp) == 0 and (model.num_experts or 1) % d == 0]
    ep = max(eps) if eps else 1
    if model.is_moe and ep0 > 1 and ep == 1:
        return None
    cfg = ParallelConfig(tp=tp, cp=cp, dp=g // (tp * cp), ep=ep, etp=etp)
    try:
        check_config(cfg, model, None, node, "")
    except PlanError:
        return None
    if cp > 1 and seq % (2 * cp):
        return None
    return cfg


def _largest_remainder(n: int, weights: Sequence[float]) -> list[int]:
    """Integer shares of ``n`` proportional to ``weights``, each at least 1 (needs n >= len(weights))."""
    k = len(weights)
    tot = sum(weights)
    raw = [n * w / tot for w in weights]
    base = [max(1, math.floor(r)) for r in raw]
    while sum(base) > n:
        i = max((j for j in range(k) if base[j] > 1), key=lambda j: base[j] - raw[j])
        base[i] -= 1
    order = sorted(range(k), key=lambda j: -(raw[j] - base[j]))
    i = 0
    while sum(base) < n:
        base[order[i % k]] += 1
        i += 1
    return base


@dataclass(frozen=True)
class _MetisCandidate:
    planned_s: float
    plan: Plan


def _metis_balance(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    cm: CostModel,
    devices: Sequence[str],
    cfgs: Sequence[ParallelConfig],
) -> tuple[Plan | None, list[float]]:
    """Metis's LayerComputeBalancer: layers in proportion to stage speed (1 / profiled per-layer time),
    with its memory correction ``c * (capacity/demand) * 0.9`` for overflowing stages (3 attempts).
    A stage still over memory switches to full recompute (FlagScale's per-stage choice) and the split
    is redone with its slower speed. Returns the plan (None if it never fits) and the memory slack per
    stage, which drives the intra-stage (DP, TP) conversion."""
    n = len(model.layer_kinds)
    s_count = len(cfgs)
    if s_count > n:
        return None, []
    kinds = model.layer_kinds
    rec: list[Recompute] = ["none"] * s_count
    dp0 = cfgs[0].dp
    step = dp0 * settings.micro_batch_size
    slack: list[float] = [0.0] * s_count
    for _flip in range(s_count + 1):
        speed = []
        for i, (d, c) in enumerate(zip(devices, cfgs, strict=True)):
            b = step // c.dp
            per = sum(cm.layer(d, c, b, k, rec[i]).fwd + cm.layer(d, c, b, k, rec[i]).bwd for k in kinds) / n
            speed.append(1.0 / per)
        cap = list(speed)
        plan = None
        for _attempt in range(4):
            counts = _largest_remainder(n, cap)
            stages, pos = [], 0
            for i, (d, c) in enumerate(zip(devices, cfgs, strict=True)):
                stages.append(Stage(d, c, pos, pos + counts[i], rec[i]))
                pos += counts[i]
            plan = make_plan(model, cluster, settings, "hetero", stages)
            totals = plan_stage_totals(cm, plan)
            slack = [t.capacity - t.memory for t in totals]
            over = [i for i, t in enumerate(totals) if t.memory > t.capacity]
            if not over:
                return plan, slack
            for i in over:
                cap[i] *= totals[i].capacity / totals[i].memory * 0.9
        flip = [i for i in range(s_count) if slack[i] < 0 and rec[i] == "none"]
        if not flip:
            break
        for i in flip:
            rec[i] = "full"
    return None, slack


def _metis_intra(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    cm: CostModel,
    devices: Sequence[str],
    sizes: Sequence[int],
    cp: int,
    fixed: dict[str, tuple[int, int]],
) -> Iterator[Plan]:
    """Metis's IntraStagePlanGenerator: start every stage at pure DP and repeatedly convert the stage
    with the least memory slack ``(dp, tp) -> (dp/2, 2 tp)``; every state is a candidate."""
    tps = [1] * len(sizes)
    seen: set[tuple[int, ...]] = set()
    while tuple(tps) not in seen:
        seen.add(tuple(tps))
        cfgs: list[ParallelConfig] = []
        for d, g, tp in zip(devices, sizes, tps, strict=True):
            ep0, etp0 = fixed[d]
            c = _stage_cfg(model, g, cluster.node_size(d), tp, cp, ep0, etp0, settings.seq_length)
            if c is None:
                break
            cfgs.append(c)
        slack: list[float] = [0.0] * len(sizes)
        ok = len(cfgs) == len(sizes)
        if ok:
            step = cfgs[0].dp * settings.micro_batch_size
            ok = settings.global_batch_size % step == 0 and all(step % c.dp == 0 for c in cfgs)
        if ok:
            plan, slack = _metis_balance(model, cluster, settings, cm, devices, cfgs)
            if plan is not None:
                yield plan
        # convert the stage with the least slack that can still grow its TP; while the meshes break
        # the micro-batch rule, first the stages whose DP does not divide the first stage's
        if ok or len(cfgs) != len(sizes):
            order = sorted(range(len(sizes)), key=lambda i: slack[i] if slack else 0.0)
        else:
            step = cfgs[0].dp * settings.micro_batch_size
            order = sorted(range(len(sizes)), key=lambda i: (step % cfgs[i].dp == 0, -cfgs[i].dp, i))
        grown = False
        for i in order:
            nt = tps[i] * 2
            d = devices[i]
            if (
                nt <= cluster.node_size(d)
                and sizes[i] % (nt * cp) == 0
                and model.num_attention_heads % nt == 0
                and (model.groups % nt == 0 or nt % model.groups == 0)
            ):
                tps[i] = nt
                grown = True
                break
        if not grown:
            return


def metis_style(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    *,
    max_stages: int = 8,
    max_stages_per_type: int = 4,
    deadline: Deadline = NO_DEADLINE,
) -> Solution:
    """Metis (USENIX ATC'24) as HAPMoE adapts it: heterogeneous PP/DP/TP search, MoE-unaware.

    - inter-stage: every order of the device types; each type's devices cut into stages of allowed
      sizes (powers of two up to a node, whole nodes; non-increasing, <= ``max_stages_per_type``),
      all devices used, at most ``max_stages`` stages (Metis bounds its permutations the same way);
    - intra-stage: Metis's pure-DP-first conversion towards TP on the stage with least memory slack;
      no CP (Metis has none, and FlagScale's heterogeneous meshes reject it);
    - layers: Metis's speed-proportional balancer with its memory correction (not an optimal split);
    - MoE-unaware: EP/ETP frozen at the best homogeneous value per type ("EP/TPE fixed from
      homogeneous profiling", HAPMoE §5), and plans are *chosen* with :class:`MoEUnawareCostModel`
      (EP all-to-all invisible, as in Metis's estimator);
    - hetero family semantics: ``(dp0*mbs) % dp_i == 0``, EP on in every stage or none, no VPP;
      recompute is none, or full on a stage that cannot fit otherwise.
    The chosen plan is then scored truthfully with :func:`estimate`. Past ``deadline`` the search stops with
    the best plan so far (status ``timeout``).
    """
    name = SOLVER_NAMES["metis"]
    t0 = time.perf_counter()
    fixed, note = _fixed_expert_layout(model, cluster, settings, deadline)
    planning = MoEUnawareCostModel(model, cluster, settings)
    inv = cluster.inventory
    per_type: dict[str, list[tuple[int, ...]]] = {
        t: _partitions(inv[t], stage_sizes(cluster, t), max_stages_per_type) for t in cluster.device_types
    }
    n = len(model.layer_kinds)
    best: _MetisCandidate | None = None
    considered = 0
    for order in itertools.permutations(cluster.device_types):
        for parts in itertools.product(*(per_type[t] for t in order)):
            if deadline.passed():
                break
            devices = [t for t, p in zip(order, parts, strict=True) for _ in p]
            sizes = [g for p in parts for g in p]
            if not sizes or len(sizes) > min(max_stages, n):
                continue
            # CP = 1: FlagScale's heterogeneous meshes reject context parallelism (as in our hetero family)
            for plan in _metis_intra(model, cluster, settings, planning, devices, sizes, 1, fixed):
                if not is_valid(plan, model, cluster):
                    continue
                considered += 1
                est = estimate(model, cluster, plan, settings, cost_model=planning)
                if est.fits and (best is None or est.iteration_time_s < best.planned_s - 1e-12):
                    best = _MetisCandidate(est.iteration_time_s, plan)
    if deadline.passed():
        return stopped(name, t0, best.plan if best else None, considered, model, cluster, settings)
    if best is None:
        return infeasible(name, t0, f"no Metis-style plan fits ({considered} candidates; EP/ETP: {note})")
    p = best.plan
    eps = ",".join(f"{d}:EP{e}/ETP{t}" for d, (e, t) in fixed.items())
    msg = (
        f"{p.pp} stages, speed-proportional layers {p.layer_counts()}, EP/ETP frozen ({eps}; {note}); "
        f"chosen with EP traffic invisible (planned {best.planned_s:.4g} s), scored with the full cost model"
    )
    return finish(name, model, cluster, settings, p, t0, msg, {"candidates": considered, "planned_s": best.planned_s})
