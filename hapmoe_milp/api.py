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
    Family,
    Settings,
    check_choice,
    check_solver_options,
    check_time_limit,
    graph_parts,
    make_settings,
)
from hapmoe_milp.cost.estimate import Estimate, estimate
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.deadline import Deadline
from hapmoe_milp.errors import HapmoeError, InfeasibleError, SettingsError, SolverError
from hapmoe_milp.plan import Plan, check_plan
from hapmoe_milp.runtimes import ANY, AUTO, RUNTIMES, Runtime, searched_families, settings_problem
from hapmoe_milp.runtimes import resolve as resolve_runtimes
from hapmoe_milp.search.certificate import union
from hapmoe_milp.search.solution import Progress, Solution
from hapmoe_milp.space import Pruning
from hapmoe_milp.specs.catalog import Catalog
from hapmoe_milp.specs.cluster import ClusterSpec, check_size
from hapmoe_milp.specs.model import ModelSpec
from hapmoe_milp.specs.model_doc import validate_model

log = logging.getLogger(__name__)

FAMILY_CHOICES = ("both", "megatron", "hetero")
OFFLOAD_CHOICES = ("auto", True, False)
# Seconds an infeasible solve may spend past its limit saying why (diagnose); part of the documented constant
DIAGNOSE_MIN_S = 1.0
# Share of the time left that a DP try with an optimizer-offload retry after it may spend without finding a
# plan before the retry gets the rest (a try with a plan by then runs on to the limit): under a short limit a
# model that fits only with offload gets a plan instead of a slow proof that nothing fits without it
NO_PLAN_SHARE = 0.5
# The searches stop this much before the limit (at most FINISH_SHARE of it): what runs after a search stops
# (the last unit of work between two clock checks, building and re-pricing the plan) then ends inside the
# limit instead of just past it; a solve that stops at its limit answers at the limit, not 20-50 ms later
FINISH_RESERVE_S = 0.05
FINISH_SHARE = 0.05
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
    """``family`` checked, and against what an export ``target`` (a runtime) runs."""
    check_choice("family", family, FAMILY_CHOICES)
    if target is None:
        return family
    check_choice("export", target, tuple(RUNTIMES))
    need = searched_families(RUNTIMES[target])
    if family not in ("both", *need):
        raise SettingsError(
            f"{target} runs {need[0]}-family plans only, and --family asks for {family}; drop --family or "
            "change the export target",
            field="family",
        )
    return family


def model_problem(rt: Runtime, model: ModelSpec | None) -> str | None:
    """Why ``rt`` cannot build ``model`` at all (None when it can): a hybrid model where the runtime
    builds GPT models only, or an architecture Megatron-Core lacks (every runtime here builds with it)."""
    from hapmoe_milp.export.megatron_arch import megatron_gaps

    if model is None:
        return None
    if model.is_hybrid and not rt.hybrid:
        return f"{rt.title} builds GPT models only here, {model.name} is a hybrid (Mamba) model"
    for gap in megatron_gaps(model):
        if gap.blocking:
            return f"{rt.title} builds models with Megatron-Core, which cannot build {model.name}: {gap.feature}"
    return None


