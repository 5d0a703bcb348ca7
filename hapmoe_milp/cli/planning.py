"""Planning commands: ``estimate`` one plan, ``solve`` for the best, ``validate`` and ``export`` a plan file."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from hapmoe_milp.cli.options import (
    FLAGS,
    STATE,
    CeFusionOpt,
    ClusterOpt,
    CudaGraphOpt,
    DispatcherOpt,
    DropoutOpt,
    EpOverlapOpt,
    FamilyOpt,
    Fp8ParamOpt,
    Fp8RecipeOpt,
    FsdpOpt,
    FusedRopeOpt,
    FusedSwigluOpt,
    GbsOpt,
    GradBf16Opt,
    HeadroomOpt,
    ImbalanceOpt,
    JsonOpt,
    MbsOpt,
    ModelOpt,
    OffloadModulesOpt,
    OffloadOpt,
    PlanClusterOpt,
    PlanModelOpt,
    PrecisionOpt,
    RuntimeOpt,
    SeqOpt,
    StateDtypeOpt,
    TargetOpt,
    TimeLimitOpt,
    TpOverlapOpt,
    catalog_cluster,
    catalog_model,
    flags,
    plan_with_specs,
    require,
    settings_kw,
)
from hapmoe_milp.cli.output import compute, emit_json, note
from hapmoe_milp.errors import PlanError, SettingsError

log = logging.getLogger("hapmoe_milp")


# ---------------------------------------------------------------------- estimate
def _knob_flag(fld: str | None) -> str:
    import re

    mt = re.fullmatch(r"stages\[\d+\]\.(\w+)", fld or "")
    if mt:
        return FLAGS.get(mt.group(1), f"--{mt.group(1)}")
    return FLAGS.get(fld or "", "--pp")


def estimate(
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    plan: Annotated[
        Path | None, typer.Option("--plan", help="plan.json to evaluate (carries its model, cluster, settings).")
    ] = None,
    tp: Annotated[int | None, typer.Option("--tp", help="Tensor parallel size (default 1).")] = None,
    pp: Annotated[int | None, typer.Option("--pp", help="Pipeline stages (default 1).")] = None,
    cp: Annotated[int | None, typer.Option("--cp", help="Context parallel size (default 1).")] = None,
    ep: Annotated[int | None, typer.Option("--ep", help="Expert parallel size (default 1).")] = None,
    etp: Annotated[int | None, typer.Option("--etp", help="Expert tensor parallel size (default: --tp).")] = None,
    vpp: Annotated[int | None, typer.Option("--vpp", help="Virtual pipeline chunks per stage (default 1).")] = None,
    mbs: MbsOpt = None,
    gbs: GbsOpt = None,
    seq: SeqOpt = None,
    recompute: Annotated[
        str | None,
        typer.Option(
            "--recompute",
            help="none, selective, sel-mlp, sel-moe, full, full:K (block), uniform:N, or Megatron modules "
            "(core_attn,layernorm,moe_act,mla_up_proj,mlp,moe,shared_experts).",
        ),
    ] = None,
    layout: Annotated[
        str | None, typer.Option("--layout", help="Megatron --pipeline-model-parallel-layout string.")
    ] = None,
    imbalance: ImbalanceOpt = None,
    precision: PrecisionOpt = None,
    fp8_recipe: Fp8RecipeOpt = None,
    dispatcher: DispatcherOpt = None,
    ep_overlap: EpOverlapOpt = None,
    cuda_graph_scope: CudaGraphOpt = None,
    tp_overlap: TpOverlapOpt = None,
    optimizer_offload: Annotated[
        str | None,
        typer.Option("--optimizer-offload", help="Optimizer states in host memory: on or off (default: the plan's)."),
    ] = None,
    fsdp: FsdpOpt = None,
    grad_reduce_in_bf16: GradBf16Opt = None,
    fp8_param_gather: Fp8ParamOpt = None,
    optimizer_state_dtype: StateDtypeOpt = None,
    offload_modules: OffloadModulesOpt = None,
    dropout: DropoutOpt = None,
    fused_swiglu: FusedSwigluOpt = None,
    fused_rope: FusedRopeOpt = None,
    cross_entropy_fusion: CeFusionOpt = None,
    memory_headroom: HeadroomOpt = None,
    simulate: Annotated[
        bool, typer.Option("--simulate", help="Event-driven 1F1B simulation instead of the closed form.")
    ] = False,
    explain: Annotated[bool, typer.Option("--explain", help="Itemized memory per stage.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Predict iteration time, throughput, MFU and memory of one plan (a file, or --tp/--pp/... knobs)."""
    from hapmoe_milp.api import estimate_plan
    from hapmoe_milp.config import offload_choice

    with flags():
        offload = offload_choice(optimizer_offload, ("on", "off")) if optimizer_offload is not None else None
    overrides = settings_kw(
        micro_batch_size=mbs,
        global_batch_size=gbs,
        seq_length=seq,
        dispatcher=dispatcher,
        precision=precision,
        fp8_recipe=fp8_recipe,
        overlap_ep_comm=ep_overlap,
        imbalance=imbalance,
        optimizer_offload=offload,
        cuda_graph_scope=cuda_graph_scope,
        tp_comm_overlap=tp_overlap,
        fsdp=fsdp,
        grad_reduce_in_bf16=grad_reduce_in_bf16,
        fp8_param_gather=fp8_param_gather,
        optimizer_state_dtype=optimizer_state_dtype,
        offload_modules=offload_modules,
        dropout=dropout,
        fused_swiglu=fused_swiglu,
        fused_rope=fused_rope,
        cross_entropy_fusion=cross_entropy_fusion,
        memory_headroom=memory_headroom,
    )
    if plan is not None:
        knobs = {"--tp": tp, "--pp": pp, "--cp": cp, "--ep": ep, "--etp": etp, "--vpp": vpp}
        knobs.update({"--recompute": recompute, "--layout": layout})
        for flag, v in knobs.items():
            if v is not None:
                raise SettingsError("cannot be combined with --plan (the plan fixes the layout)", field=flag)
        p, m, c = _plan_file_under(plan, model, cluster, overrides)
    else:
        knob = {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "etp": etp, "vpp": vpp, "recompute": recompute}
        p, m, c = _plan_from_flags(model, cluster, overrides, knob, layout)
    with compute(), flags({"simulate": "--simulate"}):
        est = estimate_plan(m, c, p, simulate=simulate, catalog=STATE.catalog, check=False)
    d = est.to_dict()
    if as_json:
        emit_json(d)
    else:
        _print_estimate(d, f"{m.name} on {c.name} — {p.family} family, pp={p.pp}", explain)
    worst = est.worst_memory()
    if worst is not None:
        typer.echo(
            f"does not fit: stage {worst['index']} ({worst['device']}) needs {worst['memory_gib']:.1f} GiB, "
            f"capacity {worst['capacity_gib']:.1f} GiB (over by {worst['memory_gib'] - worst['capacity_gib']:.1f} GiB)",
            err=True,
        )


