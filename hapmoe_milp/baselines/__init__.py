"""Baseline planners on the same cost model and plan types, so comparisons are like for like.

HAPMoE (reference/papers.md §1.7) compares against three kinds of planner on heterogeneous MoE runs. Each
one here is a planner over *our* cost model: it chooses a plan its own way and is then scored with the
same closed-form :func:`~hapmoe_milp.cost.estimate.estimate` our solvers optimise. So a ratio between a
baseline and our plan measures the planning, not a difference between two cost models.

- :func:`megatron_uniform` ("MI"): the best plan upstream Megatron-LM expresses without a pipeline
  layout, by grid search (stronger than the hand tuning the paper's MI stands for).
- :func:`metis_style`: Metis's planner (reference §3): per-stage (DP, TP), layers split in proportion to
  stage speed, MoE-unaware (EP/ETP frozen at the best homogeneous value, EP traffic invisible to its
  estimator); scored truthfully afterwards.
- :func:`hetermoe_style`: HeterMoE's zebra parallelism (reference §2): attention on the faster device
  type, experts on the slower one, with Asym-EA. This lies *outside* our plan space, so it is priced by
  a small model built from the cost model's pieces and carried by a proxy plan (see its docstring).

:func:`compare_against` runs our planner next to the baselines and reports HAPMoE Table 2 ratios.

Layout (as Sailor's baselines: thin adapters over the shared plan type and cost model, one module each):
this module is the registry and the comparison; :mod:`.megatron_uniform`, :mod:`.metis` and
:mod:`.hetermoe` hold one planner each; :mod:`.common` the helpers they share. None of them prices
anything itself: every time and byte count comes from :mod:`hapmoe_milp.cost`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from hapmoe_milp.config import Settings
from hapmoe_milp.cost.estimate import Estimate, estimate
from hapmoe_milp.deadline import Deadline
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.plan import Plan
from hapmoe_milp.search.solution import Solution
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

from .common import SOLVER_NAMES
from .hetermoe import ZebraPlan, hetermoe_style
from .megatron_uniform import megatron_uniform
from .metis import MoEUnawareCostModel, metis_style

log = logging.getLogger(__name__)

BASELINES = ("megatron", "metis", "hetermoe")
_ALIASES = {
    "megatron": "megatron",
    "megatron-uniform": "megatron",
    "mi": "megatron",
    "metis": "metis",
    "metis-style": "metis",
    "hetermoe": "hetermoe",
    "hetermoe-style": "hetermoe",
}


# ------------------------------------------------------------------------------------------ dispatch
_RUNNERS: dict[str, Callable[..., Solution]] = {  # (model, cluster, settings, *, deadline) -> Solution
    "megatron": megatron_uniform,
    "metis": metis_style,
    "hetermoe": hetermoe_style,
}


def canonical(name: str) -> str:
    """The registry key of a baseline name or alias; a usage error naming ``--against`` otherwise."""
    key = _ALIASES.get(name.lower())
    if key is None:
        raise HapmoeError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}", field="against")
    return key


def run_baseline(name: str, model: ModelSpec, cluster: ClusterSpec, settings: Settings) -> Solution:
    """Run one baseline by name (``megatron``, ``metis``, ``hetermoe`` or their solver names)."""
    return _RUNNERS[canonical(name)](model, cluster, settings)


def _with_offload_fallback(fn: Callable[[], Solution], retry: Callable[[], Solution] | None) -> tuple[Solution, bool]:
    sol = fn()
    if sol.plan is None and retry is not None:
        sol2 = retry()
        if sol2.plan is not None:
            return sol2, True
    return sol, False


def _row(method: str, sol: Solution | None, offload: bool, devices_total: int, **extra: Any) -> dict[str, Any]:
    if sol is None or sol.plan is None:
        return {
            "method": method,
            "solver": sol.solver if sol else method,
            "status": sol.status if sol else "error",
            "iteration_time_s": None,
            "tokens_per_s": None,
            "mfu": None,
            "optimizer_offload": offload,
            "message": sol.message if sol else "",
            **extra,
        }
    pred = sol.plan.predicted
    t = sol.objective_s
    return {
        "method": method,
        "solver": sol.solver,
        "status": sol.status,
        "iteration_time_s": t,
        "tokens_per_s": pred.get("tokens_per_s"),
        "tokens_per_s_per_cluster_device": (pred.get("tokens_per_s") or 0.0) / devices_total,
        "mfu": pred.get("mfu"),
        "devices_used": pred.get("devices"),
        "optimizer_offload": offload,
        "maps_to_plan": sol.stats.get("maps_to_plan", True),
        "fits": pred.get("fits"),
        "wall_s": sol.wall_s,
        "plan": plan_label(sol.plan),
        "message": sol.message,
        **extra,
    }


def plan_label(plan: Plan) -> str:
    """:meth:`Plan.label`, except for HeterMoE's zebra proxy, whose stages stand in for a layout upstream
    cannot express, so the zebra's own label is shown instead."""
    zebra = plan.predicted.get("zebra") if plan.predicted else None
    if zebra:
        return "zebra " + str(plan.predicted.get("zebra_label", "")) + " (proxy plan)"
    return plan.label()