def search_spaces(
    runtime: str,
    cluster: ClusterSpec,
    settings: Settings,
    family: str = "both",
    export: str | None = None,
    model: ModelSpec | None = None,
) -> dict[str, Runtime | None]:
    """Plan family -> the runtime whose rules its plans must meet, for a ``runtime`` choice.

    ``auto``: every runtime that runs the cluster's vendor mix and these settings (FP8, dispatcher); a
    runtime name: that one (an error when it cannot run the cluster or the settings); ``any``: both
    families with no runtime (the what-if space). ``family`` and an ``export`` target narrow the choice;
    exporting needs a runtime (``any`` names none)."""
    check_choice("family", family, FAMILY_CHOICES)
    flag = "runtime"
    if export is not None:
        check_choice("export", export, tuple(RUNTIMES))
        if runtime == ANY:
            raise SettingsError(
                "the what-if space names no runtime that runs its plans, so there is nothing to export for; "
                "drop --runtime any (or give --runtime " + export + ")",
                field="runtime",
            )
        if runtime not in (AUTO, export):
            raise SettingsError(f"is {runtime}, but --export asks for {export}; give one of them", field="runtime")
        families_for(family, export)
        runtime, flag = export, "export"
    try:
        found = resolve_runtimes(runtime, cluster)
    except SettingsError as exc:
        raise exc.at(field=flag) from None
    fams = ["megatron", "hetero"] if family == "both" else [family]
    if found is None:
        return {f: None for f in fams}
    out: dict[str, Runtime | None] = {}
    why: list[str] = []
    for rt in found:
        problem = settings_problem(
            rt,
            cluster,
            settings.precision,
            settings.dispatcher,
            settings.overlap_ep_comm and model.is_moe,
            settings.cuda_graph_scope,
        ) or model_problem(rt, model)
        if problem is not None:
            if runtime != AUTO:
                raise SettingsError(problem, field=flag)
            why.append(problem)
            continue
        for fam in searched_families(rt):  # single-vendor runtimes come first: they keep VPP and CP
            if fam in fams and fam not in out:
                out[fam] = rt
    if not out:
        names = ", ".join(r.name for r in found)
        if why:
            raise SettingsError(f"no runtime runs this search on cluster {cluster.name}: {'; '.join(why)}", field=flag)
        runs = sorted({f for r in found for f in searched_families(r)})
        raise SettingsError(
            f"asks for {family}-family plans, and {names} (what runs cluster {cluster.name}) runs "
            f"{' and '.join(runs)}-family plans; drop --family or use --runtime any",
            field="family",
        )
    return out


