"""Planning commands: ``estimate`` one plan, ``solve`` for the best, ``validate`` and ``export`` a plan file."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from hapmoe_milp.cli.options import (
    FLAGS,
    STATE,
    ClusterOpt,
    DispatcherOpt,
    FamilyOpt,
    GbsOpt,
    ImbalanceOpt,
    JsonOpt,
    MbsOpt,
    ModelOpt,
    PlanClusterOpt,
    PlanModelOpt,
    PrecisionOpt,
    RuntimeOpt,
    SeqOpt,
    TargetOpt,
    TimeLimitOpt,
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
        str | None, typer.Option("--recompute", help="Activation recompute: none, selective or full.")
    ] = None,
    layout: Annotated[
        str | None, typer.Option("--layout", help="Megatron --pipeline-model-parallel-layout string.")
    ] = None,
    imbalance: ImbalanceOpt = None,
    precision: PrecisionOpt = None,
    dispatcher: DispatcherOpt = None,
    optimizer_offload: Annotated[
        bool | None,
        typer.Option("--optimizer-offload/--no-optimizer-offload", help="Optimizer states in host memory."),
    ] = None,
    simulate: Annotated[
        bool, typer.Option("--simulate", help="Event-driven 1F1B simulation instead of the closed form.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Predict iteration time, throughput, MFU and memory of one plan (a file, or --tp/--pp/... knobs)."""
    from hapmoe_milp import render
    from hapmoe_milp.api import estimate_plan, make_settings
    from hapmoe_milp.knobs import plan_from_knobs
    from hapmoe_milp.plan import check_plan

    overrides = settings_kw(
        micro_batch_size=mbs,
        global_batch_size=gbs,
        seq_length=seq,
        dispatcher=dispatcher,
        precision=precision,
        imbalance=imbalance,
        optimizer_offload=optimizer_offload,
    )
    if plan is not None:
        knobs = {"--tp": tp, "--pp": pp, "--cp": cp, "--ep": ep, "--etp": etp, "--vpp": vpp}
        knobs.update({"--recompute": recompute, "--layout": layout})
        for flag, v in knobs.items():
            if v is not None:
                raise SettingsError("cannot be combined with --plan (the plan fixes the layout)", field=flag)
        p, m, c = plan_with_specs(plan, model, cluster)
        if overrides:
            with flags():
                st = p.settings().with_(**overrides)
            note(
                "evaluating under "
                + ", ".join(f"{FLAGS[k]} {v}" for k, v in overrides.items())
                + f" instead of the settings {plan} was solved under"
            )
            p = p.with_settings(st)
        check_plan(p, m, c, str(plan))
    else:
        m = catalog_model(require(model, "--model", "(or give --plan)"))
        c = catalog_cluster(require(cluster, "--cluster", "(or give --plan)"))
        with flags():
            st = make_settings(m, None, **overrides)
            p = plan_from_knobs(
                m,
                c,
                st,
                tp=tp if tp is not None else 1,
                pp=pp if pp is not None else 1,
                cp=cp if cp is not None else 1,
                ep=ep if ep is not None else 1,
                etp=etp,
                vpp=vpp if vpp is not None else 1,
                recompute=recompute if recompute is not None else "none",
                layout=layout,
            )
        try:
            check_plan(p, m, c)
        except PlanError as exc:  # the plan came from flags: name the flag (stages[0].tp -> --tp)
            raise exc.at(field=_knob_flag(exc.field)) from None
    with compute():
        est = estimate_plan(m, c, p, simulate=simulate, catalog=STATE.catalog, check=False)
    d = est.to_dict()
    if as_json:
        emit_json(d)
    else:
        con = render.console()
        con.print(render.stages_table(d["stages"], title=f"{m.name} on {c.name} — {p.family} family, pp={p.pp}"))
        con.print(render.STAGES_LEGEND, style="dim")
        con.print(render.summary_line(d))
        con.print(render.breakdown_table(d["breakdown"]))
        con.print(render.BREAKDOWN_LEGEND, style="dim")
    worst = est.worst_memory()
    if worst is not None:
        typer.echo(
            f"does not fit: stage {worst['index']} ({worst['device']}) needs {worst['memory_gib']:.1f} GiB, "
            f"capacity {worst['capacity_gib']:.1f} GiB (over by {worst['memory_gib'] - worst['capacity_gib']:.1f} GiB)",
            err=True,
        )


