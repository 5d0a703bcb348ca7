"""Command-line interface: parse, call the API, render. No planning logic lives here."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from hapmoe_milp.errors import HapmoeError, PlanError
from hapmoe_milp.specs.catalog import Catalog

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Heterogeneity-aware parallelism planner for MoE training."
)
log = logging.getLogger("hapmoe_milp")


class _State:
    catalog: Catalog = Catalog()


STATE = _State()


def _clean(o: Any) -> Any:
    """JSON has no NaN/Infinity: write them as null."""
    if isinstance(o, float) and (o != o or o in (float("inf"), float("-inf"))):
        return None
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def _echo_json(obj: Any) -> None:
    typer.echo(json.dumps(_clean(obj), indent=2, default=_json_default))


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and o != o:
        return None
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


@app.callback()
def _main(
    devices_dir: Annotated[
        list[Path] | None,
        typer.Option("--devices-dir", help="extra folder of device tables (e.g. profiled), searched first"),
    ] = None,
    verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, help="-v info, -vv debug logging")] = 0,
) -> None:
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    STATE.catalog = Catalog(devices_dirs=tuple(devices_dir or ()))


# ---------------------------------------------------------------------- catalogs
@app.command()
def models(
    name: Annotated[str | None, typer.Argument(help="catalog name or path (YAML or HF config.json)")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List the model catalog, or show one model (parameter counts, FLOPs per token)."""
    from hapmoe_milp import render

    cat = STATE.catalog
    if name:
        m = cat.model(name)
        d = m.summary()
        d["sources"] = list(m.sources)
        if m.official:
            d["official"] = {
                "total_b": m.official.total_b,
                "active_b": m.official.active_b,
                "active_convention": m.official.active_convention,
            }
        if as_json:
            _echo_json(d)
        else:
            render.console().print(render.kv_table(m.name, d))
        return
    rows = [cat.model(n).summary() for n in cat.model_names()]
    if as_json:
        _echo_json(rows)
    else:
        render.console().print(render.models_table(rows))