def runtime_label(plan: Plan | None) -> str:
    """What a result says about who runs it."""
    if plan is None or plan.runtime is None:
        return "runtime not recorded"
    if plan.runtime == ANY:
        return "what-if space (--runtime any): no single runtime is known to run this plan"
    rt = RUNTIMES[plan.runtime]
    return f"runs on {rt.title} (rules checked at " + ", ".join(f"{r}@{c[:10]}" for r, c in rt.version.items()) + ")"


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
    fsdp_search: bool = False,
    runtime: str = AUTO,
    **settings_kw: Any,
) -> Solution:
    """Search for the fastest plan; raise InfeasibleError (with the tightest constraint) if none fits.

    ``runtime``: ``auto`` (every runtime that runs the cluster's vendor mix; the plan names the one
    that runs it), a runtime name (``megatron``, ``rocm``, ``mindspeed``, ``flagscale``), or ``any``
    (the what-if space: both families under Megatron's per-mesh rules, which no single runtime is known
    to run). ``family`` narrows the plan families searched.

    ``fsdp_search=True`` also searches the megatron family under Megatron-FSDP with sharded parameters
    (``optim_grads_params``: every state sharded, parameters gathered per layer and micro-batch) and keeps
    whichever plan is faster -- the memory lever that trades communication for state instead of recompute.
    Only where the megatron family's runtime is upstream Megatron-LM (or the what-if space).

    ``optimizer_offload="auto"`` first searches with optimizer states on the device and, only if nothing
    fits, again with them offloaded to host memory (as HAPMoE does for Mixtral-L on small clusters). Under
    a time limit the DP's first try gets ``NO_PLAN_SHARE`` of it to find a plan or prove none fits; if it
    has neither by then, the offload retry gets the rest, and its plan comes back with status ``timeout``
    (the first try's space was not searched to the end, so a plan without offload may exist).
    Before any option is priced, the memory floor (``search/floor.py``) rules out the tries where even model
    state alone cannot fit: a try it rules out is not searched, and when it rules out every try ``solve``
    raises its proof (``InfeasibleError``, constraint ``memory``, saying the floor proved it).
    ``export`` (a runtime name) restricts the search to plans that runtime runs.
    EP-communication overlap not given (no ``settings``, ``overlap_ep_comm`` None) is a searched choice for
    MoE models: the plan is searched without and with it (the latter over the megatron family's plans
    Megatron can overlap, where upstream Megatron-LM runs that family) and the faster one is kept, with its
    setting.
    ``progress`` is called at coarse points (per instance / sub-model) with a ``ProgressEvent``.
    """
    # the limit covers the whole call: loading the specs, the runtimes' spaces and the memory floor
    # (tens of milliseconds) count against it, as the search's building does (deadline.py)
    t0 = time.perf_counter()
    check_choice("solver", solver, SOLVERS)
    check_choice("family", family, FAMILY_CHOICES)
    if optimizer_offload not in OFFLOAD_CHOICES:
        raise SettingsError(f"must be auto, True or False, got {optimizer_offload!r}", field="optimizer_offload")
    limit = DEFAULT_TIME_LIMIT if time_limit is None else check_time_limit(time_limit)
    search_limit = limit - min(FINISH_RESERVE_S, FINISH_SHARE * limit) if limit else limit
    options = check_solver_options(solver_options or {})
    m, c = resolve(model, cluster, catalog)
    st = make_settings(m, settings, **settings_kw)
    spaces = search_spaces(runtime, c, st, family, export, m)
    every_try = _tries(st, optimizer_offload)
    tries = _tries_the_floor_leaves(m, c, st, every_try, tuple(spaces), fsdp_search)
    ruled = [_offload_words(t) for t in every_try if t not in tries]
    floor_note = {"ruled_out_by_floor": ", ".join(ruled)} if ruled else {}
    overlap_auto = settings is None and settings_kw.get("overlap_ep_comm") is None and ep_overlap_applies(m, st)
    last: Solution | None = None
    ran_out = False  # a try or alternative the limit left no time for: "no plan" is then not a proof
    unproven: tuple[Solution, Settings] | None = None  # a try stopped without a plan for a later one's sake
    # one cost model for every try: the offload retry re-prices only weights and optimizer terms
    cm = CostModel(m, c, tries[0])
    schedule = list(tries)
    i = 0
    while i < len(schedule):
        s = schedule[i]
        i += 1
        # one time limit for the whole solve: every later try gets what the earlier ones left
        left = search_limit - (time.perf_counter() - t0) if search_limit else search_limit
        if left is not None and left <= 0:  # the limit is the whole solve's: nothing left for this try
            ran_out = True
            break
        opts = {**options, "cost_model": cm.for_settings(s)}
        if solver == "dp" and left is not None and i < len(schedule):
            opts["plan_by"] = NO_PLAN_SHARE * left  # anytime: no plan by then, the next try gets the rest
        sol = _run_solver(m, c, s, solver, spaces, pruning, left, opts, progress)
        if sol.plan is None and "no_plan_by_s" in sol.stats:
            unproven = (sol, s)  # neither a plan nor a proof: the offload retry is searched, its plan unproven
            continue
        alts = _alternatives(s, spaces, fsdp_search, overlap_auto)
        sol, s, cut = _best_alternative(sol, s, alts, (m, c, solver, pruning, options, progress), search_limit, t0)
        ran_out = ran_out or cut
        last = sol
        if sol.plan is not None:
            if unproven is not None:
                sol = _after_unproven(sol, unproven[0])
            sol = replace(sol, stats={**sol.stats, **floor_note})
            gbs_given = settings is not None or settings_kw.get("global_batch_size") is not None
            return _finish(sol, m, c, s, warn_idle=not gbs_given)
        if sol.status == "timeout" or ran_out:
            break
        if unproven is not None and sol.status == "infeasible":
            # the retry proved that nothing fits its space: that covers the unfinished try when it only
            # kept more on the device (_covers); otherwise that try gets the rest of the limit to finish
            # (its plan, if it finds one, is the one solve prefers; if not, both are proofs)
            if not _covers(s, unproven[1]):
                schedule.append(unproven[1])
            unproven = None
    timed_out = ran_out or last is None or last.status == "timeout" or unproven is not None
    raise _no_plan_error(m, c, tries[-1], spaces, solver, limit, t0, timed_out)


def _tries(st: Settings, optimizer_offload: bool | str) -> list[Settings]:
    """The settings solve tries in turn: as given, then (``auto`` only) with optimizer states offloaded."""
    if optimizer_offload != "auto":
        return [replace(st, optimizer_offload=bool(optimizer_offload))]
    return [st] if st.optimizer_offload else [st, replace(st, optimizer_offload=True)]