# ---------------------------------------------------------------------- solve
def solve(
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    gbs: GbsOpt = None,
    seq: SeqOpt = None,
    mbs: MbsOpt = None,
    family: FamilyOpt = "both",
    solver: Annotated[str, typer.Option("--solver", help="dp (fast), cpsat or milp (exact), auto.")] = "dp",
    solver_config: Annotated[
        Path | None, typer.Option("--solver-config", help="Preset YAML (solvers/*.yaml) or preset name.")
    ] = None,
    time_limit: TimeLimitOpt = None,
    imbalance: ImbalanceOpt = None,
    precision: PrecisionOpt = None,
    dispatcher: DispatcherOpt = None,
    optimizer_offload: Annotated[
        str, typer.Option("--optimizer-offload", help="auto (only if nothing fits), on or off.")
    ] = "auto",
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
    as_json: JsonOpt = False,
) -> None:
    """Search for the fastest plan that fits; optionally write it and its launch files."""
    from hapmoe_milp import render
    from hapmoe_milp.api import DEFAULT_TIME_LIMIT, runtime_label, timeout_hint
    from hapmoe_milp.api import solve as api_solve
    from hapmoe_milp.config import check_choice, check_time_limit
    from hapmoe_milp.export.common import TARGETS
    from hapmoe_milp.fileio import check_output_dir, check_output_file
    from hapmoe_milp.presets import load_preset
    from hapmoe_milp.runtimes import RUNTIME_CHOICES

    # everything that can be wrong is checked before the search starts
    with flags():
        check_choice("solver", solver, ("dp", "cpsat", "milp", "auto"))
        check_choice("family", family, ("both", "megatron", "hetero"))
        check_choice("runtime", runtime, RUNTIME_CHOICES)
        if export is not None:
            check_choice("export", export, TARGETS)
        check_choice("optimizer_offload", optimizer_offload, ("auto", "on", "off"))
        limit = check_time_limit(time_limit) if time_limit is not None else None
    m = catalog_model(require(model, "--model", "to solve"))
    c = catalog_cluster(require(cluster, "--cluster", "to solve"))
    if export is not None:
        check_output_dir(require(out, "--out", "with --export (the folder for the launch files)"), "--out")
    elif out is not None:
        check_output_file(out, "--out")
    if plot is not None:
        from hapmoe_milp.plot import require_matplotlib

        check_output_file(plot, "--plot")
        require_matplotlib("--plot")
    preset = load_preset(solver_config, STATE.catalog.root) if solver_config else None
    if limit is None:
        limit = preset.time_limit if preset and preset.time_limit is not None else DEFAULT_TIME_LIMIT
        with flags({"time_limit": f"{solver_config}: time_limit"}):
            limit = check_time_limit(limit)
    chosen = preset.solver if (preset and solver == "dp" and preset.solver) else solver
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
            optimizer_offload={"auto": "auto", "on": True, "off": False}[optimizer_offload],
            catalog=STATE.catalog,
            solver_options=preset.options if preset else None,
            progress=prog,
            global_batch_size=gbs,
            seq_length=seq,
            micro_batch_size=mbs,
            imbalance=imbalance,
            precision=precision,
            dispatcher=dispatcher,
        )
    assert sol.plan is not None
    pred = sol.plan.predicted
    written: list[Path] = []
    if export is not None:
        from hapmoe_milp.export import export_plan

        assert out is not None
        written = export_plan(sol.plan, m, c, export, out)  # type: ignore[arg-type]
    elif out is not None:
        written = [sol.plan.write(out)]
    if plot is not None:
        from hapmoe_milp.plot import plot_schedule

        plot_schedule(m, c, sol.plan, plot)
    if sol.status == "timeout":
        note(timeout_hint(sol, limit))
    for path in written:
        log.info("wrote %s", path)
    if as_json:
        note(runtime_label(sol.plan))
        payload = {"plan": sol.plan.to_dict(), "predicted": pred, "solver": sol.certificate()}
        if explain:
            payload["explain"] = _explain(sol)
        emit_json(payload)
        return
    con = render.console()
    con.print(
        render.stages_table(
            pred["stages"],
            title=f"{m.name} on {c.name} — {sol.plan.family} family, pp={sol.plan.pp}, runtime {sol.plan.runtime}",
        )
    )
    con.print(render.STAGES_LEGEND, style="dim")
    con.print(render.summary_line(pred))
    con.print(render.solver_line(sol))
    con.print(runtime_label(sol.plan))
    if explain:
        ex = _explain(sol)
        con.print(render.breakdown_table(pred["breakdown"]))
        con.print(render.BREAKDOWN_LEGEND, style="dim")
        con.print(f"bottleneck: stage {ex['bottleneck_stage']} ({ex['bottleneck_device']}); {ex['why']}")
        if ex.get("runner_up"):
            con.print(f"runner-up: {ex['runner_up']}")


def _explain(sol: Any) -> dict[str, Any]:
    plan = sol.plan
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
        ru = sol.runner_up
        out["runner_up"] = (
            f"{ru.family} pp={ru.pp} "
            + ", ".join(f"{s.device}:{s.num_layers}L {s.cfg.label()}" for s in ru.stages)
            + f" at {sol.runner_up_s:.4f} s (+{100 * (sol.runner_up_s / sol.objective_s - 1):.2f}%)"
        )
    return out


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
    for f in export_plan(p, m, c, target, out, source=str(plan)):  # type: ignore[arg-type]
        typer.echo(str(f))
