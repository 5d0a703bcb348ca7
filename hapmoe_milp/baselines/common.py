"""Small helpers every baseline adapter shares: building a :class:`Plan` under the run's settings,
scoring it truthfully, and the :class:`Solution` shapes for "found" and "nothing fits".

Nothing here prices anything: costs come from :mod:`hapmoe_milp.cost` (the estimate of a finished plan,
or the cost model's public per-layer pieces for the zebra model).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hapmoe_milp.config import Recompute, Settings
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.errors import PlanError
from hapmoe_milp.plan import Plan, Stage, check_plan
from hapmoe_milp.search.solution import Solution
from hapmoe_milp.specs.cluster import ClusterSpec, NodeGroup
from hapmoe_milp.specs.model import ModelSpec

# Solver name each baseline reports in its Solution (and the rows of compare_against).
SOLVER_NAMES = {"megatron": "megatron-uniform", "metis": "metis", "hetermoe": "hetermoe"}
# Recompute levels from cheapest to costliest: a planner that stops at the first level that fits
# never pays for more recomputation than it needs.
REC_ORDER: tuple[Recompute, ...] = ("none", "selective", "full")


def pow2_upto(n: int) -> list[int]:
    """1, 2, 4, ... up to ``n``."""
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def make_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    family: str,
    stages: Sequence[Stage],
    vpp: int = 1,
) -> Plan:
    """A plan for ``stages`` carrying every setting of the run (plans are self-contained)."""
    return Plan.from_settings(model, cluster, family, tuple(stages), settings, vpp=vpp)  # type: ignore[arg-type]


def is_valid(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> bool:
    """Whether ``plan`` passes the plan rules every exporter relies on."""
    try:
        check_plan(plan, model, cluster)
    except PlanError:
        return False
    return True


def infeasible(name: str, t0: float, message: str, **stats: Any) -> Solution:
    """The Solution of a baseline that found nothing that fits."""
    return Solution(
        name, "infeasible", None, math.inf, math.nan, time.perf_counter() - t0, message=message, stats=dict(stats)
    )


def stopped(
    name: str,
    t0: float,
    plan: Plan | None,
    candidates: int,
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
) -> Solution:
    """The Solution of a baseline whose search the time limit stopped: its best plan so far, or none."""
    msg = f"stopped by the time limit after {candidates} candidates"
    if plan is None:
        return Solution(name, "timeout", None, math.inf, math.nan, time.perf_counter() - t0, message=msg)
    sol = finish(name, model, cluster, settings, plan, t0, msg + "; the best plan so far", {"candidates": candidates})
    return replace(sol, status="timeout")


def finish(
    name: str,
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    plan: Plan,
    t0: float,
    message: str,
    stats: dict[str, Any],
) -> Solution:
    """Score ``plan`` truthfully (fresh cost model, real settings) and attach prediction + certificate."""
    check_plan(plan, model, cluster)
    est = estimate(model, cluster, plan, settings)
    sol = Solution(
        name,
        "feasible",
        plan,
        est.iteration_time_s,
        math.nan,
        time.perf_counter() - t0,
        message=message,
        stats={"fits": est.fits, "maps_to_plan": True, **stats},
    )
    return replace(sol, plan=plan.with_predicted(est.to_dict(), sol.certificate()))


def sub_cluster(cluster: ClusterSpec, did: str) -> ClusterSpec:
    """The devices of one type as a cluster of their own (what "homogeneous profiling" runs on)."""
    groups: tuple[NodeGroup, ...] = tuple(g for g in cluster.groups if g.device.id == did)
    return replace(cluster, name=f"{cluster.name}[{did}]", groups=groups)