def _print_estimate(d: dict[str, Any], title: str, explain: bool) -> None:
    """The human view of one estimate: stages, summary, breakdown and (asked for) the itemized memory."""
    from hapmoe_milp import render

    con = render.console()
    con.print(render.stages_table(d["stages"], title=title))
    con.print(render.STAGES_LEGEND, style="dim")
    con.print(render.summary_line(d))
    con.print(render.breakdown_table(d["breakdown"]))
    con.print(render.BREAKDOWN_LEGEND, style="dim")
    if explain:
        con.print(render.memory_table(d["stages"]))
        con.print(render.MEMORY_LEGEND, style="dim")


def _plan_file_under(plan: Path, model: str | None, cluster: str | None, overrides: dict[str, Any]) -> Any:
    """(plan, model, cluster) of ``--plan``, under the settings flags that override its own (a note says so)."""
    from hapmoe_milp.plan import check_plan

    p, m, c = plan_with_specs(plan, model, cluster)
    if overrides:
        with flags():
            st = p.settings().with_(**overrides)
        shown = {k: ("on" if v else "off") if k == "optimizer_offload" else v for k, v in overrides.items()}
        note(
            "evaluating under "
            + ", ".join(f"{FLAGS[k]} {v}" for k, v in shown.items())
            + f" instead of the settings {plan} was solved under"
        )
        p = p.with_settings(st)
    check_plan(p, m, c, str(plan))
    return p, m, c