@app.command()
def clusters(
    name: Annotated[str | None, typer.Argument(help="catalog name, path, or inline form like 8xh800+16x910b")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List the cluster catalog, or show one cluster."""
    from hapmoe_milp import render

    cat = STATE.catalog
    if name:
        c = cat.cluster(name)
        d = c.summary()
        d["groups"] = [
            {"device": g.device.id, "nodes": g.nodes, "devices_per_node": g.devices_per_node} for g in c.groups
        ]
        d["cross_link"] = {
            "efficiency": c.cross.efficiency,
            "latency_us": c.cross.latency_us,
            "bandwidth_GBps": c.cross.bandwidth_GBps,
            "assumption": c.cross.assumption,
        }
        d["sources"] = list(c.sources)
        if as_json:
            _echo_json(d)
        else:
            render.console().print(render.kv_table(c.name, d))
        return
    rows = [cat.cluster(n).summary() for n in cat.cluster_names()]
    if as_json:
        _echo_json(rows)
    else:
        render.console().print(render.clusters_table(rows))


@app.command()
def devices(
    name: Annotated[str | None, typer.Argument(help="device id or path to a device table")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List device tables, or show one (with its provenance)."""
    from hapmoe_milp import render

    cat = STATE.catalog
    if name:
        dv = cat.device(name)
        d = dv.summary()
        d["origin"] = dv.origin
        d["sources"] = list(dv.sources)
        d["assumptions"] = list(dv.assumptions)
        if dv.profiled:
            d["profiled"] = dict(dv.profiled)
        d["runtime"] = {k: {"value": v, "basis": dv.runtime_basis(k)} for k, v in dv.runtime.to_dict().items()}
        if dv.calibration:
            d["calibration"] = {k: v for k, v in dv.calibration.items() if k != "runs"} | {
                "runs": [r.get("id") for r in dv.calibration.get("runs", [])]
            }
        if as_json:
            _echo_json(d)
        else:
            render.console().print(render.kv_table(f"{dv.id} ({dv.provenance})", d))
        return
    rows = [cat.device(n).summary() for n in cat.device_names()]
    if as_json:
        _echo_json(rows)
    else:
        render.console().print(render.devices_table(rows))


# ---------------------------------------------------------------------- estimate
@app.command()
def estimate(
    model: Annotated[str, typer.Option("--model", "-m", help="catalog name or path")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="catalog name, path, or inline 8xh800+16x910b")],
    plan: Annotated[Path | None, typer.Option("--plan", help="plan.json to evaluate")] = None,
    tp: Annotated[int, typer.Option("--tp")] = 1,
    pp: Annotated[int, typer.Option("--pp")] = 1,
    cp: Annotated[int, typer.Option("--cp")] = 1,
    ep: Annotated[int, typer.Option("--ep")] = 1,
    etp: Annotated[int | None, typer.Option("--etp", help="default: = tp (Megatron's default)")] = None,
    vpp: Annotated[int, typer.Option("--vpp")] = 1,
    mbs: Annotated[int | None, typer.Option("--mbs")] = None,
    gbs: Annotated[int | None, typer.Option("--gbs")] = None,
    seq: Annotated[int | None, typer.Option("--seq")] = None,
    recompute: Annotated[str, typer.Option("--recompute", help="none|selective|full")] = "none",
    layout: Annotated[str | None, typer.Option("--layout", help="Megatron --pipeline-model-parallel-layout")] = None,
    imbalance: Annotated[
        float, typer.Option("--imbalance", help="expert load-imbalance factor (1.0 = balanced)")
    ] = 1.0,
    precision: Annotated[str, typer.Option("--precision", help="bf16|fp8")] = "bf16",
    dispatcher: Annotated[str | None, typer.Option("--dispatcher", help="allgather|alltoall|flex")] = None,
    optimizer_offload: Annotated[bool, typer.Option("--optimizer-offload/--no-optimizer-offload")] = False,
    simulate: Annotated[
        bool, typer.Option("--simulate", help="event-driven 1F1B simulation instead of the closed form")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Predict iteration time, throughput, MFU and memory of one plan."""
    from hapmoe_milp import render
    from hapmoe_milp.api import estimate_plan, make_settings
    from hapmoe_milp.knobs import plan_from_knobs
    from hapmoe_milp.plan import check_plan, load_plan

    if recompute not in ("none", "selective", "full"):
        raise PlanError(f"must be none, selective or full, got {recompute!r}", field="--recompute")
    if precision not in ("bf16", "fp8"):
        raise PlanError(f"must be bf16 or fp8, got {precision!r}", field="--precision")
    if imbalance < 1.0:
        raise PlanError(f"must be >= 1.0 (1.0 = balanced routing), got {imbalance}", field="--imbalance")
    cat = STATE.catalog
    m, c = cat.model(model), cat.cluster(cluster)
    st = make_settings(
        m,
        None,
        micro_batch_size=mbs,
        global_batch_size=gbs,
        seq_length=seq,
        dispatcher=dispatcher,
        precision=precision,
        imbalance=imbalance,
        optimizer_offload=optimizer_offload,
    )
    if plan is not None:
        p = load_plan(plan)
        check_plan(p, m, c, str(plan))
    else:
        p = plan_from_knobs(
            m,
            c,
            tp,
            pp,
            cp,
            ep,
            etp,
            vpp,
            st.micro_batch_size,
            st.global_batch_size,
            st.seq_length,
            recompute,
            layout,
            st.dispatcher,
            precision,
            imbalance,
        )
        check_plan(p, m, c, "--tp/--pp/...")
    est = estimate_plan(m, c, p, settings=st, simulate=simulate, catalog=cat, check=False)
    d = est.to_dict()
    if as_json:
        _echo_json(d)
    else:
        con = render.console()
        con.print(render.stages_table(d["stages"], title=f"{m.name} on {c.name}"))
        con.print(render.summary_line(d))
        con.print(render.breakdown_table(d["breakdown"]))
    worst = est.worst_memory()
    if worst is not None:
        typer.echo(
            f"does not fit: stage {worst['index']} ({worst['device']}) needs {worst['memory_gib']:.1f} GiB, "
            f"capacity {worst['capacity_gib']:.1f} GiB (over by {worst['memory_gib'] - worst['capacity_gib']:.1f} GiB)",
            err=True,
        )


# ---------------------------------------------------------------------- solve
@app.command()
def solve(
    model: Annotated[str, typer.Option("--model", "-m")],
    cluster: Annotated[str, typer.Option("--cluster", "-c")],
    gbs: Annotated[int | None, typer.Option("--gbs")] = None,
    seq: Annotated[int | None, typer.Option("--seq")] = None,
    mbs: Annotated[int | None, typer.Option("--mbs")] = None,
    family: Annotated[str, typer.Option("--family", help="megatron|hetero|both")] = "both",
    solver: Annotated[str, typer.Option("--solver", help="dp|cpsat|milp|auto")] = "dp",
    solver_config: Annotated[
        Path | None, typer.Option("--solver-config", help="preset YAML (solvers/*.yaml) or name")
    ] = None,
    time_limit: Annotated[float | None, typer.Option("--time-limit", help="seconds")] = None,
    imbalance: Annotated[float, typer.Option("--imbalance")] = 1.0,
    precision: Annotated[str, typer.Option("--precision")] = "bf16",
    dispatcher: Annotated[str | None, typer.Option("--dispatcher")] = None,
    optimizer_offload: Annotated[str, typer.Option("--optimizer-offload", help="auto|on|off")] = "auto",
    out: Annotated[
        Path | None, typer.Option("--out", help="write plan.json (or the export folder with --export)")
    ] = None,
    export: Annotated[
        str | None, typer.Option("--export", help="megatron|flagscale: also write launch files to --out")
    ] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="PNG of the simulated 1F1B schedule")] = None,
    explain: Annotated[bool, typer.Option("--explain")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Search for the fastest plan that fits."""
    from hapmoe_milp import render
    from hapmoe_milp.api import solve as api_solve
    from hapmoe_milp.presets import load_preset

    if optimizer_offload not in ("auto", "on", "off"):
        raise PlanError(f"must be auto, on or off, got {optimizer_offload!r}", field="--optimizer-offload")
    preset = load_preset(solver_config, STATE.catalog.root) if solver_config else None
    cat = STATE.catalog
    m, c = cat.model(model), cat.cluster(cluster)
    sol = api_solve(
        m,
        c,
        solver if not (preset and solver == "dp" and preset.solver) else preset.solver,
        family=family,
        pruning=preset.pruning if preset else None,
        time_limit=time_limit if time_limit is not None else (preset.time_limit if preset else None),
        optimizer_offload={"auto": "auto", "on": True, "off": False}[optimizer_offload],
        catalog=cat,
        solver_options=preset.options if preset else None,
        global_batch_size=gbs,
        seq_length=seq,
        micro_batch_size=mbs,
        imbalance=imbalance,
        precision=precision,
        dispatcher=dispatcher,
    )
    assert sol.plan is not None
    pred = sol.plan.predicted
    if out is not None and export is None:
        sol.plan.write(out)
    if export is not None:
        from hapmoe_milp.export import export_plan

        if out is None:
            raise PlanError("--export needs --out DIR", field="--out")
        export_plan(sol.plan, m, c, export, out)
    if plot is not None:
        from hapmoe_milp.plot import plot_schedule

        plot_schedule(m, c, sol.plan, plot)
    if as_json:
        payload = {"plan": sol.plan.to_dict(), "predicted": pred, "solver": sol.certificate()}
        if explain:
            payload["explain"] = _explain(sol)
        _echo_json(payload)
        return
    con = render.console()
    con.print(
        render.stages_table(pred["stages"], title=f"{m.name} on {c.name} — {sol.plan.family} family, pp={sol.plan.pp}")
    )
    con.print(render.summary_line(pred))
    gap = sol.gap
    con.print(
        f"solver {sol.solver}: {sol.status}, objective {sol.objective_s:.4f} s"
        + (f", bound {sol.bound_s:.4f} s, gap {100 * gap:.2f}%" if gap == gap else "")
        + f", {sol.wall_s:.2f} s"
    )
    if explain:
        ex = _explain(sol)
        con.print(render.breakdown_table(pred["breakdown"]))
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
def _plan_context(plan_path: Path, model: str | None, cluster: str | None) -> tuple[Any, Any, Any]:
    from hapmoe_milp.plan import load_plan

    p = load_plan(plan_path)
    cat = STATE.catalog
    return p, cat.model(model or p.model), cat.cluster(cluster or p.cluster)


@app.command()
def validate(
    plan: Annotated[Path, typer.Argument(help="plan.json")],
    target: Annotated[str, typer.Option("--target", help="megatron|flagscale")] = "megatron",
    model: Annotated[str | None, typer.Option("--model", "-m", help="default: the plan's model")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", "-c", help="default: the plan's cluster")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Check a plan against our invariants and the target framework's rules (one rule per check)."""
    from hapmoe_milp.export.validate import validate as run_validate

    if target not in ("megatron", "flagscale"):
        raise PlanError(f"must be megatron or flagscale, got {target!r}", field="--target")
    p, m, c = _plan_context(plan, model, cluster)
    violations = run_validate(p, m, c, target)  # type: ignore[arg-type]
    if as_json:
        _echo_json({"ok": not violations, "violations": [v.__dict__ for v in violations]})
    elif not violations:
        typer.echo(f"{plan}: valid for {target}")
    for v in violations if not as_json else []:
        typer.echo(f"{plan}: {v.field}: {v.message} [{v.rule}]", err=True)
    if violations:
        raise typer.Exit(2)


@app.command("export")
def export_cmd(
    plan: Annotated[Path, typer.Argument(help="plan.json")],
    target: Annotated[str, typer.Option("--target", help="megatron|flagscale")],
    out: Annotated[Path, typer.Option("--out", help="output folder")],
    model: Annotated[str | None, typer.Option("--model", "-m")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", "-c")] = None,
) -> None:
    """Write launch files: plan.json, megatron_args.txt or flagscale.yaml, hostfile, launch_node<k>.sh."""
    from hapmoe_milp.export import export_plan

    p, m, c = _plan_context(plan, model, cluster)
    files = export_plan(p, m, c, target, out)  # type: ignore[arg-type]
    for f in files:
        typer.echo(str(f))


# ---------------------------------------------------------------------- compare
@app.command()
def compare(
    model: Annotated[str, typer.Option("--model", "-m")],
    cluster: Annotated[str, typer.Option("--cluster", "-c")],
    against: Annotated[
        str | None, typer.Option("--against", help="baselines megatron,metis,hetermoe instead of solvers")
    ] = None,
    solvers: Annotated[str, typer.Option("--solvers", help="for solver comparison")] = "dp,dp-exact,cpsat,milp",
    family: Annotated[str, typer.Option("--family")] = "both",
    time_limit: Annotated[float, typer.Option("--time-limit", help="seconds per solver")] = 60.0,
    warm_start: Annotated[bool, typer.Option("--warm-start", help="hand the DP plan to the exact solvers")] = False,
    gbs: Annotated[int | None, typer.Option("--gbs")] = None,
    seq: Annotated[int | None, typer.Option("--seq")] = None,
    mbs: Annotated[int | None, typer.Option("--mbs")] = None,
    optimizer_offload: Annotated[bool, typer.Option("--optimizer-offload/--no-optimizer-offload")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Cross-validate the solvers on one instance, or put our plan next to baselines (HAPMoE Table 2 style)."""
    from hapmoe_milp.api import make_settings

    cat = STATE.catalog
    m, c = cat.model(model), cat.cluster(cluster)
    st = make_settings(
        m, None, global_batch_size=gbs, seq_length=seq, micro_batch_size=mbs, optimizer_offload=optimizer_offload
    )
    if against is not None:
        from hapmoe_milp.baselines import compare_against

        rep = compare_against(
            m,
            c,
            st,
            [a.strip() for a in against.split(",") if a.strip()],
            time_limit=time_limit,
            optimizer_offload="auto" if not optimizer_offload else True,
        )
        rep.pop("solutions", None)
        if as_json:
            _echo_json(rep)
            return
        from rich.table import Table

        from hapmoe_milp import render

        t = Table(title=f"{m.name} on {c.name}: ratios vs Megatron-uniform")
        for col in ("method", "iteration s", "tokens/s", "MFU", "throughput x", "MFU x", "latency x", "plan"):
            t.add_column(col)
        for r in rep["rows"]:

            def f(v: Any, fmt: str) -> str:
                return format(v, fmt) if isinstance(v, int | float) else "-"

            t.add_row(
                str(r.get("method")),
                f(r.get("iteration_time_s"), ".3f"),
                f(r.get("tokens_per_s"), ",.0f"),
                f(r.get("mfu"), ".1%"),
                f(r.get("throughput_ratio"), ".2f"),
                f(r.get("mfu_ratio"), ".2f"),
                f(r.get("latency_ratio"), ".2f"),
                str(r.get("plan", ""))[:60],
            )
        render.console().print(t)
        for n in rep.get("notes", []):
            typer.echo(f"note: {n}")
        return
    from hapmoe_milp.compare import compare_solvers, format_markdown

    rep = compare_solvers(
        m,
        c,
        st,
        solvers=[x.strip() for x in solvers.split(",") if x.strip()],
        time_limit=time_limit,
        family=family,
        warm_start=warm_start,
    )
    if as_json:
        _echo_json(rep)
    else:
        typer.echo(format_markdown(rep))


# ---------------------------------------------------------------------- sweep
@app.command()
def sweep(
    model: Annotated[list[str], typer.Option("--model", "-m", help="one or more models")],
    out: Annotated[Path, typer.Option("--out", help="results JSONL (streamed, one line per finished case)")],
    clusters: Annotated[str | None, typer.Option("--clusters", help="comma-separated clusters (names/inline)")] = None,
    mix: Annotated[list[str] | None, typer.Option("--mix", help="DEVICE:MIN-MAX:STEP, repeatable")] = None,
    budget: Annotated[str | None, typer.Option("--budget", help="devices<=N and/or price<=X")] = None,
    prices: Annotated[str | None, typer.Option("--prices", help="h800=2.5,910b=1.2 (per device-hour)")] = None,
    backend: Annotated[str, typer.Option("--backend", help="local|ray")] = "local",
    address: Annotated[str | None, typer.Option("--address", help="join an existing Ray cluster")] = None,
    workers: Annotated[int | None, typer.Option("--workers")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="skip cases already in --out")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite")] = False,
    solver: Annotated[str, typer.Option("--solver")] = "dp",
    time_limit: Annotated[float | None, typer.Option("--time-limit")] = None,
    gbs: Annotated[int | None, typer.Option("--gbs")] = None,
    seq: Annotated[int | None, typer.Option("--seq")] = None,
    family: Annotated[str | None, typer.Option("--family")] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="PNG: throughput vs devices (or price), Pareto front")
    ] = None,
    x: Annotated[str, typer.Option("--x", help="devices|price for --plot")] = "devices",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Solve many (model x cluster mix x settings) cases, locally or on Ray; resumable."""
    from rich.table import Table

    from hapmoe_milp import render
    from hapmoe_milp.sweep import best_table, cases_from_clusters, cases_from_mix, parse_prices, plot_sweep, run_sweep

    if (clusters is None) == (not mix):
        raise PlanError("give either --clusters or --mix", field="--clusters")
    grid: dict[str, list[Any]] = {}
    for k, v in (("global_batch_size", gbs), ("seq_length", seq), ("family", family)):
        if v is not None:
            grid[k] = [v]
    price_map = parse_prices(prices)
    if clusters is not None:
        names = [c.strip() for c in clusters.split(",") if c.strip()]
        cases = cases_from_clusters(model, names, grid or None, prices=price_map)
    else:
        cases = cases_from_mix(
            model, list(mix or ()), budget, prices=price_map, settings_grid=grid or None, catalog=STATE.catalog
        )
    summary = run_sweep(
        cases,
        out,
        backend=backend,
        workers=workers,
        address=address,
        resume=resume,
        overwrite=overwrite,
        time_limit=time_limit,
        solver=solver,
        progress=not as_json,
        catalog=STATE.catalog,
    )
    best = best_table(summary.rows)
    if plot is not None:
        plot_sweep(summary.rows, plot, x=x)  # type: ignore[arg-type]
    if as_json:
        _echo_json(
            {
                "out": str(summary.out),
                "total": summary.total,
                "skipped": summary.skipped,
                "ran": summary.ran,
                "ok": summary.ok,
                "errors": summary.errors,
                "wall_s": summary.wall_s,
                "best": best,
            }
        )
        return
    t = Table(title=f"Best mixes ({summary.ok} ok, {summary.errors} errors, {summary.skipped} resumed)")
    for col in ("model", "metric", "cluster", "composition", "value", "tokens/s", "devices"):
        t.add_column(col)
    for r in best:
        t.add_row(
            r["model"],
            r["label"],
            r["cluster"],
            r["composition"],
            f"{r['value']:,.4g}",
            f"{r['tokens_per_s']:,.0f}",
            str(r["devices"]),
        )
    render.console().print(t)


# ---------------------------------------------------------------------- profiler
@app.command()
def profile(
    device_name: Annotated[str, typer.Option("--device-name", help="id of the table to write (file <id>.yaml)")],
    out: Annotated[Path, typer.Option("--out", help="output folder or .yaml path")],
    quick: Annotated[bool, typer.Option("--quick", help="few sizes, few repeats")] = False,
    backend: Annotated[str, typer.Option("--backend", help="auto|cuda|rocm|npu|cpu")] = "auto",
    base: Annotated[
        str | None, typer.Option("--base", help="shipped device to take fabric/NIC/collectives from")
    ] = None,
    peak_tflops: Annotated[
        float | None, typer.Option("--peak-tflops", help="dense BF16 peak (else built-in/measured)")
    ] = None,
    collectives: Annotated[
        list[Path] | None, typer.Option("--collectives", help="JSON from hapmoe_milp.profiler.collectives")
    ] = None,
    nproc: Annotated[int | None, typer.Option("--nproc", help="also run local collectives with N processes")] = None,
) -> None:
    """Measure this machine's device table with PyTorch (optional extra `profile`)."""
    from hapmoe_milp.profiler import launch_local_collectives, profile_device, write_device_table

    target_dir = out if out.suffix not in (".yaml", ".yml") else out.parent
    target_dir.mkdir(parents=True, exist_ok=True)
    meas = profile_device(device_name, quick=quick, backend=backend, peak_tflops=peak_tflops)
    colls = list(collectives or ())
    if nproc:
        colls.append(launch_local_collectives(nproc, target_dir / f"{device_name}-intra.json", quick=quick))
    base_dev = STATE.catalog.device(base) if base else None
    path = write_device_table(meas, target_dir, device_name=device_name, base=base_dev, collectives=colls)
    typer.echo(str(path))


@app.command("compare-profile")
def compare_profile(
    profiled: Annotated[str, typer.Argument(help="profiled device id or path")],
    shipped: Annotated[str, typer.Argument(help="shipped device id or path")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Profiled vs shipped table side by side, with the ratio per entry."""
    from hapmoe_milp.profiler import compare_tables, format_rows, summarize_rows

    cat = STATE.catalog
    rows = compare_tables(cat.device(profiled), cat.device(shipped))
    if as_json:
        _echo_json({"rows": [r.to_dict() for r in rows], "summary": summarize_rows(rows)})
        return
    typer.echo(format_rows(rows))
    for k, v in summarize_rows(rows).items():
        typer.echo(f"{k}: geometric-mean ratio {v:.3f}")


# ---------------------------------------------------------------------- calibration
@app.command()
def calibrate(
    runs: Annotated[Path, typer.Argument(help="measured runs (YAML with a runs: list, or CSV)")],
    device: Annotated[str, typer.Option("--device", help="device table to fit (its runs are those that use it)")],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="folder for the calibrated table (default: the catalog's devices-calibrated)"),
    ] = None,
    params: Annotated[
        str | None, typer.Option("--params", help="comma-separated runtime terms to fit (default: the usual set)")
    ] = None,
    loo: Annotated[bool, typer.Option("--loo/--no-loo", help="leave-one-out cross-validated error")] = True,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Fit a device table's runtime terms to measured runs and write it with provenance `calibrated`."""
    from hapmoe_milp import __version__, render
    from hapmoe_milp.calibration import DEFAULT_FIT, summarize
    from hapmoe_milp.calibration import calibrate as run_calibration

    names = [n.strip() for n in params.split(",") if n.strip()] if params else list(DEFAULT_FIT)
    cat = STATE.catalog
    res = run_calibration(
        runs, device, catalog=cat, params=names, out=out or cat.calibrated_dir, loo=loo, version=__version__
    )
    after = summarize(res.before, res.fit.errors)
    before = res.summary_before()
    loo_s = res.summary_loo()
    if as_json:
        _echo_json(
            {
                "device": res.device,
                "path": res.path,
                "parameters": [p.to_dict() for p in res.fit.params],
                "runs": [
                    {**b.to_dict(), "error_after": e, **({"error_loo": lo} if res.loo else {})}
                    for b, e, lo in zip(res.before, res.fit.errors, res.loo or res.fit.errors, strict=True)
                ],
                "before": before.to_dict(),
                "after": after.to_dict(),
                "leave_one_out": loo_s.to_dict() if loo_s else None,
            }
        )
        return
    con = render.console()
    con.print(render.params_table(res.fit.params, f"{res.device}: fitted runtime terms"))
    con.print(render.calibration_runs_table(res.before, res.fit.errors, res.loo))
    line = (
        f"MAPE before {before.mape:.1%} (worst {before.worst:.1%}) -> after {after.mape:.1%} (worst {after.worst:.1%})"
    )
    if loo_s is not None:
        line += f" | leave-one-out {loo_s.mape:.1%} (worst {loo_s.worst:.1%}, {loo_s.worst_id})"
    typer.echo(line)
    typer.echo(f"wrote {res.path}")


@app.command()
def fidelity(
    runs: Annotated[Path, typer.Argument(help="measured runs (YAML with a runs: list, or CSV)")],
    device: Annotated[str | None, typer.Option("--device", help="only runs that use this device type")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Predicted vs measured step time per run, with the error and the cost breakdown."""
    from hapmoe_milp import render
    from hapmoe_milp.calibration import load_runs, predict, prepare, runs_for, summarize

    cat = STATE.catalog
    prepared = [prepare(r, cat) for r in load_runs(runs)]
    if device is not None:
        prepared = runs_for(cat.device(device).id, prepared)
    results = [predict(r) for r in prepared]
    summary = summarize(results)
    if as_json:
        _echo_json({"runs": [r.to_dict() for r in results], "summary": summary.to_dict()})
        return
    con = render.console()
    con.print(render.fidelity_table(results))
    typer.echo(
        f"{summary.runs} runs: MAPE {summary.mape:.1%}, worst {summary.worst:.1%} ({summary.worst_id}), "
        f"mean error {summary.bias:+.1%}; same-model pairs ranked right {summary.pairs_agree}/{summary.pairs}"
    )


def main() -> None:
    try:
        rc = app(standalone_mode=False)
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except HapmoeError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as e:  # click usage errors and the like
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(2)
        raise


if __name__ == "__main__":  # pragma: no cover
    main()
