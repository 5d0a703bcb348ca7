"""Cross-validation of the solvers on one problem: the product feature behind ``hapmoe-milp compare``.

All solvers read the same instances, so on one (model, cluster, settings, family) every exact solver
that finishes must reach the same optimum, every proven bound must sit below every plan's objective, and
the pruned DP's distance to the best proven bound is the price of its pruning. When some solver proves
optimality, the report names the proven optimum and the DP's distance to it. Where two plans differ,
the stage-by-stage diff shows how (ties between different plans are common: recompute levels that cost
the same time, mirrored layer splits).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from hapmoe_milp.config import EXACT_SOLVERS, Settings
from hapmoe_milp.deadline import NO_DEADLINE, Deadline, TimeLimitReached
from hapmoe_milp.errors import SolverError
from hapmoe_milp.instance import build_instances, groups
from hapmoe_milp.plan import Plan
from hapmoe_milp.search.solution import Solution
from hapmoe_milp.space import Pruning
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

log = logging.getLogger(__name__)

#: What ``compare`` runs: the product solvers plus ``dp-exact`` (the DP with every pruning switch off).
SOLVERS = ("dp", "dp-exact", *EXACT_SOLVERS)
#: Rough size of the unpruned DP (layers^2 x slots x largest group x device-usage states / 2) above
#: which it is not attempted. Measured on a 2-core machine (its bounds prune most of that space):
#: Mixtral-S 16-1 1.4e8 -> 4 s, 24-1 7.5e8 -> 14 s, 32-3 1.8e9 -> 9 s; Mixtral-L 16-1 5.7e8 -> 17 s,
#: 32-3 9.4e9 -> 146 s. The default keeps it to about a minute or two.
DP_EXACT_MAX_WORK = 5e9
#: Relative tolerance every comparison allows on top of the solvers' own stated tolerances.
FLOAT_TOLERANCE = 1e-9


def dp_exact_work(
    model: ModelSpec, cluster: ClusterSpec, settings: Settings, family: str, deadline: Deadline = NO_DEADLINE
) -> float:
    """Estimated work of the unpruned DP (see :data:`DP_EXACT_MAX_WORK`), to decide whether to run it.

    Raises :class:`~hapmoe_milp.deadline.TimeLimitReached` when ``deadline`` passes while it counts (on
    thousands of devices counting alone takes seconds)."""
    from hapmoe_milp.search.dp import families

    n = len(model.layer_kinds)
    inv = cluster.inventory
    states = math.prod(v + 1 for v in inv.values())
    k = min(n, sum(inv.values()))
    work = 0.0
    pr = Pruning.off()
    for fam in families(family):
        for inst in deadline.each(build_instances(model, cluster, settings, fam, pr, max_vpp=pr.max_vpp), "sizing"):
            biggest = max((len(g) for g in groups(inst).values()), default=0)
            # an interleaved instance is searched at its allowed depths only (the deepest sets the slots)
            slots = k if inst.vpp <= 1 else max((p for p in inst.vpp_depths() if p <= k), default=0)
            work += n * n * slots * biggest * states / 2
    return work


def plan_diff(ref: Plan, other: Plan) -> list[dict[str, Any]]:
    """Stage-by-stage differences (by pipeline position) between two plans; empty when identical."""
    rows = []
    for i in range(max(ref.pp, other.pp)):
        a = ref.stages[i] if i < ref.pp else None
        b = other.stages[i] if i < other.pp else None
        if a != b:
            rows.append({"stage": i, "reference": a and a.label(), "other": b and b.label()})
    if ref.num_microbatches != other.num_microbatches:
        rows.append({"stage": "M", "reference": ref.num_microbatches, "other": other.num_microbatches})
    return rows


def _tolerance(sol: Solution) -> float:
    """The absolute tolerance a solver states for its objective (scaling for CP-SAT, MIP gap for MILP)."""
    tol = float(sol.stats.get("tolerance_s", 0.0) or 0.0)
    gap = sol.stats.get("relative_gap")
    if gap is None and sol.solver == "milp":
        from hapmoe_milp.search.milp import DEFAULT_GAP

        gap = DEFAULT_GAP
    if gap and math.isfinite(sol.objective_s):
        tol = max(tol, float(gap) * sol.objective_s)
    return tol


def _run(
    name: str,
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    family: str,
    time_limit: float | None,
    hint: Plan | None,
    options: dict[str, Any],
) -> Solution | str:
    from hapmoe_milp.search import exact
    from hapmoe_milp.search.dp import solve_dp

    # every solver searches the same space: plain and interleaved plans up to Pruning's max_vpp
    if name == "dp":
        return solve_dp(model, cluster, settings, family=family, pruning=Pruning(), time_limit=time_limit)
    if name == "dp-exact":
        try:
            work = dp_exact_work(model, cluster, settings, family, Deadline.after(time_limit))
        except TimeLimitReached:
            return "skipped: its time ran out while sizing the instance for the unpruned DP"
        limit = float(options.get("dp_exact_max_work", DP_EXACT_MAX_WORK))
        if work > limit:
            return f"skipped: instance too large for the unpruned DP (~{work:.1e} transitions > {limit:.0e})"
        sol = solve_dp(
            model,
            cluster,
            settings,
            family=family,
            pruning=Pruning.off(),
            time_limit=time_limit,
            name="dp-exact",
        )
        return sol
    if name in EXACT_SOLVERS:
        kw = {k: v for k, v in options.items() if k != "dp_exact_max_work"}
        return exact.solve(
            model,
            cluster,
            settings,
            solver=name,
            family=family,
            time_limit=time_limit,
            hint=hint if name != "auto" else None,
            **kw,
        )
    raise SolverError(f"unknown solver {name!r} for compare; choose from {', '.join(SOLVERS)}")


def compare_solvers(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    *,
    solvers: Sequence[str] = ("dp", "dp-exact", "cpsat", "milp"),
    time_limit: float | None = 60.0,
    family: str = "both",
    warm_start: bool = False,
    budget_s: float | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Run each solver on the same problem and cross-check them.

    ``time_limit`` caps each solver; ``budget_s`` (the CLI's ``--time-limit``) bounds the whole call: each
    solver gets an equal share of what the ones before it left (a fast DP leaves its share to the rest).

    Returns ``results`` (one row per solver: status, objective, bound, gap, wall time, stated tolerance,
    plan summary, message), ``agree`` (every pair of *optimal* results within their stated tolerances;
    None when fewer than two are optimal), ``consistent`` (no proven bound above any plan's objective),
    ``best_objective_s``/``best_bound_s``, ``dp_gap`` (pruned DP to the best proven bound) and ``diffs``
    (stage-by-stage against the best plan, for every plan that differs). ``warm_start`` hands the pruned
    DP's plan to the exact solvers (faster, but then they are no longer independent of the DP).
    """
    for name in solvers:
        if name not in SOLVERS:
            raise SolverError(f"unknown solver {name!r} for compare; choose from {', '.join(SOLVERS)}")
    clock = Deadline.after(budget_s)
    sols, results = _run_all(model, cluster, settings, solvers, family, time_limit, warm_start, options, clock)
    if any(r["status"] == "infeasible" for r in results):
        from hapmoe_milp.search.diagnose import diagnose
        from hapmoe_milp.search.dp import families

        why = str(diagnose(model, cluster, settings, families(family), Deadline.after(max(1.0, clock.left()))))
        for r in results:
            if r["status"] == "infeasible":
                r["message"] = why  # one explanation for every solver
    with_plan = {k: s for k, s in sols.items() if s.plan is not None and math.isfinite(s.objective_s)}
    best_obj = min((s.objective_s for s in with_plan.values()), default=math.inf)
    bounds = [s.bound_s for s in sols.values() if s.bound_s == s.bound_s and s.bound_s is not None]
    best_bound = max((b for b in bounds if math.isfinite(b)), default=math.nan)
    optimal = {k: s for k, s in with_plan.items() if s.status == "optimal"}
    dp = sols.get("dp")
    dp_gap = math.nan
    if dp is not None and dp.plan is not None and best_bound == best_bound:
        dp_gap = max(0.0, (dp.objective_s - best_bound) / dp.objective_s)
    # the proven optimum: the best plan of a solver that proved optimality (exact solvers, dp-exact)
    proven = {k: s for k, s in optimal.items() if k != "dp"}
    proven_opt = min((s.objective_s for s in proven.values()), default=math.nan)
    dp_distance = math.nan
    if dp is not None and dp.plan is not None and proven_opt == proven_opt:
        dp_distance = (dp.objective_s - proven_opt) / proven_opt
    ref_name = min(with_plan, key=lambda k: (with_plan[k].objective_s, k != "cpsat"), default=None)
    return {
        "model": model.name,
        "cluster": cluster.name,
        "family": family,
        "time_limit_s": time_limit,
        "budget_s": budget_s,
        "results": results,
        "agree": _agreement(sols, with_plan, optimal),
        "consistent": _consistent(sols, best_obj),
        "best_objective_s": best_obj,
        "best_bound_s": best_bound,
        "dp_gap": dp_gap,
        "proven_optimum_s": proven_opt,
        "proved_by": sorted(proven),
        "dp_distance_to_optimum": dp_distance,
        "reference": ref_name,
        "diffs": _diffs(with_plan, ref_name),
    }


