"""``solver='auto'``: the pruned DP for a fast plan, an exact backend (or, at scale, the unpruned DP per
family) for the proof, and the certificate that says which method bounded which family.

It lives apart from :mod:`hapmoe_milp.search.exact` because it orchestrates searches rather than being
one: every proof it records comes from the exact search or the DP, unchanged.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hapmoe_milp.config import Settings
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.search import backends, certificate, exact
from hapmoe_milp.search.exact import EXACT_PRUNING, SCALE_DEVICES, _families
from hapmoe_milp.search.solution import Progress, Solution
from hapmoe_milp.space import Pruning
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

if TYPE_CHECKING:
    from hapmoe_milp.runtimes import Runtime


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


def solve_auto(
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
        ex = exact._solve_exact(  # looked up on the module, so a test can stand in for it
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


__all__ = ["solve_auto"]
