"""Python API: the same entry points the CLI uses."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from hapmoe_milp.config import Settings
from hapmoe_milp.cost.estimate import Estimate, estimate
from hapmoe_milp.errors import HapmoeError, InfeasibleError, SolverError
from hapmoe_milp.plan import Plan, check_plan
from hapmoe_milp.search.solution import Solution
from hapmoe_milp.space import Pruning
from hapmoe_milp.specs.catalog import Catalog
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

log = logging.getLogger(__name__)

SOLVERS = ("dp", "cpsat", "milp", "auto")
# Search time is a product feature: unless told otherwise, stop after a minute and return the best plan
# found (status "timeout" with its certificate) rather than keep the user waiting.
DEFAULT_TIME_LIMIT = 60.0


def resolve(
    model: ModelSpec | str, cluster: ClusterSpec | str, catalog: Catalog | None = None
) -> tuple[ModelSpec, ClusterSpec]:
    cat = catalog or Catalog()
    m = cat.model(model) if isinstance(model, str) else model
    c = cat.cluster(cluster) if isinstance(cluster, str) else cluster
    return m, c


def make_settings(model: ModelSpec, base: Settings | None = None, **kw: Any) -> Settings:
    """Settings with the model entry's defaults (sequence, global batch, dispatcher) where not given."""
    d = model.defaults
    s = base or Settings(
        seq_length=d.seq_length,
        global_batch_size=d.global_batch_size,
        micro_batch_size=d.micro_batch_size,
        dispatcher=d.moe_token_dispatcher_type,
    )
    clean = {k: v for k, v in kw.items() if v is not None}
    return replace(s, **clean) if clean else s


def finalize(sol: Solution, model: ModelSpec, cluster: ClusterSpec, settings: Settings) -> Solution:
    """Re-evaluate the plan with the cost model and attach the prediction and certificate."""
    if sol.plan is None:
        return sol
    check_plan(sol.plan, model, cluster)
    est = estimate(model, cluster, sol.plan, settings)
    pred = est.to_dict()
    plan = sol.plan.with_predicted(pred, sol.certificate())
    return replace(sol, plan=plan)


def solve(
    model: ModelSpec | str,
    cluster: ClusterSpec | str,
    solver: str = "dp",
    *,
    family: str = "both",
    settings: Settings | None = None,
    pruning: Pruning | None = None,
    time_limit: float | None = None,
    optimizer_offload: bool | str = "auto",
    catalog: Catalog | None = None,
    solver_options: dict[str, Any] | None = None,
    **settings_kw: Any,
) -> Solution:
    """Search for the fastest plan; raise InfeasibleError (with the tightest constraint) if none fits.

    ``optimizer_offload="auto"`` first searches with optimizer states on the device and, only if nothing
    fits, again with them offloaded to host memory (as HAPMoE does for Mixtral-L on small clusters).
    """
    m, c = resolve(model, cluster, catalog)
    st = make_settings(m, settings, **settings_kw)
    if solver not in SOLVERS:
        raise SolverError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}", field="--solver")
    if time_limit is None:
        time_limit = DEFAULT_TIME_LIMIT
    tries = [st]
    if optimizer_offload == "auto":
        if not st.optimizer_offload:
            tries.append(replace(st, optimizer_offload=True))
    else:
        tries = [replace(st, optimizer_offload=bool(optimizer_offload))]
    last: Solution | None = None
    t0 = time.perf_counter()
    for s in tries:
        # one time limit for the whole solve: the optimizer-offload retry gets what the first try left
        left = max(0.05, time_limit - (time.perf_counter() - t0)) if time_limit else time_limit
        sol = _run_solver(m, c, s, solver, family, pruning, left, solver_options or {})
        last = sol
        if sol.plan is not None:
            return finalize(sol, m, c, s)
        if sol.status == "timeout":
            break
    from hapmoe_milp.search.diagnose import diagnose
    from hapmoe_milp.search.dp import families

    assert last is not None
    if last.status == "timeout":
        raise InfeasibleError(f"{solver} found no plan within the time limit ({time_limit} s)", constraint="time")
    raise diagnose(m, c, tries[-1], families(family))


def _run_solver(
    m: ModelSpec,
    c: ClusterSpec,
    st: Settings,
    solver: str,
    family: str,
    pruning: Pruning | None,
    time_limit: float | None,
    options: dict[str, Any],
) -> Solution:
    from hapmoe_milp.search.dp import solve_dp

    if solver == "dp":
        return solve_dp(m, c, st, family=family, pruning=pruning, time_limit=time_limit)
    if solver in ("cpsat", "milp", "auto"):
        try:
            from hapmoe_milp.search import exact
        except ImportError as exc:  # pragma: no cover - until the exact solvers land
            raise SolverError(f"solver {solver!r} is not available: {exc}") from None
        return exact.solve(m, c, st, solver=solver, family=family, pruning=pruning, time_limit=time_limit, **options)
    raise SolverError(f"unknown solver {solver!r}")


def estimate_plan(
    model: ModelSpec | str,
    cluster: ClusterSpec | str,
    plan: Plan,
    *,
    settings: Settings | None = None,
    simulate: bool = False,
    catalog: Catalog | None = None,
    check: bool = True,
) -> Estimate:
    m, c = resolve(model, cluster, catalog)
    if check:
        check_plan(plan, m, c)
    return estimate(m, c, plan, settings, simulate_schedule=simulate)


__all__ = ["HapmoeError", "estimate_plan", "make_settings", "resolve", "solve"]
