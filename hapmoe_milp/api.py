"""Python API: the same entry points the CLI uses.

Every argument is checked here or in the settings layer (``config.py``) with the same message the CLI
shows, under the argument's Python name (the CLI re-labels it with its flag).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from hapmoe_milp.config import (
    DEFAULT_TIME_LIMIT,
    EXACT_SOLVERS,
    SOLVERS,
    Settings,
    check_choice,
    check_time_limit,
    make_settings,
)
from hapmoe_milp.cost.estimate import Estimate, estimate
from hapmoe_milp.errors import HapmoeError, InfeasibleError, SettingsError, SolverError
from hapmoe_milp.plan import Plan, check_plan
from hapmoe_milp.search.solution import Progress, Solution
from hapmoe_milp.space import Pruning
from hapmoe_milp.specs.catalog import Catalog
from hapmoe_milp.specs.cluster import ClusterSpec, check_size
from hapmoe_milp.specs.model import ModelSpec
from hapmoe_milp.specs.model_doc import validate_model

log = logging.getLogger(__name__)

FAMILY_CHOICES = ("both", "megatron", "hetero")
OFFLOAD_CHOICES = ("auto", True, False)
# Export targets and the plan family each can run: upstream Megatron one mesh shape for every stage;
# FlagScale's heterogeneous meshes (the hetero family is built to FlagScale's rules: no CP, no VPP, ...).
TARGET_FAMILY = {"megatron": "megatron", "flagscale": "hetero"}
# A cluster this large with the model's default global batch is checked for idle devices (see idle_warning)
LARGE_CLUSTER = 64


def resolve(
    model: ModelSpec | str, cluster: ClusterSpec | str, catalog: Catalog | None = None
) -> tuple[ModelSpec, ClusterSpec]:
    """Specs from names (through the catalog) or as given; a spec built in Python is checked like a file."""
    cat = catalog or Catalog()
    if isinstance(model, str):
        m = cat.model(model)
    elif isinstance(model, ModelSpec):
        m = model
        validate_model(m, m.origin or "model")
    else:
        raise SettingsError(f"must be a model name, path or ModelSpec, got {type(model).__name__}", field="model")
    if isinstance(cluster, str):
        c = cat.cluster(cluster)
    elif isinstance(cluster, ClusterSpec):
        c = cluster
        check_size(list(c.groups), c.origin or None, "cluster")
    else:
        raise SettingsError(
            f"must be a cluster name, path or ClusterSpec, got {type(cluster).__name__}", field="cluster"
        )
    return m, c


def finalize(sol: Solution, model: ModelSpec, cluster: ClusterSpec, settings: Settings) -> Solution:
    """Re-evaluate the plan with the cost model and attach the prediction, certificate and specs."""
    if sol.plan is None:
        return sol
    plan = sol.plan.with_settings(settings).with_specs(model, cluster)
    check_plan(plan, model, cluster)
    est = estimate(model, cluster, plan)
    pred = est.to_dict()
    plan = plan.with_predicted(pred, sol.certificate())
    return replace(sol, plan=plan)


def families_for(family: str, target: str | None) -> str:
    """The family to search: ``family`` itself, narrowed to what an export ``target`` can run."""
    check_choice("family", family, FAMILY_CHOICES)
    if target is None:
        return family
    check_choice("export", target, tuple(TARGET_FAMILY))
    need = TARGET_FAMILY[target]
    if family not in ("both", need):
        raise SettingsError(
            f"{target} runs {need}-family plans only, and --family asks for {family}; drop --family or change "
            "the export target",
            field="family",
        )
    return need


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
    export: str | None = None,
    progress: Progress | None = None,
    **settings_kw: Any,
) -> Solution:
    """Search for the fastest plan; raise InfeasibleError (with the tightest constraint) if none fits.

    ``optimizer_offload="auto"`` first searches with optimizer states on the device and, only if nothing
    fits, again with them offloaded to host memory (as HAPMoE does for Mixtral-L on small clusters).
    ``export`` (``megatron`` or ``flagscale``) restricts the search to plans that target runs.
    EP-communication overlap not given (no ``settings``, ``overlap_ep_comm`` None) is a searched choice for
    MoE models: the plan is searched without and with it (the latter over the plans Megatron can overlap)
    and the faster one is kept, with its setting.
    ``progress`` is called at coarse points (per instance / sub-model) with a ``ProgressEvent``.
    """
    check_choice("solver", solver, SOLVERS)
    fam = families_for(family, export)
    if optimizer_offload not in OFFLOAD_CHOICES:
        raise SettingsError(f"must be auto, True or False, got {optimizer_offload!r}", field="optimizer_offload")
    limit = DEFAULT_TIME_LIMIT if time_limit is None else check_time_limit(time_limit)
    m, c = resolve(model, cluster, catalog)
    st = make_settings(m, settings, **settings_kw)
    tries = [st]
    if optimizer_offload == "auto":
        if not st.optimizer_offload:
            tries.append(replace(st, optimizer_offload=True))
    else:
        tries = [replace(st, optimizer_offload=bool(optimizer_offload))]
    overlap_auto = settings is None and settings_kw.get("overlap_ep_comm") is None and ep_overlap_applies(m, st)
    last: Solution | None = None
    t0 = time.perf_counter()
    for s in tries:
        found: list[tuple[Solution, Settings]] = []
        # EP-communication overlap, unless the caller chose: searched both ways, the faster plan kept
        for s2 in (s, replace(s, overlap_ep_comm=True)) if overlap_auto else (s,):
            # one time limit for the whole solve: every later try gets what the earlier ones left
            left = max(0.05, limit - (time.perf_counter() - t0)) if limit else limit
            f2 = "megatron" if s2.overlap_ep_comm and overlap_auto else fam
            if f2 == "megatron" and fam == "hetero":
                continue
            sol = _run_solver(m, c, s2, solver, f2, pruning, left, solver_options or {}, progress)
            last = sol
            if sol.plan is not None:
                found.append((sol, s2))
            if sol.status == "timeout":
                break
        if found:
            sol, s2 = min(found, key=lambda x: x[0].objective_s)
            out = finalize(sol, m, c, s2)
            gbs_given = settings is not None or settings_kw.get("global_batch_size") is not None
            warn = None if gbs_given else idle_warning(out, c)
            if warn:
                log.warning("%s", warn)
            return out
        if last is not None and last.status == "timeout":
            break
    from hapmoe_milp.search.diagnose import diagnose
    from hapmoe_milp.search.dp import families

    assert last is not None
    if last.status == "timeout":
        raise InfeasibleError(
            f"{solver} found no plan within the time limit ({limit:g} s); give it more time with "
            f"--time-limit {max(2 * limit, 60):g} (time_limit= in Python)",
            constraint="time",
        )
    raise diagnose(m, c, tries[-1], families(fam))


def explain(sol: Solution) -> dict[str, Any]:
    """Why the plan is fast or slow: the stage that sets the 1F1B rate, the layers each device type holds,
    and the runner-up plan with its distance (``solve --explain``)."""
    plan = sol.plan
    assert plan is not None
    pred = plan.predicted
    st = max(pred["stages"], key=lambda s: s["stage_time_s"])
    out: dict[str, Any] = {
        "bottleneck_stage": st["index"],
        "bottleneck_device": st["device"],
        "family": plan.family,
        "why": (
            f"{pred['stages'][0]['micro_batch']}-sample micro-batches x {plan.num_microbatches} per iteration; "
            f"the slowest stage takes {1e3 * st['stage_time_s']:.1f} ms per micro-batch and sets the 1F1B rate"
        ),
        "layers_per_device": {s["device"]: round(s["layers"] / s["devices"], 3) for s in pred["stages"]},
    }
    if sol.runner_up is not None and sol.runner_up_s is not None:
        out["runner_up"] = (
            f"{sol.runner_up.label()} at {sol.runner_up_s:.4f} s "
            f"(+{100 * (sol.runner_up_s / sol.objective_s - 1):.2f}%)"
        )
    return out


def timeout_hint(sol: Solution, limit: float | None) -> str:
    """What to say when a search stopped at its time limit with a plan that may not be the best."""
    lim = limit if limit is not None else DEFAULT_TIME_LIMIT
    return (
        f"the {lim:g} s time limit ran out before the search finished; the plan is the best found so far -- "
        f"give it more time with --time-limit {max(4 * lim, 60):g}"
    )


def idle_warning(sol: Solution, cluster: ClusterSpec) -> str | None:
    """A warning when the model's default global batch leaves a large cluster mostly idle.

    Too few sequences per iteration for the devices (DeepSeek-V3 on 2048 GPUs with its default GBS 256:
    an eighth of a sequence per device, MFU about 18%), a deep pipeline with few micro-batches (a bubble of
    (PP - 1) / (M + PP - 1)), or devices the plan leaves out: whichever apply are said, with the numbers."""
    plan = sol.plan
    world = cluster.world_size
    if plan is None or world < LARGE_CLUSTER:
        return None
    gbs, m, pp = plan.global_batch_size, plan.num_microbatches, plan.pp
    bubble = (pp - 1) / (m + pp - 1)
    idle = world - plan.devices_used
    why = []
    if idle >= 0.1 * world:
        why.append(f"{idle} of {world} devices idle")
    if gbs < world:
        why.append(f"{gbs} sequences per iteration for {world} devices ({gbs / world:.3g} per device)")
    if bubble >= 0.25:
        why.append(f"{m} micro-batches over {pp} pipeline stages (pipeline bubble {100 * bubble:.0f}%)")
    if not why:
        return None
    mfu = plan.predicted.get("mfu")
    mfu_text = f"; MFU {100 * mfu:.0f}%" if isinstance(mfu, float) else ""
    suggest = gbs * max(2, -(-world // gbs))
    return (
        f"the model's default global batch {gbs} is small for {world} devices: {'; '.join(why)}{mfu_text}. "
        f"A larger --gbs (e.g. {suggest}) would use the cluster better"
    )


def ep_overlap_applies(m: ModelSpec, st: Settings) -> bool:
    """Whether ``solve`` searches EP-communication overlap both ways: an MoE model on a dispatcher Megatron
    overlaps (alltoall, flex) with at most one MTP layer (export rule ``rule_ep_overlap_requirements``)."""
    return m.is_moe and st.dispatcher in ("alltoall", "flex") and m.mtp_num_layers <= 1


def _run_solver(
    m: ModelSpec,
    c: ClusterSpec,
    st: Settings,
    solver: str,
    family: str,
    pruning: Pruning | None,
    time_limit: float | None,
    options: dict[str, Any],
    progress: Progress | None = None,
) -> Solution:
    from hapmoe_milp.search.dp import solve_dp

    if solver == "dp":
        return solve_dp(m, c, st, family=family, pruning=pruning, time_limit=time_limit, progress=progress)
    if solver in EXACT_SOLVERS:
        try:
            from hapmoe_milp.search import exact
        except ImportError as exc:  # pragma: no cover - until the exact solvers land
            raise SolverError(f"solver {solver!r} is not available: {exc}") from None
        return exact.solve(
            m,
            c,
            st,
            solver=solver,
            family=family,
            pruning=pruning,
            time_limit=time_limit,
            progress=progress,
            **options,
        )
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
    """Predict ``plan`` under the settings it carries (``settings`` replaces them, batch fields aside)."""
    m, c = resolve(model, cluster, catalog)
    if check:
        check_plan(plan, m, c)
    return estimate(m, c, plan, settings, simulate_schedule=simulate)


__all__ = [
    "DEFAULT_TIME_LIMIT",
    "HapmoeError",
    "estimate_plan",
    "explain",
    "families_for",
    "idle_warning",
    "make_settings",
    "resolve",
    "solve",
    "timeout_hint",
]
