"""The pure-Python label DP that the fast core (:mod:`hapmoe_milp.search.dp`) replaced, kept as a reference.

It is the algorithm as first written, one Python object per label, and is far too slow for the product
(17-60 s on the HAPMoE scenarios); tests run it on small instances to pin that the vectorised core makes
the same decisions under the same pruning switches. It searches plain 1F1B only (no VPP).


Stages are placed from the last to the first. A state is (first layer of the placed suffix, devices used
per type, device type and size of the stage just placed, number of stages placed). Counting stages from
the end makes the 1F1B in-flight count ``min(M, k)`` known when a stage is placed, so one pass covers
every pipeline depth.

The objective ``alpha*sum(tau) + beta*max(tau) + max(sync)`` has two max terms, which an additive
recurrence cannot carry; each state keeps the Pareto front of ``(sum, max tau, max sync)`` labels. With
every pruning switch off this is exact over the instance; a global upper bound (best plan so far)
discards labels whose objective already exceeds it, which is safe because all three terms only grow.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, replace

from hapmoe_milp.config import RECOMPUTE_LEVELS, Family, Settings
from hapmoe_milp.errors import InfeasibleError
from hapmoe_milp.instance import Instance, Option, StageEval, aligned, build_instances, groups
from hapmoe_milp.plan import Plan, Stage
from hapmoe_milp.search.solution import Solution
from hapmoe_milp.space import PruneCounter, Pruning
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Label:
    total: float
    tmax: float
    smax: float
    option: Option | None
    start: int
    end: int
    parent: Label | None


def _pareto(labels: list[Label], eps: float = 0.0, floor: float = 0.0) -> list[Label]:
    """Labels not dominated in (total, max(tmax, floor), smax).

    ``floor`` is a lower bound on the largest stage time any completion of this state will add, so a
    label's tmax below it can never show in the objective: comparing ``max(tmax, floor)`` keeps the
    DP exact while merging labels that differ only there. With ``eps`` > 0, labels within a relative
    ``eps`` of a kept one are dropped too (an approximation, used only when pruning is on).
    """
    labels.sort(key=lambda lb: (lb.total, lb.tmax, lb.smax))
    kept: list[Label] = []
    stair: list[tuple[float, float]] = []  # (tmax, smax) of kept labels, tmax ascending, smax descending
    f = 1.0 + eps
    for lb in labels:
        tm = lb.tmax if lb.tmax > floor else floor
        t, sm = tm * f, lb.smax * f
        i = bisect_right(stair, (t, float("inf")))
        if i and stair[i - 1][1] <= sm:
            continue
        kept.append(lb)
        j = bisect_right(stair, (tm, lb.smax))
        stair.insert(j, (tm, lb.smax))
        k = j + 1
        while k < len(stair) and stair[k][1] >= lb.smax:
            del stair[k]
    return kept


@dataclass
class _Best:
    value: float = float("inf")
    label: Label | None = None
    inst: Instance | None = None
    second_value: float = float("inf")
    second_label: Label | None = None
    second_inst: Instance | None = None

    def offer(self, value: float, label: Label, inst: Instance) -> None:
        if value < self.value:
            if self.label is not None and not _same_plan(self.label, label):
                self.second_value, self.second_label, self.second_inst = self.value, self.label, self.inst
            self.value, self.label, self.inst = value, label, inst
        elif value < self.second_value and (self.label is None or not _same_plan(self.label, label)):
            self.second_value, self.second_label, self.second_inst = value, label, inst


def _same_plan(a: Label, b: Label) -> bool:
    x: Label | None = a
    y: Label | None = b
    while x is not None and y is not None:
        if x.option is not y.option or x.start != y.start:
            return False
        x, y = x.parent, y.parent
    return x is None and y is None


def _solve_group(
    inst: Instance, options: list[Option], best: _Best, counter: PruneCounter, deadline: float | None
) -> bool:
    """Run the backward DP over ``options``; returns False if the deadline stopped it."""
    pr = inst.pruning
    n_layers = inst.num_layers
    alpha, beta = inst.coefficients
    inv = inst.inventory
    types = list(inv)
    tidx = {t: i for i, t in enumerate(types)}
    kmax = n_layers if pr.max_stages <= 0 else min(n_layers, pr.max_stages)
    total_dev = sum(inv.values())
    kmax = min(kmax, total_dev)
    first_dp = inst.first_dp

    # shapes with their recompute levels cheapest-first, for the min-recompute rule
    shapes: dict[tuple, list[Option]] = {}
    for o in options:
        shapes.setdefault((o.device, o.cfg), []).append(o)
    order = {lv: i for i, lv in enumerate(RECOMPUTE_LEVELS)}
    shape_list = [sorted(v, key=lambda o: order[o.recompute]) for v in shapes.values()]

    # Lower bound on what the layers [0, s) still cost: per layer, the fewest device-seconds any option
    # needs (w); the remaining D devices must absorb W = sum(w), so some stage takes >= W / D and the
    # stages together take >= W / g_max. Valid whatever the pruning, so it keeps the DP exact.
    kinds = inst.layer_kinds
    w_kind = {
        k: min(((o.per_kind[k].fwd + o.per_kind[k].bwd) * o.devices for o in options), default=0.0) for k in set(kinds)
    }
    w_pre = [0.0]
    for k in kinds:
        w_pre.append(w_pre[-1] + w_kind[k])
    g_max = max((o.devices for o in options), default=1)
    total_inv = sum(inv.values())
    # Memory lower bound: layers [0, s) need at least m_pre[s] bytes summed over devices (weights and
    # optimizer state of the most sharded option); the devices left must be able to hold them.
    m_kind = {k: min((o.per_kind[k].weights * o.devices for o in options), default=0.0) for k in set(kinds)}
    m_pre = [0.0]
    for k in kinds:
        m_pre.append(m_pre[-1] + m_kind[k])
    cap_of = {t: max((o.capacity for o in options if o.device == t), default=0.0) for t in types}

    node_of = {t: inst.cluster.node_size(t) for t in types}
    n_bound = 0
    root = Label(0.0, 0.0, 0.0, None, n_layers, n_layers, None)
    # state: (first layer of the suffix, devices used per type, next stage's type, its size class,
    #         device types seen so far from the end -- hetero plans keep each type contiguous)
    contiguous = inst.family == "hetero"
    uniform = pr.uniform_stage_size or (contiguous and 0 < pr.large_cluster < total_inv)
    level: dict[tuple, list[Label]] = {(n_layers, (0,) * len(types), None, 0, ()): [root]}
    p2p_cache: dict[tuple, float] = {}
    for k in range(1, kmax + 1):
        if deadline is not None and time.perf_counter() > deadline:
            counter.add("bound", n_bound)
            return False
        # group live states by the first layer of their suffix: a stage ending there is priced once
        by_end: dict[int, list[tuple[tuple[int, ...], str | None, int, list[Label]]]] = {}
        for (e, used, nd, ng, seen), labels in level.items():
            labels = [lb for lb in labels if alpha * lb.total + beta * lb.tmax + lb.smax < best.value]
            if labels:
                by_end.setdefault(e, []).append((used, nd, ng, seen, labels))
        nxt: dict[tuple, list[Label]] = {}
        for e, states in by_end.items():
            if deadline is not None and time.perf_counter() > deadline:
                counter.add("bound", n_bound)
                return False
            lo_tmax = min(lb.tmax for *_, labels in states for lb in labels)
            for group in shape_list:
                o0 = group[0]
                ti = tidx[o0.device]
                g = o0.devices
                node = node_of[o0.device]
                fits_inv = [
                    st
                    for st in states
                    if st[0][ti] + g <= inv[o0.device]
                    and aligned(inv[o0.device] - st[0][ti] - g, g, node)
                    and not (contiguous and o0.device in st[3] and st[3][-1] != o0.device)
                    and not (uniform and st[1] == o0.device and st[2] != g)
                ]
                if not fits_inv:
                    continue
                n_lo, n_hi = o0.band
                # the next stage's p2p only sees whether this stage fits inside a node (boundary link
                # class), so states keep that, not the exact size
                g_link = 1 if g < node_of[o0.device] else node_of[o0.device]
                for s in range(max(0, e - n_hi), e - n_lo + 1):
                    first = s == 0
                    if first and o0.cfg.dp != first_dp:
                        continue
                    if not first and k == kmax:
                        continue
                    cands: list[tuple[Option, StageEval]] = []
                    for i, o in enumerate(group):
                        ev = inst.evaluate(o, s, e, from_end=k, first=first)
                        if beta * max(ev.tau, lo_tmax) + alpha * ev.tau >= best.value:
                            counter.add("bound")
                            break  # costlier recompute levels are only slower
                        if ev.memory > o.capacity:
                            continue
                        cands.append((o, ev))
                        if pr.min_recompute:
                            if len(group) - i - 1:
                                counter.add("min_recompute", len(group) - i - 1)
                            break
                    for o, base in cands:
                        for used, nd, ng, seen, labels in fits_inv:
                            if nd is None:
                                p2p = 0.0
                            else:
                                pk = (o.index, nd, ng)
                                p2p = p2p_cache.get(pk, -1.0)
                                if p2p < 0:
                                    p2p = p2p_cache[pk] = inst.p2p(o, nd, ng)
                            tau = base.tau + 2 * p2p
                            if (
                                pr.cross_type_comm
                                and nd is not None
                                and nd != o.device
                                and 2 * p2p > pr.eta * (base.fwd + base.bwd)
                            ):
                                counter.add("cross_type_comm")
                                continue
                            used2 = list(used)
                            used2[ti] += g
                            rem_dev = total_inv - sum(used2)
                            if not first:
                                if rem_dev <= 0:
                                    continue
                                rem_cap = sum((inv[t] - used2[i]) * cap_of[t] for i, t in enumerate(types))
                                if m_pre[s] > rem_cap:
                                    counter.add("memory_bound")
                                    continue
                                # at most kmax - k more stages of at most g_max devices each
                                usable = min(rem_dev, (kmax - k) * g_max)
                                if usable <= 0:
                                    continue
                                rest_sum = w_pre[s] / g_max
                                rest_max = w_pre[s] / usable
                            else:
                                rest_sum = rest_max = 0.0
                            seen2 = seen if (seen and seen[-1] == o.device) else (*seen, o.device)
                            key = (s, tuple(used2), o.device, g if uniform else g_link, seen2)
                            sync = base.sync
                            collapsed = False  # labels are sorted by total: once one with tmax <= tau and
                            # smax <= sync is extended, later such labels only give dominated results
                            for lb in labels:
                                if lb.tmax <= tau and lb.smax <= sync:
                                    if collapsed:
                                        continue
                                    collapsed = True
                                tot = lb.total + tau
                                tmx = lb.tmax if lb.tmax > tau else tau
                                smx = lb.smax if lb.smax > sync else sync
                                if alpha * (tot + rest_sum) + beta * max(tmx, rest_max) + smx >= best.value:
                                    n_bound += 1
                                    continue
                                new = Label(tot, tmx, smx, o, s, e, lb)
                                if first:
                                    best.offer(alpha * tot + beta * tmx + smx, new, inst)
                                else:
                                    nxt.setdefault(key, []).append(new)
        level = {}
        for key, labels in nxt.items():
            rem = min(total_inv - sum(key[1]), (kmax - k) * g_max)
            kept = _pareto(labels, pr.pareto_eps, w_pre[key[0]] / rem if rem > 0 else 0.0)
            if len(kept) < len(labels):
                counter.add("pareto", len(labels) - len(kept))
            level[key] = kept
        if not level:
            break
    counter.add("bound", n_bound)
    return True


def plan_from_label(label: Label, inst: Instance) -> Plan:
    stages: list[Stage] = []
    lb: Label | None = label
    while lb is not None and lb.option is not None:
        o = lb.option
        stages.append(Stage(o.device, o.cfg, lb.start, lb.end, o.recompute))  # type: ignore[arg-type]
        lb = lb.parent
    return inst.make_plan(tuple(stages))


def families(family: str) -> list[Family]:
    if family == "both":
        return ["megatron", "hetero"]
    if family not in ("megatron", "hetero"):
        raise InfeasibleError(f"unknown family {family!r}; use megatron, hetero or both")
    return [family]  # type: ignore[list-item]


def solve_dp_reference(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    *,
    family: str = "both",
    pruning: Pruning | None = None,
    time_limit: float | None = None,
    instances: Iterable[Instance] | None = None,
    name: str = "dp-reference",
) -> Solution:
    t0 = time.perf_counter()
    deadline = t0 + time_limit if time_limit else None
    pr = pruning or Pruning()
    best = _Best()
    counter = PruneCounter()
    complete = True
    n_inst = 0
    insts = instances
    if insts is None:
        insts = [i for fam in families(family) for i in build_instances(model, cluster, settings, fam, pr)]
        # megatron first (its plans bound the hetero search), larger micro-batch steps first
        insts.sort(key=lambda i: (i.family != "megatron", -i.samples_per_mb))
    for inst in insts:
        n_inst += 1
        for rule, n in inst.counter.counts.items():
            counter.add(rule, n)
        for opts in sorted(groups(inst).values(), key=lambda g: -max(o.devices for o in g)):
            if not _solve_group(inst, opts, best, counter, deadline):
                complete = False
                break
        if not complete:
            break
    small = not (0 < pr.large_cluster < cluster.world_size)
    if complete and small and instances is None and pr.layer_band and pr.band_refine and best.label is not None:
        # The band is centred on estimated speeds and can cut the optimum when memory forces slower
        # options than the estimate assumed. Re-search without it, bounded by the plan just found (which
        # prunes most of the space) and by what is left of the time limit.
        free = replace(pr, layer_band=False)
        spent = time.perf_counter() - t0
        refine_deadline = time.perf_counter() + max(1.0, spent)
        if deadline is not None:
            refine_deadline = min(refine_deadline, deadline)
        for fam in families(family):
            for inst in build_instances(model, cluster, settings, fam, free):
                for opts in sorted(groups(inst).values(), key=lambda g: -max(o.devices for o in g)):
                    if not _solve_group(inst, opts, best, counter, refine_deadline):
                        counter.add("refine_timeout")
                        break
                if time.perf_counter() > refine_deadline:
                    break
    wall = time.perf_counter() - t0
    exact = pr == Pruning.off() or (
        not pr.layer_band
        and not pr.min_recompute
        and not pr.cross_type_comm
        and not pr.dominance
        and pr.max_stages <= 0
        and not pr.uniform_stage_size
        and pr.large_cluster <= 0
        and pr.pareto_eps == 0
    )
    if best.label is None or best.inst is None:
        status = "timeout" if not complete else "infeasible"
        return Solution(
            name,
            status,
            None,
            float("inf"),
            float("nan"),
            wall,
            counter.counts,
            message="" if not complete else "no plan satisfies memory and inventory",
        )
    plan = plan_from_label(best.label, best.inst)
    runner = plan_from_label(best.second_label, best.second_inst) if best.second_label and best.second_inst else None
    if complete:
        status = "optimal" if exact else "feasible"
    else:
        status = "timeout"
    bound = best.value if (complete and exact) else float("nan")
    return Solution(
        name,
        status,  # type: ignore[arg-type]
        plan,
        best.value,
        bound,
        wall,
        counter.counts,
        runner_up=runner,
        runner_up_s=best.second_value if runner else None,
        stats={"instances": n_inst, "exact_space": exact},
    )
