"""The pruned dynamic program over pipeline stages (the fast search mode).

Stages are placed from the last to the first. A state is (sub-problem, first layer of the placed suffix,
devices used per type, device type and size class of the stage just placed, device types seen). Counting
stages from the end makes the 1F1B in-flight count ``min(M, k)`` known when a stage is placed, so one
pass covers every pipeline depth; an interleaved (VPP) sub-problem fixes its depth ``P`` instead, since
Megatron's interleaved warm-up depends on it (:meth:`hapmoe_milp.instance.Instance.in_flight`).

The objective ``alpha*sum(tau) + beta*max(tau) + max(sync)`` has two max terms, which an additive
recurrence cannot carry; each state keeps the Pareto front of ``(sum, max tau, max sync)`` labels. With
every pruning switch off this is exact over the instance; a global upper bound (best plan so far) and
lower bounds on the layers still to place discard labels that cannot win.

Sub-problems are one family group of one instance (megatron: one mesh and recompute level, and for VPP
one virtual-stage count and depth; hetero: one CP / EP-on setting). Megatron sub-problems are searched
cheapest-bound first and skipped once their lower bound reaches the best plan; the first batch gives an
incumbent within milliseconds. The label loop itself is vectorised (:mod:`hapmoe_milp.search.dp_levels`);
the pure-Python original is kept in :mod:`hapmoe_milp.search.dp_reference` for tests.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from hapmoe_milp.config import Family, Settings
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.errors import InfeasibleError
from hapmoe_milp.instance import Instance, build_instances, groups
from hapmoe_milp.plan import Plan, Stage
from hapmoe_milp.search.dp_levels import Best, Chain, run_batch
from hapmoe_milp.search.dp_tables import F, InstanceArrays, SubProblem, build_batch, instance_arrays, kind_order
from hapmoe_milp.search.solution import Progress, ProgressEvent, Solution
from hapmoe_milp.space import PruneCounter, Pruning
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

log = logging.getLogger(__name__)

# megatron sub-problems per vectorised batch (each is a handful of options)
MEGATRON_BATCH = 512
# pruning rules that can cut the optimum when they fire (the others only remove what cannot win)
INEXACT_RULES = ("min_recompute", "cross_type_comm", "pareto_eps", "max_stages", "large_cluster")


def families(family: str) -> list[Family]:
    if family == "both":
        return ["megatron", "hetero"]
    if family not in ("megatron", "hetero"):
        raise InfeasibleError(f"unknown family {family!r}; use megatron, hetero or both")
    return [family]  # type: ignore[list-item]


def plan_from_chain(chain: Chain, inst: Instance) -> Plan:
    stages = tuple(Stage(o.device, o.cfg, s, e, o.recompute) for o, s, e in chain.stages)  # type: ignore[arg-type]
    return inst.make_plan(stages)


@dataclass
class _Run:
    """State of one solve: the incumbent, counters, the clock and the progress sink."""

    t0: float
    deadline: float | None
    limit: float | None
    progress: Progress | None
    best: Best = field(default_factory=Best)
    counter: PruneCounter = field(default_factory=PruneCounter)
    arrays: dict[int, InstanceArrays] = field(default_factory=dict)
    n_inst: int = 0
    batches: int = 0
    last_report: float = -1.0

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def report(self, phase: str, done: int, total: int, force: bool = False) -> None:
        if self.progress is None:
            return
        now = time.perf_counter()
        if not force and now - self.last_report < 0.2:
            return  # a few events per second at most
        self.last_report = now
        self.progress(ProgressEvent(phase, done, total, self.best.value, now - self.t0, self.limit))


def _vpp_subs(inst: Instance, opts: tuple, total: int, pr: Pruning) -> Iterator[SubProblem]:
    g = opts[0].devices
    for p in inst.vpp_depths():
        if p * g > total or (pr.max_stages > 0 and p > pr.max_stages):
            continue
        yield SubProblem(inst, opts, pp=p)


def _megatron_subs(inst: Instance, run: _Run, total: int) -> list[SubProblem]:
    """Sub-problems of one megatron instance with their lower bounds (vectorised over groups)."""
    pr = inst.pruning
    grp = list(groups(inst).values())
    if not grp:
        return []
    kinds_seq = inst.model.layer_kinds
    kinds = kind_order(kinds_seq)
    types = tuple(inst.cluster.inventory)
    key = id(inst.options)
    arr = run.arrays.get(key)
    if arr is None:
        arr = run.arrays[key] = instance_arrays(inst, kinds, types)
    counts = np.array([sum(1 for x in kinds_seq if x == k) for k in kinds], dtype=float)
    fb = arr.coef[:, :, F] + arr.coef[:, :, 1]  # (n, K) fwd+bwd per kind
    edges = arr.first[:, F] + arr.first[:, 1] + arr.last[:, F] + arr.last[:, 1]
    n = len(kinds_seq)
    a, b = inst.coefficients
    out: list[SubProblem] = []
    for opts in grp:
        idx = np.array([o.index for o in opts])
        total_t = float((fb[idx].min(axis=0) * counts).sum() + edges[idx].min())
        g = opts[0].devices
        if inst.vpp <= 1:
            p_max = min(n, total // g)
            if pr.max_stages > 0:
                p_max = min(p_max, pr.max_stages)
            if p_max < 1:
                continue
            out.append(SubProblem(inst, tuple(opts), 0, a * total_t + b * total_t / p_max))
        else:
            for sub in _vpp_subs(inst, tuple(opts), total, pr):
                out.append(replace(sub, lb=a * total_t + b * total_t / sub.pp))
    out.sort(key=lambda s: s.lb)
    return out


def _search_subs(subs: list[SubProblem], run: _Run, *, band: bool, batch_size: int, deadline: float | None) -> bool:
    """Search sub-problems in order, in batches; skip those whose bound cannot beat the incumbent."""
    i = 0
    while i < len(subs):
        if deadline is not None and time.perf_counter() > deadline:
            return False
        chunk = []
        while i < len(subs) and len(chunk) < batch_size:
            if subs[i].lb < run.best.value:
                chunk.append(subs[i])
            else:
                run.counter.add("bound")
            i += 1
        if not chunk:
            continue
        batch = build_batch(chunk, run.arrays, band=band)
        run.batches += 1
        if not run_batch(batch, run.best, run.counter, deadline):
            return False
    return True


def _instances(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    fam: Family,
    pr: Pruning,
    cm: CostModel,
) -> Iterator[Instance]:
    """The family's instances, largest micro-batch step first (fewest micro-batches, usually fastest)."""
    built = list(build_instances(model, cluster, settings, fam, pr, cm, max_vpp=pr.max_vpp if fam == "megatron" else 1))
    built.sort(key=lambda i: (-i.samples_per_mb, i.vpp))
    yield from built