def compare_against(
    model: ModelSpec | str,
    cluster: ClusterSpec | str,
    settings: Settings | None = None,
    against: Sequence[str] = BASELINES,
    solver: str = "dp",
    *,
    time_limit: float | None = None,
    optimizer_offload: bool | str = "auto",
    runtime: str = "auto",
) -> dict[str, Any]:
    """Our planner's plan next to each baseline's, HAPMoE Table 2 style (ratios vs Megatron-uniform).

    Ours is searched for ``runtime`` (default ``auto``: a plan a runtime runs on the cluster, named in its
    row) and, unless that is ``any`` already, once more in the what-if space (``any``, row
    ``ours-any (...)``): the baselines are what-if plans too, so search gaps are judged against that row,
    and the two rows side by side are the price of runnability.

    Ratios: ``throughput`` = tokens/s ratio (all planners process the same ``GBS*S`` tokens, so this is
    the inverse latency ratio), ``mfu`` = MFU ratio (MFU over the peak of the devices a plan uses),
    ``latency`` = iteration-time ratio. Megatron-uniform is always run as the reference. Where a
    baseline fits only with optimizer states offloaded to host memory, it is rerun that way (HAPMoE
    offloads for Mixtral-L on its small clusters) and the row says so; ``optimizer_offload='auto'``
    does the same for our planner. ``time_limit`` bounds the whole comparison: each baseline and then our
    planner get an equal share of what the methods before them left; a baseline the limit stops reports its
    best plan so far with status ``timeout``.

    Returns a dict: ``model``, ``cluster``, ``devices``, ``settings`` and ``reference`` (plain values);
    ``rows`` (one JSON-safe dict per method, ours first: iteration time, tokens/s, MFU, the three ratios,
    offload flag, ``maps_to_plan``, a one-line plan summary, message); ``notes`` (search gaps: our plan
    slower than an in-space baseline under the same offload setting); ``solutions`` (the
    :class:`Solution` objects, for export -- not JSON-serialisable).
    """
    from hapmoe_milp import api

    m, c = api.resolve(model, cluster)
    st = api.make_settings(m, settings)
    names = [canonical(a) for a in against]
    allow_retry = optimizer_offload == "auto" and not st.optimizer_offload
    if optimizer_offload not in ("auto", None):
        st = replace(st, optimizer_offload=bool(optimizer_offload))
    # ``time_limit`` bounds the whole comparison: each method gets an equal share of what is left
    clock = Deadline.after(time_limit)
    ours_runs = 1 if runtime == "any" else 2  # our planner under the runtime, and in the what-if space
    sols, offl = _run_baselines(m, c, st, names, clock, allow_retry, ours_runs)

    def search(rt: str, parts: int) -> tuple[Solution, bool]:
        left = None if time_limit is None else clock.left() / parts
        if left is not None and left <= 0:  # the limit is the whole comparison's: nothing left, no search
            why = f"the {time_limit:g} s limit ran out before this search began"
            return Solution(solver, "timeout", None, math.inf, math.nan, 0.0, message=why), False
        return _search_ours(m, c, st, solver, rt, left, optimizer_offload)

    ours, ours_off = search(runtime, 2 if runtime != "any" else 1)
    what_if, what_if_off = search("any", 1) if runtime != "any" else (ours, ours_off)
    ref = sols["megatron"]
    world = c.world_size
    rows = [_row(f"ours ({solver})", ours, ours_off, world, runtime=_runtime_of(ours), **_ratios(ours, ref))]
    if runtime != "any":
        rows.append(_row(f"ours-any ({solver})", what_if, what_if_off, world, runtime="any", **_ratios(what_if, ref)))
    for key in ["megatron", *[n for n in names if n != "megatron"]]:
        if key == "megatron" and "megatron" not in names:
            continue
        rows.append(_row(SOLVER_NAMES[key], sols[key], offl[key], world, **_ratios(sols[key], ref)))
    return {
        "model": m.name,
        "cluster": c.name,
        "devices": world,
        "settings": {
            "seq_length": st.seq_length,
            "global_batch_size": st.global_batch_size,
            "micro_batch_size": st.micro_batch_size,
            "dispatcher": st.dispatcher,
            "optimizer_offload": optimizer_offload,
        },
        "reference": SOLVER_NAMES["megatron"],
        "rows": rows,
        "notes": _search_gaps(solver, what_if, what_if_off, sols, offl),
        "solutions": {"ours": ours, "ours-any": what_if, **{SOLVER_NAMES[k]: v for k, v in sols.items()}},
    }


