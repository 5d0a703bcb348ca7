"""Measurement commands: ``profile`` a device, ``compare-profile`` tables, ``calibrate`` and ``fidelity``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hapmoe_milp.cli.options import STATE, JsonOpt, flags
from hapmoe_milp.cli.output import compute, emit_json
from hapmoe_milp.errors import HapmoeError


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
    from hapmoe_milp.profiler import launch_local_collectives, profile_device, require_torch, write_device_table
    from hapmoe_milp.profiler.collectives import check_local_ranks, load_collectives
    from hapmoe_milp.specs._fields import check_name

    check_name(device_name, None, "--device-name")
    target_dir = out if out.suffix not in (".yaml", ".yml") else out.parent
    check_output_dir(target_dir, "--out")
    base_dev = STATE.catalog.device(base, "", "--base") if base else None
    with flags():  # what can be checked is checked before measuring (minutes), not after
        if nproc is not None:
            check_local_ranks(nproc)
    colls: list[Any] = [load_collectives(c) for c in collectives or ()]
    require_torch()
    with flags(), compute():
        meas = profile_device(device_name, quick=quick, backend=backend, peak_tflops=peak_tflops)
        # created only now: whatever the profiler refuses (no torch, a bad --peak-tflops) leaves nothing behind
        target_dir.mkdir(parents=True, exist_ok=True)
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
        str | None, typer.Option("--params", help="Comma-separated runtime terms to consider (default: all).")
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Fit every identified term and write, even if cross-validation says worse."),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Fit a device table's identifiable runtime terms to measured runs; write it as `calibrated`."""
    from hapmoe_milp import __version__, render
    from hapmoe_milp.calibration import calibrate as run_calibration
    from hapmoe_milp.fileio import check_output_dir

    names = [n.strip() for n in params.split(",") if n.strip()] if params else None
    if params is not None and not names:
        raise HapmoeError("names no runtime term to fit (leave it out for the usual set)", field="--params")
    cat = STATE.catalog
    target = check_output_dir(out or cat.calibrated_dir, "--out")
    with flags(), compute():
        res = run_calibration(runs, device, catalog=cat, params=names, out=target, force=force, version=__version__)
    if as_json:
        emit_json(res.to_dict())
        return
    before, cv, cv0 = res.summary_before(), res.summary_cv(), res.summary_cv_uncalibrated()
    for line in [*res.pooled.report(), *res.notes]:
        typer.echo(line, err=True)
    con = render.console()
    con.print(render.fitted_terms_table(res.fit.params, f"{res.device}: fitted runtime terms ({res.chosen})"))
    con.print(render.calibration_runs_table(res.before, res.fit.errors, res.cv.get(res.chosen)))
    base = f"{res.base.id} {res.base.provenance}" + (" (public fit)" if res.base.provenance == "calibrated" else "")
    line = f"base table {base}: MAPE {before.mape:.1%} (worst {before.worst:.1%})"
    if cv is not None and cv0 is not None:
        line += f" | leave-one-run-out: base {cv0.mape:.1%}, calibrated {cv.mape:.1%} (worst {cv.worst:.1%})"
    else:
        line += " | one run: no cross-validation"
    typer.echo(line)
    typer.echo(f"wrote {res.path}" if res.path else "nothing written")


def fidelity(
    runs: RunsArg,
    device: Annotated[str | None, typer.Option("--device", help="Only the runs that use this device type.")] = None,
    cross_validate: Annotated[
        str | None,
        typer.Option(
            "--cross-validate",
            help="Also predict each run from a fit to the others: run, model, source (comma list) or all.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Predicted vs measured step time per run; in-sample and cross-validated errors."""
    from hapmoe_milp import render
    from hapmoe_milp.calibration import load_runs, prepare, runs_for, runs_path
    from hapmoe_milp.calibration.report import LABELS, evaluate, parse_kinds

    cat = STATE.catalog
    kinds = parse_kinds(cross_validate)
    with compute():
        prepared = [prepare(r, cat) for r in load_runs(runs_path(runs, cat.root))]
        if device is not None:
            prepared = runs_for(cat.device(device, "", "--device").id, prepared)
        if not prepared:
            raise HapmoeError("no run in the file uses that device", field="--device")
        ev = evaluate(prepared, cat, kinds)
    if as_json:
        emit_json(ev.to_dict())
        return
    con = render.console()
    con.print(render.fidelity_table(ev))
    for col, s in ev.summaries().items():
        label = LABELS[col] + (" (in-sample where marked *)" if col == "planner" and any(ev.in_sample) else "")
        typer.echo(
            f"{label}: {s.runs} runs, MAPE {s.mape:.1%}, worst {s.worst:.1%} ({s.worst_id}), "
            f"mean {s.bias:+.1%}; same-model pairs ranked right {s.pairs_agree}/{s.pairs}"
        )