def _run_all(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    solvers: Sequence[str],
    family: str,
    time_limit: float | None,
    warm_start: bool,
    options: dict[str, Any],
    clock: Deadline = NO_DEADLINE,
) -> tuple[dict[str, Solution], list[dict[str, Any]]]:
    """Each solver in turn: its solution (unless skipped) and its report row. Under a ``clock`` each solver
    gets an equal share of the time the ones before it left (``time_limit`` still caps it)."""
    sols: dict[str, Solution] = {}
    results: list[dict[str, Any]] = []
    hint: Plan | None = None
    for i, name in enumerate(solvers):
        limit = time_limit
        if clock.at is not None:
            share = clock.left() / (len(solvers) - i)
            limit = share if limit is None else min(limit, share)
        if limit is not None and limit <= 0:  # the whole comparison's limit ran out: this solver never starts
            out: Solution | str = f"the comparison's time limit ran out before {name} began"
            status = "timeout"
        else:
            out = _run(name, model, cluster, settings, family, limit, hint, options)
            status = "skipped"
        if isinstance(out, str):
            results.append(
                {
                    "solver": name,
                    "status": status,
                    "objective_s": math.nan,
                    "bound_s": math.nan,
                    "gap": math.nan,
                    "wall_s": 0.0,
                    "time_limit_s": limit,
                    "tolerance_s": 0.0,
                    "plan": [],
                    "message": out,
                }
            )
            continue
        sols[name] = out
        if name == "dp" and warm_start:
            hint = out.plan
        results.append(
            {
                "solver": name,
                "status": out.status,
                "objective_s": out.objective_s,
                "bound_s": out.bound_s,
                "gap": out.gap,
                "wall_s": out.wall_s,
                "time_limit_s": limit,
                "proved_by": out.stats.get("proved_by") if out.status == "optimal" else None,
                "tolerance_s": _tolerance(out),
                "plan": [s.label() for s in out.plan.stages] if out.plan is not None else [],
                "message": out.message,
                "stats": {k: v for k, v in out.stats.items() if isinstance(v, (int, float, str, bool))},
            }
        )
    return sols, results


