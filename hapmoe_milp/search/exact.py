"""Exact solvers over the shared instance: decomposition, time slicing and the certificate.

The model itself is :mod:`hapmoe_milp.search.formulation` (arcs, cuts, and why each is valid); the
backends translate it (:mod:`hapmoe_milp.search.backends`). This module decides what to solve, in which
order, and what has been proved (``auto``'s book of proofs and the certificate it reports:
:mod:`hapmoe_milp.search.certificate`).

Space. The exact solvers search what the DP searches: the instances of ``build_instances`` with the
same ``max_vpp`` (``pruning.max_vpp``; :data:`EXACT_PRUNING` keeps the default 8), so the megatron family
includes interleaved (VPP) plans, and ``auto``'s certificate (exact backend or unpruned DP) is about
that one space (``stats['max_vpp']``).

Decomposition. An instance (one micro-batch step and schedule) splits into sub-problems per family
group key (``split='group'``, default: the mesh for ``megatron``, the same CP and "EP on or off" for
``hetero``; ``split='instance'`` keeps one sub-problem per instance with group-selection booleans), and
each sub-problem splits into one model per allowed pipeline depth ``P`` (``SubProblem.depths``: every
depth up to the stage caps, interleaved only Megatron's). Fixing the depth makes every slot's in-flight
count (interleaved: it grows with ``P``), edges and first-stage rule constants, so arcs carry exact
times and memory, and it is what lets the covering (suffix) bounds see the integrality of the layer
counts.

Best-first search with a shared incumbent (:mod:`hapmoe_milp.search.best_first`): every node (a
sub-problem, then a depth) carries a valid lower bound, the smallest goes next, a node whose bound
reaches the incumbent is closed without a model, and the global bound is the minimum over open nodes,
valid whatever the time limit. A cold start (no plan handed in) takes its first plan from a small depth
model, which a backend proves in milliseconds (that module says why this changes only the order).

At scale (more than :data:`SCALE_DEVICES` devices). A split sub-problem's depths start from their block
bounds (:mod:`hapmoe_milp.search.block_bounds`) under the incumbent, the depths those leave open get the
exact-layer range bounds (:mod:`hapmoe_milp.search.range_bounds`: a threshold DP that prices every
stage at its own range and p2p, a few seconds on a sub-problem), and those that reach it are closed
without a model; ``auto`` proves the megatron family with the unpruned DP first (its tens of thousands of
one-mesh sub-problems are what the DP is fast at; also when the megatron family is the whole space, as
in the EP-overlap alternative, where the exact backend is then not run at all), so the backend only has
to show that no hetero plan beats the best plan found, and the certificate says which method bounded
which family.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hapmoe_milp.config import Settings
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.deadline import Deadline, TimeLimitReached
from hapmoe_milp.instance import Instance, build_instances, group_keys
from hapmoe_milp.plan import Plan
from hapmoe_milp.search import backends, certificate
from hapmoe_milp.search.best_first import Node, Search
from hapmoe_milp.search.formulation import (
    SubProblem,
    assignment_of,
    evaluate_assignment,
    plan_of,
    subproblems,
)
from hapmoe_milp.search.solution import Progress, Solution
from hapmoe_milp.space import PruneCounter, Pruning
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

if TYPE_CHECKING:  # the runtime is read through the instance; only its type is named here
    from hapmoe_milp.runtimes import Runtime

log = logging.getLogger(__name__)

#: The exact solvers' default space: every pruning switch off except option dominance, which only drops
#: an option that another option of the same device, size, CP, EP-on/off, DP and recompute level beats
#: or ties in every coefficient (so it never changes the optimum; tests/test_search_dp.py pins that).
EXACT_PRUNING = replace(Pruning.off(), dominance=True)

#: Clusters with more devices than this are "at scale": plain hetero sub-problems get the block bounds
#: (:mod:`hapmoe_milp.search.block_bounds`) before any depth model is built, and ``auto`` proves the
#: megatron family with the unpruned DP (tens of thousands of tiny sub-problems, which it searches in a
#: few seconds) and hands only the hetero family to the exact backend. Below it (HAPMoE's Table 1) the
#: depth models alone prove the optimum in seconds.
SCALE_DEVICES = 64

#: The certificate's book under its name before it moved to :mod:`~hapmoe_milp.search.certificate`
#: (tests patch it here).
_Certificate = certificate.Certificate


def _families(family: str) -> list[str]:
    from hapmoe_milp.search.dp import families

    return list(families(family))


def solve(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    *,
    solver: str = "cpsat",
    family: str = "both",
    pruning: Pruning | None = None,
    time_limit: float | None = None,
    threads: int | None = None,
    relative_gap: float | None = None,
    backend: str | None = None,
    hint: Plan | Solution | None = None,
    instances: Iterable[Instance] | None = None,
    split: str | None = None,
    progress: Progress | None = None,
    cost_model: CostModel | None = None,
    runtimes: Mapping[str, Runtime | None] | None = None,
    **options: Any,
) -> Solution:
    """Solve every instance x group x depth exactly and keep the best plan, with a proven bound.

    ``solver='auto'`` runs the pruned DP first (``pruning`` applies to it), then ``backend`` (CP-SAT by
    default; ``backend='milp'`` for the MILP) over the exact space warm-started from the DP plan, and,
    if that did not prove optimality and time is left, the unpruned DP as a second proof; the result
    says which one proved it (``stats['proved_by']``); all three search plans with up to
    ``pruning.max_vpp`` virtual chunks (``stats['max_vpp']``). ``pruning`` defaults to
    :data:`EXACT_PRUNING` for the exact solvers; its ``max_vpp`` bounds their interleaved instances as it
    bounds the DP's. ``backend`` selects the MILP solver (``highs`` default, ``cbc``) for
    ``solver='milp'``. ``split`` is ``'group'`` (default) or ``'instance'``. ``progress`` is called per
    depth model (at most every 0.2 s). ``cost_model``: shared with other searches of this model and
    cluster (``auto``'s runs share one). ``runtimes`` maps a family to the runtime whose rules its plans
    must meet (as for the DP). Extra ``options`` go to the backend (e.g. ``resolution_s``).
    """
    # what both paths take alike; ``auto`` has no hint or instances (its DP makes the hint)
    common: dict[str, Any] = dict(
        family=family,
        pruning=pruning,
        time_limit=time_limit,
        threads=threads,
        relative_gap=relative_gap,
        backend=backend,
        split=split,
        progress=progress,
        cost_model=cost_model,
        runtimes=runtimes,
    )
    if solver == "auto":
        return _solve_auto(model, cluster, settings, **common, **options)
    return _solve_exact(model, cluster, settings, solver=solver, hint=hint, instances=instances, **common, **options)


def _solve_exact(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    *,
    solver: str,
    family: str,
    pruning: Pruning | None,
    time_limit: float | None,
    threads: int | None,
    relative_gap: float | None,
    backend: str | None,
    hint: Plan | Solution | None,
    instances: Iterable[Instance] | None,
    split: str | None,
    progress: Progress | None,
    upper_bound: float = math.inf,
    block_bounds: bool | None = None,
    cost_model: CostModel | None = None,
    runtimes: Mapping[str, Runtime | None] | None = None,
    **options: Any,
) -> Solution:
    """The best-first search of the module doc. ``upper_bound``: a plan value known from elsewhere (e.g.
    another family's proven optimum) that this search only has to beat; with nothing below it the result
    is "infeasible" with that value as its bound. ``block_bounds``: bound plain hetero sub-problems by
    :class:`BlockBounds` before their depth models (None: on clusters above :data:`SCALE_DEVICES`)."""
    t0 = time.perf_counter()
    mod = backends.get(solver)  # the first use imports the solver library: inside the time limit
    deadline = t0 + time_limit if time_limit else None
    pr = pruning or EXACT_PRUNING
    fams = _families(family)
    cm = cost_model.for_settings(settings) if cost_model is not None else CostModel(model, cluster, settings)
    counter = PruneCounter()
    block = cluster.world_size > SCALE_DEVICES if block_bounds is None else bool(block_bounds)
    search = Search(solver, mod, deadline, progress, block)
    search.best_val = upper_bound
    # building the sub-problems counts against the time limit too (minutes on 2,048 devices otherwise)
    clock = Deadline.after(time_limit, t0)
    try:
        insts = (
            list(instances)
            if instances is not None
            else [
                i
                for fam in fams
                for i in clock.each(
                    build_instances(
                        model,
                        cluster,
                        settings,
                        fam,  # type: ignore[arg-type]
                        pr,
                        cm,
                        max_vpp=pr.max_vpp,
                        runtime=(runtimes or {}).get(fam),
                    ),
                    "building the instances",
                )
            ]
        )
        subs: list[SubProblem] = []
        shared: dict[tuple, SubProblem] = {}  # interleaved copies share their base instance's sub-problem data
        for inst in insts:
            for rule, cnt in inst.counter.counts.items():
                counter.add(rule, cnt)
            keys = group_keys(inst)
            parts = [[k] for k in keys] if (split or "group") == "group" else [keys]
            subs.extend(subproblems(inst, parts, shared, deadline=clock))
    except TimeLimitReached as exc:
        wall = time.perf_counter() - t0
        stats = {"pruning": pr.to_dict(), "max_vpp": pr.max_vpp, "stopped_while": exc.what}
        return Solution(
            solver, "timeout", None, math.inf, math.nan, wall, counter.counts, stats=stats, message=str(exc)
        )
    warm = _push_roots(search, subs, hint.plan if isinstance(hint, Solution) else hint)
    solve_kw = {"threads": threads, "relative_gap": relative_gap, "backend": backend, **options}
    search.run(solve_kw)
    search.emit(force=True)
    stats: dict[str, Any] = {
        "instances": len(insts),
        "subproblems": len(subs),
        **search.counts,
        "unmodelled": len(search.unmodelled),
        "relaxed_open": len(search.relaxed),
        "max_arcs": search.max_arcs,
        "pruning": pr.to_dict(),
        "max_vpp": pr.max_vpp,  # the space searched: plain and interleaved plans up to this many chunks
        "warm_start": warm,
        **mod.describe_scaling(options),
    }
    if block:
        stats["block_bounds_s"] = search.block_s
        stats["range_bounds_s"] = search.range_s
    msgs = (
        f"{solver}: no plan of this space beats {upper_bound:.6g} s",
        f"{solver} found no plan within the time limit ({time_limit} s)",
    )
    return _result(
        search, stats, counter, upper_bound, time.perf_counter() - t0, msgs, (model, cluster, settings, fams, clock)
    )


def _push_roots(search: Search, subs: list[SubProblem], hint_plan: Plan | None) -> bool:
    """One node per sub-problem at its root bound; the hint plan (if it is in one of them and fits)
    becomes the incumbent and that node's hint. True if the hint was used (a warm start)."""
    warm = False
    roots = []
    for sp in subs:
        node = Node(sp, None, sp.quick_bound)
        if hint_plan is not None and not warm:
            a = assignment_of(sp, hint_plan)
            if a is not None:
                val, fits = evaluate_assignment(sp, a)
                if fits:
                    node.hint = a
                    warm = True
                    if val < search.best_val:
                        search.best_val, search.best_plan = val, plan_of(sp, a)
        roots.append(node)
    if hint_plan is not None and not warm:
        log.info("warm start: the hint plan is not in the %s space; solving without it", search.solver)
    for node in roots:
        search.push(node)
    return warm


def _result(
    search: Search,
    stats: dict[str, Any],
    counter: PruneCounter,
    upper_bound: float,
    wall: float,
    msgs: tuple[str, str],
    problem: tuple[ModelSpec, ClusterSpec, Settings, list[str], Deadline],
) -> Solution:
    """The search's answer: its best plan and global bound, or why there is none (nothing below the upper
    bound, infeasible -- with the DP's diagnosis -- or out of time)."""
    solver = search.solver
    open_nodes = [n for n in search.nodes if not n.closed]
    complete = not open_nodes
    bound = search.global_bound()
    stats["open"] = len(open_nodes)
    if search.tolerance_s:
        stats["tolerance_s"] = search.tolerance_s  # worst-case scaling error of a returned "optimal" plan
    if search.resolution_s:
        stats["time_resolution_s"] = search.resolution_s
    if search.best_plan is None:
        status = "infeasible" if complete else "timeout"
        if complete and math.isfinite(upper_bound):
            msg = msgs[0]
        elif complete:
            model, cluster, settings, fams, clock = problem
            msg = _infeasible_message(model, cluster, settings, fams, Deadline.after(max(1.0, clock.left())))
        else:
            msg = msgs[1]
        return Solution(
            solver,
            status,  # type: ignore[arg-type]
            None,
            math.inf,
            upper_bound if complete else bound,
            wall,
            counter.counts,
            stats=stats,
            message=msg,
        )
    status = "optimal" if complete else "feasible"
    if complete:
        stats["proved_by"] = solver
    return Solution(solver, status, search.best_plan, search.best_val, bound, wall, counter.counts, stats=stats)  # type: ignore[arg-type]


def _infeasible_message(
    model: ModelSpec, cluster: ClusterSpec, settings: Settings, fams: list[str], deadline: Deadline
) -> str:
    """The same message the DP path gives (``diagnose``), so every solver explains infeasibility alike."""
    from hapmoe_milp.search.diagnose import diagnose

    return str(diagnose(model, cluster, settings, fams, deadline))  # type: ignore[arg-type]


def _megatron_by_dp(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    cert: certificate.Certificate,
    off: Pruning,
    cm: CostModel,
    runtimes: Mapping[str, Runtime | None] | None,
) -> Solution:
    """The megatron family proved by the unpruned DP (its sub-problems are tiny and many at scale), so the
    exact backend is left with the hetero family; the proof is recorded on ``cert`` only if it closed."""
    from hapmoe_milp.search.dp import solve_dp

    dm = solve_dp(
        model,
        cluster,
        settings,
        family="megatron",
        pruning=off,
        time_limit=cert.left(),
        name="dp-exact",
        cost_model=cm,
        runtimes=runtimes,
    )
    cert.offer(dm)
    if dm.status in ("optimal", "infeasible"):
        cert.prove("megatron", "dp-exact", dm, dm.objective_s)
    return dm


def _solve_auto(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    *,
    family: str,
    pruning: Pruning | None,
    time_limit: float | None,
    threads: int | None,
    relative_gap: float | None,
    backend: str | None,
    split: str | None,
    progress: Progress | None,
    split_families: bool | None = None,
    cost_model: CostModel | None = None,
    runtimes: Mapping[str, Runtime | None] | None = None,
    **options: Any,
) -> Solution:
    """A certificate: the pruned DP for a fast plan, the exact backend for the proof, the unpruned DP as
    a second proof if the first did not close in time -- all over plans with up to ``max_vpp`` chunks.

    At scale (``split_families``; default: more than :data:`SCALE_DEVICES` devices) the families are
    proved apart: the unpruned DP proves the megatron family's optimum (its sub-problems are tiny and
    many), then the exact backend only has to show that no hetero plan beats the best plan so far (with
    the block bounds); ``stats['proof']`` says which method bounded which family.
    """
    from hapmoe_milp.search.dp import solve_dp

    t0 = time.perf_counter()
    pr = pruning or Pruning()
    exact_pr = replace(EXACT_PRUNING, max_vpp=pr.max_vpp)
    off = replace(Pruning.off(), max_vpp=pr.max_vpp)
    cm = cost_model.for_settings(settings) if cost_model is not None else CostModel(model, cluster, settings)
    dp = solve_dp(
        model,
        cluster,
        settings,
        family=family,
        pruning=pr,
        time_limit=time_limit,
        progress=progress,
        cost_model=cm,
        runtimes=runtimes,
    )
    cert = certificate.Certificate(dp, t0, time_limit)
    fams = _families(family)
    apart = cluster.world_size > SCALE_DEVICES if split_families is None else split_families
    todo = family
    if apart and "megatron" in fams:
        dm = _megatron_by_dp(model, cluster, settings, cert, off, cm, runtimes)
        if dm.status in ("optimal", "infeasible"):
            todo = "hetero"
    exact_solver = backend if backend in backends.NAMES else "cpsat"
    if todo == "hetero" and "hetero" not in fams:  # the megatron family alone, proved by the unpruned DP
        if cert.best.plan is None:  # the unpruned DP proved that nothing fits
            return replace(dm, solver="auto", wall_s=time.perf_counter() - t0, stats={**dm.stats, **cert.stats})
        return certificate.finish(model, cluster, settings, cert, "megatron", off, t0, pr, cm, runtimes)
    if cert.time_for(0.5):
        upper = cert.best.objective_s if todo != family and cert.best.plan is not None else math.inf
        ex = _solve_exact(
            model,
            cluster,
            settings,
            solver=exact_solver,
            family=todo,
            pruning=exact_pr,
            time_limit=cert.left(),
            threads=threads,
            relative_gap=relative_gap,
            backend=None if backend in backends.NAMES else backend,
            hint=cert.best.plan,
            instances=None,
            split=split,
            progress=progress,
            upper_bound=upper,
            cost_model=cm,
            runtimes=runtimes,
            **options,
        )
        cert.stats.update({f"exact_{k}": v for k, v in ex.stats.items() if isinstance(v, (int, float, str, bool))})
        cert.stats.update({"exact_solver": exact_solver, "exact_status": ex.status, "exact_wall_s": ex.wall_s})
        cert.offer(ex)
        if ex.status == "infeasible" and cert.best.plan is None:
            return replace(ex, solver="auto", wall_s=time.perf_counter() - t0, stats={**ex.stats, **cert.stats})
        for fam in _families(todo):  # a proof, or (time out) a bound the unpruned DP may still beat
            cert.prove(fam, exact_solver, ex, ex.bound_s)
    else:
        cert.stats["exact"] = "no time left"
    return certificate.finish(model, cluster, settings, cert, todo, off, t0, pr, cm, runtimes)


__all__ = ["EXACT_PRUNING", "solve"]