def _finish(sol: Solution, m: ModelSpec, c: ClusterSpec, s: Settings, *, warn_idle: bool) -> Solution:
    """The found plan made self-contained; a default batch that leaves the cluster idle is warned about."""
    out = finalize(sol, m, c, s)
    warn = idle_warning(out, c) if warn_idle else None
    if warn:
        log.warning("%s", warn)
    return out


def _offload_words(s: Settings) -> str:
    return "optimizer states offloaded" if s.optimizer_offload else "optimizer states on the device"


def _tries_the_floor_leaves(
    m: ModelSpec, c: ClusterSpec, st: Settings, tries: list[Settings], fams: tuple[Family, ...], fsdp_search: bool
) -> list[Settings]:
    """The tries the memory floor (``search/floor.py``, no option priced) cannot rule out over the
    families ``fams``; when it rules out all of them, the proof as an InfeasibleError. A try counts as ruled
    out only together with the Megatron-FSDP alternative searched beside it over the megatron family
    (``_alternatives``: FSDP shards more state); EP overlap changes no state."""
    from hapmoe_milp.search.floor import prove_no_fit

    left: list[Settings] = []
    why: str | None = None
    for s in tries:
        proofs = [prove_no_fit(m, c, s, fams)]
        if fsdp_search and "megatron" in fams and s.fsdp == "none" and not s.optimizer_offload:
            proofs.append(prove_no_fit(m, c, replace(s, fsdp="optim_grads_params"), ("megatron",)))
        if any(p is None for p in proofs):
            left.append(s)
        else:
            why = proofs[0]
    if left:
        return left
    offload = tries[-1].optimizer_offload
    hint = ""
    if not offload and prove_no_fit(m, c, replace(st, optimizer_offload=True), fams) is None:
        hint = " or try --optimizer-offload"
    where = "even with the optimizer states offloaded to host memory" if offload else _offload_words(tries[-1])
    raise InfeasibleError(
        f"memory: no plan can fit {m.name} on {c.name} ({where}): {why}; proved before the search by the "
        f"memory floor (cost/floor.py); use more devices{hint}",
        constraint="memory",
    )