def _agreement(sols: dict[str, Solution], with_plan: dict[str, Solution], optimal: dict[str, Solution]) -> bool | None:
    """Every pair of optimal results within their stated tolerances; exact solvers that all prove
    infeasibility agree; one proving infeasible what another solved disagrees. None: too few to compare."""
    agree: bool | None = None
    if len(optimal) >= 2:
        agree = True
        items = list(optimal.items())
        for i, (na, a) in enumerate(items):
            for nb, b in items[i + 1 :]:
                tol = _tolerance(a) + _tolerance(b) + FLOAT_TOLERANCE * max(a.objective_s, b.objective_s)
                if abs(a.objective_s - b.objective_s) > tol:
                    log.warning("compare: %s (%.9g) and %s (%.9g) disagree", na, a.objective_s, nb, b.objective_s)
                    agree = False
    infeasible = [k for k, s in sols.items() if s.status == "infeasible"]
    if not with_plan and len([k for k in infeasible if k != "dp"]) >= 2:
        agree = True  # the exact solvers agree that nothing fits
    if infeasible and with_plan and any(sols[k].solver != "dp" for k in infeasible):
        agree = False  # an exact solver proved infeasible what another solved
    return agree


def _consistent(sols: dict[str, Solution], best_obj: float) -> bool:
    """No solver's proven bound lies above the best plan's objective (beyond the stated tolerances)."""
    consistent = True
    if math.isfinite(best_obj):
        for k, s in sols.items():
            b = s.bound_s
            if b == b and math.isfinite(b) and b > best_obj + _tolerance(s) + FLOAT_TOLERANCE * best_obj:
                log.warning("compare: %s bound %.9g exceeds the best objective %.9g", k, b, best_obj)
                consistent = False
    return consistent


