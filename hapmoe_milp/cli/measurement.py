"""Measurement commands: ``profile`` a device, ``compare-profile`` tables, ``calibrate`` and ``fidelity``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hapmoe_milp.cli.options import STATE, JsonOpt, flags
from hapmoe_milp.cli.output import compute, emit_json


# ---------------------------------------------------------------------- profiler
def profile(
    device_name: Annotated[str, typer.Option("--device-name", help="Id of the table to write (file <id>.yaml).")],
    out: Annotated[Path, typer.Option("--out", help="Output folder, or a .yaml path.")],
    quick: Annotated[bool, typer.Option("--quick", help="Few sizes, few repeats.")] = False,
    backend: Annotated[str, typer.Option("--backend", help="auto, cuda, rocm, npu or cpu.")] = "auto",
    base: Annotated[
        str | None, typer.Option("--base", help="Shipped device to take fabric/NIC/collectives from.")
    ] = None,
    peak_tflops: Annotated[
        float | None, typer.Option("--peak-tflops", help="Dense BF16 peak (else built-in or measured).")
    ] = None,
    collectives: Annotated[
        list[Path] | None, typer.Option("--collectives", help="JSON from hapmoe_milp.profiler.collectives.")
    ] = None,
    nproc: Annotated[int | None, typer.Option("--nproc", help="Also run local collectives with N processes.")] = None,
) -> None:
    """Measure this machine's device table with PyTorch (optional extra `profile`)."""
    from hapmoe_milp.fileio import check_output_dir
    from hapmoe_milp.profiler import launch_local_collectives, profile_device, write_device_table
    from hapmoe_milp.specs._fields import check_name

    check_name(device_name, None, "--device-name")
    target_dir = out if out.suffix not in (".yaml", ".yml") else out.parent
    check_output_dir(target_dir, "--out")
    target_dir.mkdir(parents=True, exist_ok=True)
    base_dev = STATE.catalog.device(base, "", "--base") if base else None
    with flags(), compute():
        meas = profile_device(device_name, quick=quick, backend=backend, peak_tflops=peak_tflops)
        colls = list(collectives or ())
        if nproc:
            colls.append(launch_local_collectives(nproc, target_dir / f"{device_name}-intra.json", quick=quick))
        path = write_device_table(meas, target_dir, device_name=device_name, base=base_dev, collectives=colls)
    typer.echo(str(path))


def compare_profile(
    profiled: Annotated[str, typer.Argument(help="Profiled device id or path.")],
    shipped: Annotated[str, typer.Argument(help="Shipped device id or path.")],
    as_json: JsonOpt = False,
) -> None:
    """Profiled vs shipped table side by side, with the ratio per entry."""
    from hapmoe_milp.profiler import compare_tables, format_rows, summarize_rows

    cat = STATE.catalog
    rows = compare_tables(cat.device(profiled, "", "profiled"), cat.device(shipped, "", "shipped"))
    if as_json:
        emit_json({"rows": [r.to_dict() for r in rows], "summary": summarize_rows(rows)})
        return
    typer.echo(format_rows(rows))
    for k, v in summarize_rows(rows).items():
        typer.echo(f"{k}: geometric-mean ratio {v:.3f}")


# ---------------------------------------------------------------------- calibration
RunsArg = Annotated[
    str, typer.Argument(help="Measured runs: YAML with a runs: list, or CSV; `public` = the shipped set.")
]


def calibrate(
    runs: RunsArg,
    device: Annotated[str, typer.Option("--device", help="Device table to fit (fitted to the runs that use it).")],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Folder for the calibrated table (default: clusters/devices-calibrated)."),
    ] = None,
    params: Annotated[
        str | None, typer.Option("--params", help="Comma-separated runtime terms to fit (default: the usual set).")
    ] = None,
    loo: Annotated[bool, typer.Option("--loo/--no-loo", help="Leave-one-out cross-validated error.")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Fit a device table's runtime terms to measured runs; write it as `calibrated`."""
    from hapmoe_milp import __version__, render
    from hapmoe_milp.calibration import DEFAULT_FIT
    from hapmoe_milp.calibration import calibrate as run_calibration
    from hapmoe_milp.fileio import check_output_dir

    names = [n.strip() for n in params.split(",") if n.strip()] if params else list(DEFAULT_FIT)
    cat = STATE.catalog
    target = check_output_dir(out or cat.calibrated_dir, "--out")
    with flags(), compute():
        res = run_calibration(runs, device, catalog=cat, params=names, out=target, loo=loo, version=__version__)
    if as_json:
        emit_json(res.to_dict())
        return
    after = res.summary_after()
    before = res.summary_before()
    loo_s = res.summary_loo()
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


def fidelity(
    runs: RunsArg,
    device: Annotated[str | None, typer.Option("--device", help="Only the runs that use this device type.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Predicted vs measured step time per run, with the error and the cost breakdown."""
    from hapmoe_milp import render
    from hapmoe_milp.calibration import load_runs, predict, prepare, runs_for, runs_path, summarize

    cat = STATE.catalog
    with compute():
        prepared = [prepare(r, cat) for r in load_runs(runs_path(runs, cat.root))]
        if device is not None:
            prepared = runs_for(cat.device(device, "", "--device").id, prepared)
        results = [predict(r) for r in prepared]
    summary = summarize(results)
    if as_json:
        emit_json({"runs": [r.to_dict() for r in results], "summary": summary.to_dict()})
        return
    con = render.console()
    con.print(render.fidelity_table(results))
    typer.echo(
        f"{summary.runs} runs: MAPE {summary.mape:.1%}, worst {summary.worst:.1%} ({summary.worst_id}), "
        f"mean error {summary.bias:+.1%}; same-model pairs ranked right {summary.pairs_agree}/{summary.pairs}"
    )