def _run_baselines(
    m: ModelSpec,
    c: ClusterSpec,
    st: Settings,
    names: list[str],
    clock: Deadline,
    allow_retry: bool,
    ours_runs: int,
) -> tuple[dict[str, Solution], dict[str, bool]]:
    """Megatron-uniform (always: the reference) and each baseline in ``names``, each with an equal share
    of the time ``clock`` leaves to it and to the ``ours_runs`` searches of ours after it; rerun with
    optimizer offload where only that fits (``allow_retry``). Returns the solutions and, per baseline,
    whether its plan offloads."""
    off = replace(st, optimizer_offload=True)
    sols: dict[str, Solution] = {}
    offl: dict[str, bool] = {}
    keys = ["megatron", *[n for n in names if n != "megatron"]]
    for i, key in enumerate(keys):
        fn = _RUNNERS[key]
        t = time.perf_counter()
        share = Deadline.after(clock.left() / (len(keys) + ours_runs - i))
        sol, used_off = _with_offload_fallback(
            lambda fn=fn, d=share: fn(m, c, st, deadline=d),
            (lambda fn=fn, d=share: fn(m, c, off, deadline=d)) if allow_retry else None,
        )
        log.info("%s on %s x %s: %s in %.1f s", key, m.name, c.name, sol.status, time.perf_counter() - t)
        sols[key], offl[key] = sol, used_off or st.optimizer_offload
    return sols, offl


def _search_ours(
    m: ModelSpec,
    c: ClusterSpec,
    st: Settings,
    solver: str,
    rt: str,
    time_limit: float | None,
    optimizer_offload: bool | str,
) -> tuple[Solution, bool]:
    """Our planner under runtime ``rt``; no plan (proved infeasible, or out of time: InfeasibleError
    constraint "time") becomes a plan-less Solution, so the comparison still has its row."""
    from hapmoe_milp import api

    try:
        sol = api.solve(
            m, c, solver, settings=st, time_limit=time_limit, optimizer_offload=optimizer_offload, runtime=rt
        )
        return sol, _plan_offloaded(sol, m, c, st)
    except HapmoeError as err:
        status = "timeout" if getattr(err, "constraint", "") == "time" else "infeasible"
        return Solution(solver, status, None, math.inf, math.nan, 0.0, message=str(err)), False


def _ratios(sol: Solution | None, ref: Solution) -> dict[str, float | None]:
    """Throughput, MFU and latency of ``sol`` over the reference's (None where either has no plan)."""
    if sol is None or sol.plan is None or ref.plan is None:
        return {"throughput_ratio": None, "mfu_ratio": None, "latency_ratio": None}
    ref_t, ref_mfu = ref.objective_s, ref.plan.predicted.get("mfu")
    mfu = sol.plan.predicted.get("mfu")
    return {
        "throughput_ratio": ref_t / sol.objective_s,
        "mfu_ratio": (mfu / ref_mfu) if (mfu and ref_mfu) else None,
        "latency_ratio": sol.objective_s / ref_t,
    }


def _search_gaps(
    solver: str, what_if: Solution, what_if_off: bool, sols: dict[str, Solution], offl: dict[str, bool]
) -> list[str]:
    """Notes where our what-if plan is slower than an in-space baseline under the same offload setting
    (the baselines search the what-if space: like is compared with like)."""
    notes: list[str] = []
    if what_if.plan is None:
        return notes
    for key, sol in sols.items():
        if sol.plan is None or not sol.stats.get("maps_to_plan", True):
            continue
        if what_if.objective_s > sol.objective_s * (1 + 1e-9) and offl[key] == what_if_off:
            notes.append(
                f"our {solver} plan ({what_if.objective_s:.4g} s) is slower than {SOLVER_NAMES[key]} "
                f"({sol.objective_s:.4g} s) on the same space: a search gap"
            )
    return notes


def _runtime_of(sol: Solution) -> str | None:
    return sol.plan.runtime if sol.plan is not None else None


def _plan_offloaded(sol: Solution, model: ModelSpec, cluster: ClusterSpec, st: Settings) -> bool:
    """Whether ``api.solve`` had to offload: the plan's prediction matches the offloaded settings."""
    if st.optimizer_offload or sol.plan is None:
        return st.optimizer_offload
    est: Estimate = estimate(model, cluster, sol.plan, st)
    return not (est.fits and abs(est.iteration_time_s - sol.objective_s) <= 1e-9 * max(1.0, sol.objective_s))


__all__ = [
    "BASELINES",
    "SOLVER_NAMES",
    "MoEUnawareCostModel",
    "ZebraPlan",
    "canonical",
    "compare_against",
    "hetermoe_style",
    "megatron_uniform",
    "metis_style",
    "plan_label",
    "run_baseline",
]