def _diffs(with_plan: dict[str, Solution], ref_name: str | None) -> dict[str, list[dict[str, Any]]]:
    """Stage-by-stage differences of every other plan from the reference (the best) plan."""
    diffs: dict[str, list[dict[str, Any]]] = {}
    if ref_name is None:
        return diffs
    ref = with_plan[ref_name].plan
    assert ref is not None
    for k, s in with_plan.items():
        if k != ref_name and s.plan is not None:
            d = plan_diff(ref, s.plan)
            if d:
                diffs[k] = d
    return diffs


def _num(v: Any, fmt: str) -> str:
    """A number for the table; no number (no plan, no bound) is ``-``, never ``nan`` or ``inf``."""
    return format(v, fmt) if isinstance(v, int | float) and math.isfinite(v) else "-"


def without_plan(report: dict[str, Any]) -> list[str]:
    """``solver: why`` for every solver that returned no plan (timeout, infeasible, skipped)."""
    out = []
    for r in report["results"]:
        if not r["plan"]:
            why = {"timeout": f"timeout after {r['wall_s']:.1f} s", "skipped": r["message"]}.get(
                r["status"], r["status"]
            )
            out.append(f"{r['solver']}: {why}")
    return out


def nothing_found(report: dict[str, Any]) -> str | None:
    """One line saying that no solver found a plan and why each did not, or None when one did."""
    if any(r["plan"] for r in report["results"]):
        return None
    infeasible = [r for r in report["results"] if r["status"] == "infeasible"]
    if infeasible:
        return f"no plan fits: {infeasible[0]['message']}"
    return "no solver found a plan (" + "; ".join(without_plan(report)) + "); give them more time with --time-limit"


def format_markdown(report: dict[str, Any]) -> str:
    """The comparison as a markdown table (for the CLI and the bench)."""
    lines = [
        f"{report['model']} on {report['cluster']} ({report['family']}): agree={report['agree']} "
        f"consistent={report['consistent']} dp_gap={report['dp_gap']:.2%}"
        if report["dp_gap"] == report["dp_gap"]
        else f"{report['model']} on {report['cluster']} ({report['family']}): agree={report['agree']} "
        f"consistent={report['consistent']}",
        "",
        "| solver | status | objective (s) | bound (s) | gap | wall (s) | stages |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['solver']} | {r['status']} | {_num(r['objective_s'], '.6g')} | {_num(r['bound_s'], '.6g')} | "
            f"{_num(r['gap'], '.2%')} | {r['wall_s']:.1f} | {len(r['plan']) or '-'} |"
        )
    opt = report.get("proven_optimum_s", math.nan)
    dist = report.get("dp_distance_to_optimum", math.nan)
    lines.append("")
    missing = without_plan(report)
    if missing:
        lines.append("no plan from " + "; ".join(missing))
    if opt == opt:
        line = f"proven optimum {opt:.6g} s (by {', '.join(report.get('proved_by', []))})"
        if dist == dist:
            line += f"; the pruned DP's distance to the proven optimum: {dist:.4%}"
        lines.append(line)
    else:
        lines.append("no solver proved optimality within the time limit; dp_gap is to the best proven bound")
    return "\n".join(lines)