def _plan_from_flags(
    model: str | None, cluster: str | None, overrides: dict[str, Any], knob: dict[str, Any], layout: str | None
) -> Any:
    """(plan, model, cluster) from --tp/--pp/...; a broken rule names the flag (stages[0].tp -> --tp)."""
    from hapmoe_milp.config import make_settings
    from hapmoe_milp.knobs import plan_from_knobs
    from hapmoe_milp.plan import check_plan

    m = catalog_model(require(model, "--model", "(or give --plan)"))
    c = catalog_cluster(require(cluster, "--cluster", "(or give --plan)"))
    defaults = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "vpp": 1, "recompute": "none"}
    given = {k: v if v is not None else defaults.get(k) for k, v in knob.items()}
    with flags():
        st = make_settings(m, None, **overrides)
        p = plan_from_knobs(m, c, st, layout=layout, **given)
    try:
        check_plan(p, m, c)
    except PlanError as exc:
        raise exc.at(field=_knob_flag(exc.field)) from None
    return p, m, c


# ---------------------------------------------------------------------- solve
def solve(
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    gbs: GbsOpt = None,
    seq: SeqOpt = None,
    mbs: MbsOpt = None,
    family: FamilyOpt = "both",
    solver: Annotated[
        str | None,
        typer.Option("--solver", help="dp (fast), cpsat or milp (exact), auto. Default: the preset's, else dp."),
    ] = None,
    solver_config: Annotated[
        Path | None,
        typer.Option("--solver-config", help="Preset YAML (solvers/*.yaml) or preset name; flags win over it."),
    ] = None,
    time_limit: TimeLimitOpt = None,
    imbalance: ImbalanceOpt = None,
    precision: PrecisionOpt = None,
    fp8_recipe: Fp8RecipeOpt = None,
    dispatcher: DispatcherOpt = None,
    ep_overlap: EpOverlapOpt = None,
    cuda_graph_scope: CudaGraphOpt = None,
    tp_overlap: TpOverlapOpt = None,
    grad_reduce_in_bf16: GradBf16Opt = None,
    fp8_param_gather: Fp8ParamOpt = None,
    fused_swiglu: FusedSwigluOpt = None,
    fused_rope: FusedRopeOpt = None,
    cross_entropy_fusion: CeFusionOpt = None,
    optimizer_offload: OffloadOpt = "auto",
    out: Annotated[
        Path | None, typer.Option("--out", help="Write plan.json here (with --export: the launch folder).")
    ] = None,
    export: Annotated[
        str | None,
        typer.Option(
            "--export",
            help="megatron, rocm, mindspeed or flagscale: search only plans it runs, write its launch files.",
        ),
    ] = None,
    runtime: RuntimeOpt = "auto",
    plot: Annotated[Path | None, typer.Option("--plot", help="PNG of the simulated 1F1B schedule.")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="Bottleneck, breakdown and runner-up.")] = False,
    fsdp_search: Annotated[
        bool, typer.Option("--fsdp-search", help="Also search Megatron-FSDP (sharded params); keep the faster plan.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Search for the fastest plan that fits; optionally write it and its launch files."""
    from hapmoe_milp.api import families_for, timeout_hint
    from hapmoe_milp.api import solve as api_solve
    from hapmoe_milp.config import SOLVERS, check_choice, check_time_limit, offload_choice
    from hapmoe_milp.export.common import TARGETS
    from hapmoe_milp.runtimes import RUNTIME_CHOICES

    # everything that can be wrong is checked before the search starts
    with flags():
        if solver is not None:
            check_choice("solver", solver, SOLVERS)
        check_choice("runtime", runtime, RUNTIME_CHOICES)
        if export is not None:
            check_choice("export", export, TARGETS)
        families_for(family, export)
        offload = offload_choice(optimizer_offload)
        limit = check_time_limit(time_limit) if time_limit is not None else None
    m = catalog_model(require(model, "--model", "to solve"))
    c = catalog_cluster(require(cluster, "--cluster", "to solve"))
    _check_outputs(out, export, plot)
    preset, chosen, limit = _with_preset(solver_config, solver, limit)
    with flags(), compute() as prog:
        sol = api_solve(
            m,
            c,
            chosen,
            family=family,
            runtime=runtime,
            export=export,
            pruning=preset.pruning if preset else None,
            time_limit=limit,
            optimizer_offload=offload,
            fsdp_search=fsdp_search,
            catalog=STATE.catalog,
            solver_options=preset.options if preset else None,
            progress=prog,
            global_batch_size=gbs,
            seq_length=seq,
            micro_batch_size=mbs,
            imbalance=imbalance,
            precision=precision,
            fp8_recipe=fp8_recipe,
            overlap_ep_comm=ep_overlap,
            dispatcher=dispatcher,
            cuda_graph_scope=cuda_graph_scope,
            tp_comm_overlap=tp_overlap,
            grad_reduce_in_bf16=grad_reduce_in_bf16,
            fp8_param_gather=fp8_param_gather,
            fused_swiglu=fused_swiglu,
            fused_rope=fused_rope,
            cross_entropy_fusion=cross_entropy_fusion,
        )
    assert sol.plan is not None
    with flags():
        _write_outputs(sol.plan, m, c, out, export, plot)
    if sol.status == "timeout":
        note(timeout_hint(sol, limit))
    _show_solution(sol, f"{m.name} on {c.name}", explain, as_json)


def _check_outputs(out: Path | None, export: str | None, plot: Path | None) -> None:
    """Output paths are checked before the search, so a typo costs a second, not the search."""
    from hapmoe_milp.fileio import check_output_dir, check_output_file

    if export is not None:
        check_output_dir(require(out, "--out", "with --export (the folder for the launch files)"), "--out")
    elif out is not None:
        check_output_file(out, "--out")
    if plot is not None:
        from hapmoe_milp.plot import check_png_path, require_matplotlib

        check_output_file(plot, "--plot")
        check_png_path(plot, "--plot")
        require_matplotlib("--plot")


def _with_preset(solver_config: Path | None, solver: str | None, limit: float | None) -> tuple[Any, str, float]:
    """(preset, solver, time limit): flags given explicitly win over the preset, the preset over defaults."""
    from hapmoe_milp.config import DEFAULT_TIME_LIMIT, check_time_limit
    from hapmoe_milp.presets import load_preset

    preset = load_preset(solver_config, STATE.catalog.root) if solver_config else None
    if limit is None:
        limit = preset.time_limit if preset and preset.time_limit is not None else DEFAULT_TIME_LIMIT
        with flags({"time_limit": f"{solver_config}: time_limit"}):
            limit = check_time_limit(limit)
    chosen = solver if solver is not None else (preset.solver if preset else "dp")
    return preset, chosen, limit


def _write_outputs(plan: Any, m: Any, c: Any, out: Path | None, export: str | None, plot: Path | None) -> None:
    written: list[Path] = []
    if export is not None:
        from hapmoe_milp.export import export_plan

        assert out is not None
        written = export_plan(plan, m, c, export, out)  # type: ignore[arg-type]
    elif out is not None:
        written = [plan.write(out, field="--out")]
    if plot is not None:
        from hapmoe_milp.plot import plot_schedule

        with flags({"simulate": "--plot"}):
            plot_schedule(m, c, plan, plot)
    for path in written:
        log.info("wrote %s", path)


def _show_solution(sol: Any, title: str, explain: bool, as_json: bool) -> None:
    from hapmoe_milp import render
    from hapmoe_milp.api import explain as explain_solution
    from hapmoe_milp.api import runtime_label

    pred = sol.plan.predicted
    if as_json:
        note(runtime_label(sol.plan))
        payload = {"plan": sol.plan.to_dict(), "predicted": pred, "solver": sol.certificate()}
        if explain:
            payload["explain"] = explain_solution(sol)
        emit_json(payload)
        return
    con = render.console()
    title = f"{title} — {sol.plan.family} family, pp={sol.plan.pp}, runtime {sol.plan.runtime}"
    con.print(render.stages_table(pred["stages"], title=title))
    con.print(render.STAGES_LEGEND, style="dim")
    con.print(render.summary_line(pred))
    con.print(render.solver_line(sol))
    con.print(runtime_label(sol.plan))
    if explain:
        ex = explain_solution(sol)
        con.print(render.breakdown_table(pred["breakdown"]))
        con.print(render.BREAKDOWN_LEGEND, style="dim")
        con.print(f"bottleneck: stage {ex['bottleneck_stage']} ({ex['bottleneck_device']}); {ex['why']}")
        if ex.get("runner_up"):
            con.print(f"runner-up: {ex['runner_up']}")


# ---------------------------------------------------------------------- export / validate
def _plan_target(target: str | None, plan: Any, default: str | None = None) -> str:
    """The runtime to validate/export for: the flag, else the one the plan was searched for, else
    ``default`` (validate's: megatron, for plan files written before plans named their runtime)."""
    from hapmoe_milp.config import check_choice
    from hapmoe_milp.export.common import TARGETS

    if target is None:
        if plan.runtime in TARGETS:
            return str(plan.runtime)
        if default is not None and plan.runtime is None:
            return default
        why = "was searched in the what-if space" if plan.runtime == "any" else "names no runtime"
        raise SettingsError(f"is needed: the plan {why}; give one of {', '.join(TARGETS)}", field="--target")
    with flags():
        check_choice("target", target, TARGETS)
    return target


def validate(
    plan: Annotated[Path, typer.Argument(help="plan.json")],
    target: TargetOpt = None,
    model: PlanModelOpt = None,
    cluster: PlanClusterOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check a plan against our invariants and the runtime's rules (one named rule per line)."""
    from hapmoe_milp.export.validate import validate as run_validate

    if target is not None:
        _plan_target(target, None)
    p, m, c = plan_with_specs(plan, model, cluster)
    target = _plan_target(target, p, default="megatron")
    found = run_validate(p, m, c, target)  # type: ignore[arg-type]
    errors = [v for v in found if v.severity == "error"]
    if as_json:
        emit_json({"ok": not errors, "violations": [v.__dict__ for v in found]})
    elif not errors:
        typer.echo(f"{plan}: valid for {target}" + (f" ({len(found)} warning(s) on stderr)" if found else ""))
    if not as_json:
        for v in found:
            typer.echo(f"{'error' if v.severity == 'error' else 'warning'}: {plan}: {v}", err=True)
    if errors:
        raise typer.Exit(2)


def export_cmd(
    plan: Annotated[Path, typer.Argument(help="plan.json")],
    out: Annotated[Path, typer.Option("--out", help="Output folder (created if missing).")],
    target: TargetOpt = None,
    model: PlanModelOpt = None,
    cluster: PlanClusterOpt = None,
) -> None:
    """Write launch files: plan.json, the runtime's arguments or config, hostfile, launch scripts."""
    from hapmoe_milp.export import export_plan
    from hapmoe_milp.fileio import check_output_dir

    if target is not None:
        _plan_target(target, None)
    check_output_dir(out, "--out")
    p, m, c = plan_with_specs(plan, model, cluster)
    target = _plan_target(target, p)
    with flags():
        written = export_plan(p, m, c, target, out, source=str(plan))  # type: ignore[arg-type]
    for f in written:
        typer.echo(str(f))
