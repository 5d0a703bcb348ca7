"""Study commands: ``compare`` (solvers against each other, or our plan against baselines) and ``sweep``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hapmoe_milp.cli.options import (
    STATE,
    ClusterOpt,
    FamilyOpt,
    GbsOpt,
    JsonOpt,
    MbsOpt,
    ModelOpt,
    OffloadOpt,
    SeqOpt,
    catalog_cluster,
    catalog_model,
    flags,
    require,
)
from hapmoe_milp.cli.output import compute, emit_json, stderr_is_tty, stdout_to_stderr
from hapmoe_milp.errors import InfeasibleError, SettingsError


# ---------------------------------------------------------------------- compare
def compare(
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    against: Annotated[
        str | None, typer.Option("--against", help="Baselines (megatron,metis,hetermoe) instead of solvers.")
    ] = None,
    solvers: Annotated[
        str, typer.Option("--solvers", help="Solvers to cross-validate, comma-separated.")
    ] = "dp,dp-exact,cpsat,milp",
    family: FamilyOpt = "both",
    time_limit: Annotated[
        float, typer.Option("--time-limit", help="Seconds for the whole comparison, shared by the solvers, > 0.")
    ] = 60.0,
    warm_start: Annotated[bool, typer.Option("--warm-start", help="Hand the DP plan to the exact solvers.")] = False,
    runtimes: Annotated[
        bool, typer.Option("--runtimes", help="Best plan per runtime that runs the cluster, next to --runtime any.")
    ] = False,
    gbs: GbsOpt = None,
    seq: SeqOpt = None,
    mbs: MbsOpt = None,
    optimizer_offload: OffloadOpt = "auto",
    as_json: JsonOpt = False,
) -> None:
    """Cross-validate the solvers on one instance, or put our plan next to baselines (HAPMoE Table 2 style)."""
    from hapmoe_milp.api import families_for
    from hapmoe_milp.config import check_time_limit, make_settings, offload_choice

    m = catalog_model(require(model, "--model", "to compare"))
    c = catalog_cluster(require(cluster, "--cluster", "to compare"))
    with flags():
        families_for(family, None)
        limit = check_time_limit(time_limit)
        offload = offload_choice(optimizer_offload)
        # the solvers are cross-checked on one fixed setting: auto compares them without offload
        st = make_settings(m, None, global_batch_size=gbs, seq_length=seq, micro_batch_size=mbs)
        st = st.with_(optimizer_offload=offload is True)
    if runtimes:
        from hapmoe_milp.compare import compare_runtimes, format_runtimes_markdown

        with compute():
            rep = compare_runtimes(m, c, st, time_limit=limit, optimizer_offload=offload)
        if as_json:
            emit_json(rep)
        else:
            typer.echo(format_runtimes_markdown(rep))
        return
    if against is not None:
        from hapmoe_milp.baselines import compare_against

        names = [a.strip() for a in against.split(",") if a.strip()]
        if not names:
            raise SettingsError("needs at least one baseline (megatron, metis, hetermoe)", field="--against")
        with compute():
            rep = compare_against(m, c, st, names, time_limit=limit, optimizer_offload=offload)
        rep.pop("solutions", None)
        if not any(r.get("iteration_time_s") for r in rep["rows"]):  # nothing to compare: one line, exit 2
            why = "; ".join(f"{r['method']}: {r['status']}" for r in rep["rows"])
            raise InfeasibleError(f"no method found a plan ({why}); give them more time", field="--time-limit")
        if as_json:
            emit_json(rep)
            return
        from hapmoe_milp import render

        render.console().print(render.baselines_table(rep, f"{m.name} on {c.name}: ratios vs Megatron-uniform"))
        for n in rep.get("notes", []):
            typer.echo(f"note: {n}")
        return
    from hapmoe_milp.compare import compare_solvers, format_markdown, nothing_found

    names = [x.strip() for x in solvers.split(",") if x.strip()]
    if not names:
        raise SettingsError("needs at least one solver (dp, dp-exact, cpsat, milp)", field="--solvers")
    with compute():
        rep = compare_solvers(
            m, c, st, solvers=names, time_limit=None, budget_s=limit, family=family, warm_start=warm_start
        )
    missing = nothing_found(rep)
    if missing:  # nothing to compare: one line, exit 2 (not a table of blanks)
        raise InfeasibleError(missing, field=None if missing.startswith("no plan fits") else "--time-limit")
    if as_json:
        emit_json(rep)
    else:
        typer.echo(format_markdown(rep))


# ---------------------------------------------------------------------- sweep
def sweep(
    model: Annotated[list[str], typer.Option("--model", "-m", help="Model(s) to sweep; repeat for several.")],
    out: Annotated[Path, typer.Option("--out", help="Results JSONL (one line per finished case).")],
    clusters: Annotated[
        str | None, typer.Option("--clusters", help="Comma-separated clusters (names or inline forms).")
    ] = None,
    mix: Annotated[
        list[str] | None, typer.Option("--mix", help="DEVICE:MIN-MAX:STEP counts to combine; repeatable.")
    ] = None,
    budget: Annotated[str | None, typer.Option("--budget", help="devices<=N and/or price<=X.")] = None,
    prices: Annotated[str | None, typer.Option("--prices", help="Per device-hour, e.g. h800=2.5,910b=1.2.")] = None,
    backend: Annotated[str, typer.Option("--backend", help="local (process pool) or ray.")] = "local",
    address: Annotated[str | None, typer.Option("--address", help="Join an existing Ray cluster.")] = None,
    workers: Annotated[int | None, typer.Option("--workers", help="Parallel cases (default: CPUs).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Skip cases already in --out.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Start --out afresh.")] = False,
    solver: Annotated[str, typer.Option("--solver", help="dp, cpsat, milp or auto.")] = "dp",
    time_limit: Annotated[
        float | None, typer.Option("--time-limit", help="Seconds per case, > 0 (default 60).")
    ] = None,
    gbs: GbsOpt = None,
    seq: SeqOpt = None,
    family: Annotated[str | None, typer.Option("--family", help="megatron, hetero or both.")] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="PNG: throughput vs devices (or price), Pareto front.")
    ] = None,
    x: Annotated[str, typer.Option("--x", help="x axis of --plot: devices or price.")] = "devices",
    as_json: JsonOpt = False,
) -> None:
    """Solve many (model x cluster mix x settings) cases, locally or on Ray; resumable."""
    from hapmoe_milp import render
    from hapmoe_milp.api import families_for
    from hapmoe_milp.config import check_choice, make_settings
    from hapmoe_milp.fileio import check_output_file
    from hapmoe_milp.sweep import best_table, cases_from_clusters, cases_from_mix, parse_prices, plot_sweep, run_sweep

    if (clusters is None) == (not mix):
        raise SettingsError("give either --clusters or --mix", field="--clusters")
    with flags():
        if family is not None:
            families_for(family, None)
        check_choice("x", x, ("devices", "price"))
        for ref in model:  # the settings layer checks --gbs/--seq against each model's defaults
            make_settings(catalog_model(ref), None, global_batch_size=gbs, seq_length=seq)
    if plot is not None:
        from hapmoe_milp.plot import check_png_path, require_matplotlib

        check_output_file(plot, "--plot")
        check_png_path(plot, "--plot")
        require_matplotlib("--plot")
    grid = {k: [v] for k, v in (("global_batch_size", gbs), ("seq_length", seq), ("family", family)) if v is not None}
    with flags():
        price_map = parse_prices(prices)
        if clusters is not None:
            names = [n.strip() for n in clusters.split(",") if n.strip()]
            cases = cases_from_clusters(model, names, grid or None, prices=price_map)
        else:
            cases = cases_from_mix(
                model, list(mix or ()), budget, prices=price_map, settings_grid=grid or None, catalog=STATE.catalog
            )
        with stdout_to_stderr():
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
                progress=stderr_is_tty(),
                catalog=STATE.catalog,
            )
        if plot is not None:
            plot_sweep(summary.rows, plot, x=x)  # type: ignore[arg-type]
    if as_json:
        emit_json(summary.to_dict())
        return
    render.console().print(render.best_mixes_table(best_table(summary.rows), summary))