def _no_plan_error(
    m: ModelSpec,
    c: ClusterSpec,
    st: Settings,
    spaces: dict[str, Runtime | None],
    solver: str,
    limit: float,
    t0: float,
    timed_out: bool,
) -> HapmoeError:
    """Why solve has no plan: out of time (say how to give more), or a diagnosis of what does not fit --
    itself bounded by what is left of the limit, at least DIAGNOSE_MIN_S."""
    from hapmoe_milp.search.diagnose import diagnose
    from hapmoe_milp.search.dp import families

    if timed_out:
        return InfeasibleError(
            f"{solver} found no plan within the time limit ({limit:g} s); give it more time with "
            f"--time-limit {max(2 * limit, 60):g} (time_limit= in Python)",
            constraint="time",
        )
    return diagnose(
        m, c, st, families(_family_arg(spaces)), Deadline.after(max(DIAGNOSE_MIN_S, limit - (time.perf_counter() - t0)))
    )


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
    overlaps (alltoall, flex) with at most one MTP layer (export rule ``rule_ep_overlap_requirements``), and no CUDA graph Megatron refuses with it (only Transformer
    Engine graphs, not of ``moe`` or ``mlp``: TransformerConfig.__post_init__ at core_v0.16.0)."""
    graphs_ok = st.cuda_graph_scope == "none" or (
        st.cuda_graph_scope != "layer" and not {"moe", "mlp"} & graph_parts(st.cuda_graph_scope)
    )
    return m.is_moe and st.dispatcher in ("alltoall", "flex") and m.mtp_num_layers <= 1 and graphs_ok


def _alternatives(
    s: Settings, spaces: dict[str, Runtime | None], fsdp_search: bool, overlap_auto: bool
) -> list[tuple[Settings, dict[str, Runtime | None]]]:
    """Settings searched besides ``s``, each over the megatron family's space where its runtime has them:
    Megatron-FSDP (``fsdp_search``; upstream Megatron-LM, whose ``--use-megatron-fsdp`` our export writes)
    and EP-communication overlap unless the caller chose it (``Runtime.ep_overlap``). The what-if space
    (runtime None) has both."""
    out: list[tuple[Settings, dict[str, Runtime | None]]] = []
    if "megatron" not in spaces:
        return out
    rt = spaces["megatron"]
    space = {"megatron": rt}
    if fsdp_search and s.fsdp == "none" and not s.optimizer_offload and (rt is None or rt.name == "megatron"):
        out.append((replace(s, fsdp="optim_grads_params"), space))
    if overlap_auto and (rt is None or rt.ep_overlap):
        out.append((replace(s, overlap_ep_comm=True), space))
    return out


def _best_alternative(
    sol: Solution,
    s: Settings,
    alts: list[tuple[Settings, dict[str, Runtime | None]]],
    run: tuple[ModelSpec, ClusterSpec, str, Pruning | None, dict[str, Any], Progress | None],
    limit: float | None,
    t0: float,
) -> tuple[Solution, Settings, bool]:
    """``sol`` (searched under ``s``) or the fastest plan of the alternatives, with its settings, and
    whether the limit left an alternative no time (then a missing plan is no proof)."""
    m, c, solver, pruning, options, progress = run
    for s_alt, space in alts:
        if s_alt.overlap_ep_comm and sol.status == "infeasible":
            # overlap searches a subset of the options at no less memory: nothing fits there either
            continue
        left = limit - (time.perf_counter() - t0) if limit else limit
        if left is not None and left <= 0:
            return sol, s, True
        # FSDP and EP overlap change more than the offload terms a shared cost model re-prices: each
        # alternative prices with its own cost model
        alt = _run_solver(m, c, s_alt, solver, space, pruning, left, options, progress)
        if alt.plan is not None and (sol.plan is None or alt.objective_s < sol.objective_s):
            sol, s, alt = alt, s_alt, sol
        sol = union(sol, alt)  # the kept plan's bound holds over both spaces (issue 19)
    return sol, s, False


def _covers(proven: Settings, other: Settings) -> bool:
    """Whether "no plan fits under ``proven``" also holds under ``other``: ``other`` is ``proven`` with the
    optimizer states on the device instead of offloaded. Offload enters the cost model only as the main
    parameters and Adam moments it takes off the device (``cost/memory.py`` ``bytes_per_param``) and the
    host-side optimizer-step time, so every memory term under ``other`` is at least the offloaded one,
    capacities and stage times (hence layer bands) are the same, and whether a plan fits reads no time:
    a plan that fits with the states on the device fits offloaded (``tests/test_cost_offload_sharing.py``
    checks the terms)."""
    return proven.optimizer_offload and not other.optimizer_offload and replace(other, optimizer_offload=True) == proven


def _after_unproven(sol: Solution, first: Solution) -> Solution:
    """A later try's plan when an earlier, preferred try (optimizer states on the device) stopped at its
    share of the limit without a plan: the earlier space may still hold a plan that would win, so this
    one is the best found so far (status ``timeout``), not proven best, and says why."""
    stats = {**sol.stats, "stopped_by": "time", "unfinished_try": f"no plan by {first.stats['no_plan_by_s']:.3g} s"}
    stats.pop("proof", None)
    return replace(sol, status="timeout", bound_s=float("nan"), stats=stats)


def _family_arg(spaces: dict[str, Runtime | None]) -> str:
    return "both" if len(spaces) > 1 else next(iter(spaces))


def _run_solver(
    m: ModelSpec,
    c: ClusterSpec,
    st: Settings,
    solver: str,
    spaces: dict[str, Runtime | None],
    pruning: Pruning | None,
    time_limit: float | None,
    options: dict[str, Any],
    progress: Progress | None = None,
) -> Solution:
    from hapmoe_milp.search.dp import solve_dp

    family = _family_arg(spaces)
    if solver == "dp":
        return solve_dp(
            m,
            c,
            st,
            family=family,
            pruning=pruning,
            time_limit=time_limit,
            progress=progress,
            cost_model=options.get("cost_model"),
            runtimes=spaces,
            plan_by=options.get("plan_by"),
        )
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
            runtimes=spaces,
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
    "runtime_label",
    "search_spaces",
    "solve",
    "timeout_hint",
]
