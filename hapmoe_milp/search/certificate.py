"""``auto``'s certificate: what it has found and proved so far, and the result it reports.

:func:`hapmoe_milp.search.exact.solve` with ``solver='auto'`` runs the pruned DP, then the exact backend
(per family at scale); this module holds the book it keeps while doing so (:class:`Certificate`: per family,
which method bounded it and how far) and the last step (:func:`finish`): the unpruned DP as a second proof
of what is not proved yet, then one :class:`~hapmoe_milp.search.solution.Solution` whose ``stats`` say
which method proved which family (``proved_by``, ``proof``) and how far the pruned DP's plan was from the
best plan and the bound. Kept apart from the exact search so that the proof's bookkeeping reads on its own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hapmoe_milp.config import Settings
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.search.solution import Solution
from hapmoe_milp.space import Pruning
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

if TYPE_CHECKING:  # the runtime is read through the instance; only its type is named here
    from hapmoe_milp.runtimes import Runtime


class Certificate:
    """What ``auto`` has found and proved so far: the best plan, and per family the method that bounded it
    and the bound (a family without an entry is not bounded yet)."""

    def __init__(self, dp: Solution, t0: float, time_limit: float | None) -> None:
        self.dp = dp
        self.best = dp
        self.t0 = t0
        self.limit = time_limit
        self.proof: dict[str, dict[str, Any]] = {}
        self.stats: dict[str, Any] = {"dp_status": dp.status, "dp_objective_s": dp.objective_s, "dp_wall_s": dp.wall_s}

    def left(self) -> float | None:
        return None if self.limit is None else self.limit - (time.perf_counter() - self.t0)

    def time_for(self, need: float) -> bool:
        rem = self.left()
        return rem is None or rem > need

    def offer(self, sol: Solution) -> None:
        if sol.plan is not None and (self.best.plan is None or sol.objective_s < self.best.objective_s):
            self.best = sol

    def prove(self, fam: str, method: str, sol: Solution, bound: float) -> None:
        """Record what ``method`` established for family ``fam``: a proof when ``sol`` completed (optimal,
        or nothing below the bound), else only a valid bound."""
        self.proof[fam] = {"method": method, "status": sol.status, "bound_s": bound, "wall_s": sol.wall_s}

    def proved(self, fam: str) -> bool:
        return self.proof.get(fam, {}).get("status") in ("optimal", "infeasible")


def finish(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    cert: Certificate,
    todo: str,
    off: Pruning,
    t0: float,
    pr: Pruning,
    cm: CostModel,
    runtimes: Mapping[str, Runtime | None] | None,
) -> Solution:
    """The unpruned DP as a second proof of the families not proved yet, then the certificate."""
    from hapmoe_milp.search.dp import families, solve_dp

    fams = list(families(todo))
    if not all(cert.proved(f) for f in fams) and cert.time_for(1.0):
        # the unpruned DP is exact over the instance: when it finishes, its optimum is the proof
        dx = solve_dp(
            model,
            cluster,
            settings,
            family=todo,
            pruning=off,
            time_limit=cert.left(),
            name="dp-exact",
            cost_model=cm,
            runtimes=runtimes,
        )
        cert.stats.update({"dp_exact_status": dx.status, "dp_exact_wall_s": dx.wall_s})
        cert.offer(dx)
        if dx.status == "infeasible" and cert.best.plan is None:
            return replace(dx, solver="auto", wall_s=time.perf_counter() - t0, stats={**dx.stats, **cert.stats})
        if dx.status in ("optimal", "infeasible"):
            for fam in fams:
                cert.prove(fam, "dp-exact", dx, dx.objective_s)
    all_fams = list(families("both")) if set(cert.proof) - set(fams) else fams
    proved = all(cert.proved(f) for f in all_fams)
    methods = sorted({cert.proof[f]["method"] for f in all_fams if f in cert.proof})
    stats = dict(cert.stats)
    if proved and len(methods) > 1:
        stats["proved_by"] = " + ".join(f"{cert.proof[f]['method']} ({f})" for f in all_fams)
    else:
        stats["proved_by"] = methods[0] if proved else None
    stats["proof"] = cert.proof
    stats["max_vpp"] = pr.max_vpp  # the space the certificate is about
    best, dp = cert.best, cert.dp
    wall = time.perf_counter() - t0
    bounds = [cert.proof[f]["bound_s"] if f in cert.proof else math.nan for f in all_fams]
    bound = min(bounds) if bounds and all(b == b for b in bounds) else math.nan
    if best.plan is None:
        return replace(best, solver="auto", status="timeout", bound_s=bound, wall_s=wall, stats={**best.stats, **stats})
    if proved:
        bound = min(bound, best.objective_s) if bound == bound else best.objective_s
    if dp.plan is not None:
        if best is not dp:
            stats["dp_gap_to_best"] = max(0.0, (dp.objective_s - best.objective_s) / dp.objective_s)
        if bound == bound:
            stats["dp_gap_to_bound"] = max(0.0, (dp.objective_s - bound) / dp.objective_s)
    return replace(
        best,
        solver="auto",
        status="optimal" if proved else "feasible",  # type: ignore[arg-type]
        bound_s=bound,
        wall_s=wall,
        pruned={**dp.pruned},
        stats={**best.stats, **stats},
    )


def union(kept: Solution, other: Solution) -> Solution:
    """``kept`` (the faster plan) as the answer over two disjoint spaces searched apart (the solve and an
    alternative, e.g. EP-communication overlap): its bound must hold over both, so it is the lesser of the
    two spaces' bounds (a space proved infeasible bounds nothing), and ``optimal`` stays only if the other
    space's bound does not fall below the plan. The DP's answers (no bound) are returned as they are."""
    if kept.plan is None or kept.solver == "dp" or other is kept:
        return kept
    theirs = math.inf if other.status == "infeasible" else other.bound_s
    both = theirs == theirs and kept.bound_s == kept.bound_s
    bound = min(kept.bound_s, theirs) if both else math.nan  # unbounded elsewhere: nothing proved over both
    proved = bound == bound and bound >= kept.objective_s * (1 - 1e-9)
    status = kept.status if kept.status != "optimal" or proved else "feasible"
    stats = {**kept.stats, "bound_over_both_spaces": bound == bound}
    return replace(kept, status=status, bound_s=bound, stats=stats)  # type: ignore[arg-type]


__all__ = ["Certificate", "finish", "union"]