def solve_dp(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    *,
    family: str = "both",
    pruning: Pruning | None = None,
    time_limit: float | None = None,
    instances: Iterable[Instance] | None = None,
    name: str = "dp",
    progress: Progress | None = None,
) -> Solution:
    """Search every plan of the DP's space; anytime: ``time_limit`` covers the whole call, building included.

    The status says how far the answer is proven: ``optimal`` when the search completed and no rule that
    can cut the optimum fired (``stats["cut_by"]`` is empty), ``feasible`` when it completed but such a
    rule fired (``cut_by`` names them), ``timeout`` when the clock stopped it (the best plan so far).
    """
    t0 = time.perf_counter()
    deadline = t0 + time_limit if time_limit else None
    pr = pruning or Pruning()
    run = _Run(t0, deadline, time_limit, progress)
    complete = True
    total_dev = sum(cluster.inventory.values())
    cm = CostModel(model, cluster, settings)
    fams = families(family) if instances is None else []
    given = list(instances) if instances is not None else []
    searched: list[Instance] = []
    hetero_subs: list[SubProblem] = []
    megatron_all: list[SubProblem] = []
    stopped = False
    # megatron first: its plans bound the hetero search (and its first batch is an incumbent in ms)
    sources: list[tuple[Family, Iterable[Instance]]] = [(f, _instances(model, cluster, settings, f, pr, cm)) for f in fams]
    if given:
        sources = [("megatron", [i for i in given if i.family == "megatron"]), ("hetero", [i for i in given if i.family == "hetero"])]
    early = False
    done_early: set[int] = set()
    for fam, insts in sources:
        for inst in insts:
            if run.out_of_time():
                stopped = True
                break
            run.n_inst += 1
            searched.append(inst)
            if inst.vpp <= 1:
                for rule, n in inst.counter.counts.items():
                    run.counter.add(rule, n)
            if fam == "megatron":
                subs = _megatron_subs(inst, run, total_dev)
                megatron_all.extend(subs)
                if not early and inst.vpp <= 1 and subs:
                    # an incumbent right away: the most promising sub-problems of the first instance
                    early = True
                    first = subs[:MEGATRON_BATCH]
                    done_early = {id(x) for x in first}
                    if not _search_subs(first, run, band=True, batch_size=MEGATRON_BATCH, deadline=deadline):
                        stopped = True
                        break
            else:
                hetero_subs.extend(SubProblem(inst, tuple(o)) for o in groups(inst).values())
            run.report("build", run.n_inst, 0)
        if stopped:
            break
        if fam == "megatron" and megatron_all:
            # every megatron sub-problem, cheapest bound first, skipped once the bound reaches the best
            megatron_all.sort(key=lambda s: s.lb)
            rest = [x for x in megatron_all if id(x) not in done_early]
            if not _search_subs(rest, run, band=True, batch_size=MEGATRON_BATCH, deadline=deadline):
                stopped = True
                break
            run.report("dp", 1, 2, force=True)
    if not stopped and hetero_subs:
        # all hetero instances in one vectorised batch: each level extends every instance's states
        if not _search_subs(hetero_subs, run, band=True, batch_size=len(hetero_subs), deadline=deadline):
            stopped = True
    complete = not stopped
    run.report("dp", run.n_inst, run.n_inst, force=True)

    refined = False
    small = not (0 < pr.large_cluster < cluster.world_size)
    if complete and small and instances is None and pr.layer_band and pr.band_refine and run.best.chain is not None:
        # The band is centred on estimated speeds and can cut the optimum when memory forces slower
        # options than the estimate assumed. Re-search without it, bounded by the plan just found (which
        # prunes most of the space) and by as much time again as the first pass took.
        spent = time.perf_counter() - t0
        refine_deadline = time.perf_counter() + max(1.0, spent)
        if deadline is not None:
            refine_deadline = min(refine_deadline, deadline)
        ok = _search_subs(megatron_all, run, band=False, batch_size=MEGATRON_BATCH, deadline=refine_deadline)
        if ok and hetero_subs:
            ok = _search_subs(hetero_subs, run, band=False, batch_size=len(hetero_subs), deadline=refine_deadline)
        refined = ok
        if not ok:
            run.counter.add("refine_timeout")
        run.report("refine", 1, 1, force=True)
    wall = time.perf_counter() - t0
    counts = run.counter.counts
    exact_space = pr == Pruning.off() or (
        not pr.layer_band
        and not pr.min_recompute
        and not pr.cross_type_comm
        and pr.max_stages <= 0
        and not pr.uniform_stage_size
        and pr.large_cluster <= 0
        and pr.pareto_eps == 0
    )
    cut_by = [r for r in INEXACT_RULES if counts.get(r, 0) > 0]
    if pr.layer_band and counts.get("layer_band", 0) > 0 and not refined:
        cut_by.insert(0, "layer_band")
    if pr.uniform_stage_size:
        cut_by.append("uniform_stage_size")
    stats = {"instances": run.n_inst, "batches": run.batches, "exact_space": exact_space, "cut_by": cut_by}
    best = run.best
    if best.chain is None or best.sub is None:
        status = "timeout" if not complete else "infeasible"
        return Solution(
            name,
            status,
            None,
            float("inf"),
            float("nan"),
            wall,
            counts,
            stats=stats,
            message="" if not complete else "no plan satisfies memory and inventory",
        )
    plan = plan_from_chain(best.chain, best.sub.inst)  # type: ignore[attr-defined]
    runner = None
    if best.second_chain is not None and best.second_sub is not None:
        runner = plan_from_chain(best.second_chain, best.second_sub.inst)  # type: ignore[attr-defined]
    if not complete:
        status = "timeout"
    else:
        status = "optimal" if not cut_by else "feasible"
    bound = best.value if status == "optimal" else float("nan")
    if math.isfinite(bound):
        stats["proof"] = "optimal over the DP's space"
    return Solution(
        name,
        status,  # type: ignore[arg-type]
        plan,
        best.value,
        bound,
        wall,
        counts,
        runner_up=runner,
        runner_up_s=best.second_value if runner else None,
        stats=stats,
    )


__all__ = ["families", "plan_from_chain", "solve_dp"]