__all__ = [
    "DP_EXACT_MAX_WORK",
    "SOLVERS",
    "compare_runtimes",
    "compare_solvers",
    "dp_exact_work",
    "format_markdown",
    "format_runtimes_markdown",
    "nothing_found",
    "plan_diff",
    "without_plan",
]


# ---------------------------------------------------------------------- runtimes side by side
def compare_runtimes(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    *,
    solver: str = "dp",
    time_limit: float | None = None,
    optimizer_offload: bool | str = "auto",
) -> dict[str, Any]:
    """The best plan per runtime that runs the cluster's vendor mix, and the what-if space (``any``) next
    to them: what each runtime's limits (no VPP with per-stage meshes, CP 1, ...) cost on this cluster.

    Each row is one search (``api.solve`` with ``runtime=``); a runtime with no plan says why."""
    from hapmoe_milp.api import solve
    from hapmoe_milp.errors import HapmoeError
    from hapmoe_milp.runtimes import ANY, runtimes_for

    rows: list[dict[str, Any]] = []
    for name in [r.name for r in runtimes_for(cluster)] + [ANY]:
        row: dict[str, Any] = {"runtime": name}
        try:
            sol = solve(
                model,
                cluster,
                solver,
                settings=settings,
                runtime=name,
                time_limit=time_limit,
                optimizer_offload=optimizer_offload,
            )
        except HapmoeError as exc:
            row.update({"status": "no plan", "why": exc.detail})
            rows.append(row)
            continue
        plan = sol.plan
        assert plan is not None
        pred = plan.predicted
        row.update(
            {
                "status": sol.status,
                "family": plan.family,
                "pp": plan.pp,
                "vpp": plan.vpp,
                "iteration_time_s": sol.objective_s,
                "tokens_per_s": pred.get("tokens_per_s"),
                "mfu": pred.get("mfu"),
                "stages": [s.label() for s in plan.stages],
            }
        )
        rows.append(row)
    best_any = next((r.get("iteration_time_s") for r in rows if r["runtime"] == ANY), None)
    for r in rows:
        t = r.get("iteration_time_s")
        r["vs_any"] = t / best_any if t and best_any else None
    runnable = [r for r in rows if r["runtime"] != ANY and r.get("iteration_time_s")]
    fastest = min(runnable, key=lambda r: r["iteration_time_s"])["runtime"] if runnable else None
    return {"model": model.name, "cluster": cluster.name, "solver": solver, "rows": rows, "fastest_runnable": fastest}


def format_runtimes_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# {report['model']} on {report['cluster']}: best plan per runtime ({report['solver']})",
        "",
        "| runtime | family | PP | VPP | iteration s | tokens/s | MFU | vs any | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in report["rows"]:
        if r.get("iteration_time_s") is None:
            lines.append(f"| {r['runtime']} | | | | | | | | no plan: {r.get('why', '')} |")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if isinstance(r.get("mfu"), float) else ""
        tps = f"{r['tokens_per_s']:,.0f}" if isinstance(r.get("tokens_per_s"), (int, float)) else ""
        vs = f"{r['vs_any']:.3f}" if r.get("vs_any") else ""
        lines.append(
            f"| {r['runtime']} | {r['family']} | {r['pp']} | {r['vpp']} | {r['iteration_time_s']:.4f} | {tps} | "
            f"{mfu} | {vs} | {r['status']} |"
        )
    lines += ["", "`any` is the what-if space: no single runtime is known to run its plan."]
    if report.get("fastest_runnable"):
        lines.append(f"Fastest runnable: {report['fastest_runnable']} (what `--runtime auto` returns).")
    return "\n".join(lines) + "\n"
