"""Command-line interface: parse, call the API, render. No planning logic lives here.

What every command promises (the bad-input and CLI tests check it):

* stdout carries only the answer -- a table, or strict JSON with ``--json`` (no NaN/Infinity);
  progress, warnings and logs go to stderr, and so does whatever a solver library prints: compute runs
  with file descriptor 1 pointed at stderr (:func:`stdout_to_stderr`);
* a bad value gets one line ``error: <flag or file>: <field>: <what is wrong>`` and exit status 2, never a
  traceback; values are checked once, by the library's validation layer, and relabelled here with the
  flag they came from (:data:`FLAGS`); usage errors print the usage line, that one error line, exit 2;
* output paths are checked before any long computation, and files are written atomically.

Adding a command (e.g. ``calibrate``): one function with the option aliases below, ``with flags():`` around
the calls that check values, ``emit_json`` / ``render.console()`` for the answer, ``compute()`` around
long work (progress + stdout guard).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from hapmoe_milp.errors import HapmoeError, PlanError, SettingsError
from hapmoe_milp.specs.catalog import Catalog

log = logging.getLogger("hapmoe_milp")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,  # a bare `hapmoe-milp` is a usage error (exit 2), its help would go to stdout
    pretty_exceptions_enable=False,
    context_settings={"max_content_width": 80, "help_option_names": ["-h", "--help"]},
    help="Heterogeneity-aware parallelism planner for MoE training: plans, estimates and launch files.",
)


class _State:
    catalog: Catalog = Catalog()
    verbose: int = 0


STATE = _State()

# Library field name -> the flag a user types; errors from the validation layer are relabelled with it.
FLAGS: dict[str, str] = {
    "seq_length": "--seq",
    "global_batch_size": "--gbs",
    "micro_batch_size": "--mbs",
    "precision": "--precision",
    "imbalance": "--imbalance",
    "dispatcher": "--dispatcher",
    "optimizer_offload": "--optimizer-offload",
    "tp": "--tp",
    "pp": "--pp",
    "cp": "--cp",
    "ep": "--ep",
    "etp": "--etp",
    "vpp": "--vpp",
    "recompute": "--recompute",
    "layout": "--layout",
    "time_limit": "--time-limit",
    "family": "--family",
    "solver": "--solver",
    "export": "--export",
    "runtime": "--runtime",
    "target": "--target",
    "model": "--model",
    "cluster": "--cluster",
    "x": "--x",
}


# ---------------------------------------------------------------------- shared helpers
@contextlib.contextmanager
def flags(extra: dict[str, str] | None = None) -> Iterator[None]:
    """Relabel a validation error that names a library field (``seq_length``) with its flag (``--seq``)."""
    names = {**FLAGS, **(extra or {})}
    try:
        yield
    except HapmoeError as exc:
        if exc.source is None and exc.field in names:
            raise exc.at(field=names[exc.field]) from None
        raise


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Point file descriptor 1 at stderr while libraries run (HiGHS, CBC and OR-Tools print banners and
    logs from C code, which no Python-level redirect catches), so stdout carries only the answer."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):  # no real fd 1 (embedded use): nothing to guard
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def progress_renderer() -> Any:
    """A context manager yielding a ``Progress`` callback drawing a rich status line on stderr, or None
    when stderr is not a terminal (logs, CI, pipes get no control characters)."""
    return _RichProgress() if _stderr_is_tty() else contextlib.nullcontext(None)


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class _RichProgress:
    """Instance i/n, best iteration time so far, bound, elapsed vs limit -- from ``ProgressEvent``s."""

    def __enter__(self) -> Any:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[best]}  {task.fields[clock]}"),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.bar.add_task("search", total=None, best="", clock="")
        self.bar.start()
        return self.update

    def update(self, ev: Any) -> None:
        best = f"best {ev.best_s:.4f} s" if ev.best_s == ev.best_s and ev.best_s < float("inf") else "no plan yet"
        if ev.bound_s == ev.bound_s:
            best += f", bound {ev.bound_s:.4f} s"
        clock = f"{ev.elapsed_s:.0f} s" + (f" of {ev.limit_s:g} s" if ev.limit_s else "")
        self.bar.update(
            self.task, description=ev.phase, completed=ev.done, total=ev.total or None, best=best, clock=clock
        )

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()


@contextlib.contextmanager
def compute() -> Iterator[Any]:
    """Around long work: a progress callback (or None) and stdout guarded against library output."""
    with progress_renderer() as prog, stdout_to_stderr():
        yield prog


def emit_json(obj: Any) -> None:
    """Print strict JSON (NaN/Infinity become null) on stdout."""
    from hapmoe_milp.fileio import dumps

    typer.echo(dumps(obj, indent=2))


def note(text: str) -> None:
    typer.echo(f"note: {text}", err=True)


def require(value: Any, flag: str, why: str) -> Any:
    if value is None:
        raise SettingsError(f"is required {why}", field=flag)
    return value


def catalog_model(ref: str, flag: str = "--model") -> Any:
    with flags({"model": flag, "--model": flag}):
        return STATE.catalog.model(ref)


def catalog_cluster(ref: str, flag: str = "--cluster") -> Any:
    with flags({"cluster": flag, "--cluster": flag}):
        return STATE.catalog.cluster(ref)


def plan_with_specs(plan_path: Path, model: str | None, cluster: str | None) -> tuple[Any, Any, Any]:
    """The plan file and the specs to use with it.

    The plan names its model and cluster and embeds them (format v2), so nothing else is needed. A given
    ``--model``/``--cluster`` must name the same ones (else an error says so); if its content differs from
    what the plan was solved with, the given one wins and a warning says so."""
    from hapmoe_milp.plan import load_plan
    from hapmoe_milp.specs.cluster import cluster_hash
    from hapmoe_milp.specs.model import model_hash

    src = str(plan_path)
    p = load_plan(plan_path, STATE.catalog)
    if model is None:
        m = p.model_spec if p.model_spec is not None else catalog_model(p.model, f"{src}: model")
    else:
        m = catalog_model(model)
        if m.name != p.model:
            raise PlanError(
                f"names model {m.name!r}, but {src} was solved for {p.model!r}; drop --model to use the plan's own",
                field="--model",
            )
        if p.model_spec is not None and model_hash(m) != model_hash(p.model_spec):
            log.warning("--model: %s differs from the spec %s was solved with; using --model's", m.name, src)
    if cluster is None:
        c = p.cluster_spec if p.cluster_spec is not None else catalog_cluster(p.cluster, f"{src}: cluster")
    else:
        c = catalog_cluster(cluster)
        if c.name != p.cluster:
            raise PlanError(
                f"names cluster {c.name!r}, but {src} was solved for {p.cluster!r}; drop --cluster to use the "
                "plan's own",
                field="--cluster",
            )
        if p.cluster_spec is not None and cluster_hash(c) != cluster_hash(p.cluster_spec):
            log.warning("--cluster: %s differs from the cluster %s was solved for; using --cluster's", c.name, src)
    return p, m, c


# ---------------------------------------------------------------------- option aliases (one help text each)
ModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="Model: catalog name, YAML path or HF config.json.")
]
ClusterOpt = Annotated[
    str | None,
    typer.Option("--cluster", "-c", help="Cluster: catalog name, YAML path or inline (8xh800+16x910b)."),
]
PlanModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="Default: the plan's own model; must name the same one.")
]
PlanClusterOpt = Annotated[
    str | None, typer.Option("--cluster", "-c", help="Default: the plan's own cluster; must name the same one.")
]
GbsOpt = Annotated[int | None, typer.Option("--gbs", help="Global batch size in samples (default: model's).")]
SeqOpt = Annotated[int | None, typer.Option("--seq", help="Sequence length in tokens (default: model's).")]
MbsOpt = Annotated[int | None, typer.Option("--mbs", help="Micro-batch size in samples (default: model's).")]
ImbalanceOpt = Annotated[
    float | None, typer.Option("--imbalance", help="Expert load-imbalance factor, >= 1.0 (1.0 = balanced).")
]
PrecisionOpt = Annotated[str | None, typer.Option("--precision", help="Compute precision: bf16 or fp8.")]
DispatcherOpt = Annotated[
    str | None, typer.Option("--dispatcher", help="MoE token dispatcher: allgather, alltoall or flex.")
]
FamilyOpt = Annotated[
    str,
    typer.Option("--family", help="Plans to search: megatron (one mesh shape), hetero (per-stage meshes) or both."),
]
TimeLimitOpt = Annotated[
    float | None, typer.Option("--time-limit", help="Search time limit in seconds, > 0 (default 60).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print strict JSON on stdout instead of tables.")]
TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target", help="Runtime: megatron, rocm, mindspeed or flagscale (default: the runtime the plan names)."
    ),
]
RuntimeOpt = Annotated[
    str,
    typer.Option(
        "--runtime",
        help="auto (every runtime that runs the cluster's vendors; the plan names its own), megatron, rocm, "
        "mindspeed, flagscale, or any (the what-if space: plans no single runtime is known to run).",
    ),
]


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


def _settings_kw(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


# ---------------------------------------------------------------------- global options
@app.callback()
def _main(
    devices_dir: Annotated[
        list[Path] | None,
        typer.Option("--devices-dir", help="Extra folder of device tables (e.g. profiled), searched first."),
    ] = None,
    verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, help="Log to stderr: -v info, -vv debug.")] = 0,
) -> None:
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr, force=True)
    STATE.verbose = verbose
    STATE.catalog = Catalog(devices_dirs=tuple(devices_dir or ()))


# ---------------------------------------------------------------------- catalogs
@app.command()
def models(
    name: Annotated[str | None, typer.Argument(help="Catalog name or path (YAML or HF config.json).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the model catalog, or show one model (parameter counts, FLOPs per token)."""
    from hapmoe_milp import render

    cat = STATE.catalog
    if name:
        m = catalog_model(name, "NAME")
        d = m.summary()
        d["sources"] = list(m.sources)
        if m.official:
            d["official"] = {
                "total_b": m.official.total_b,
                "active_b": m.official.active_b,
                "active_convention": m.official.active_convention,
            }
        if as_json:
            emit_json(d)
        else:
            render.console().print(render.kv_table(m.name, d))
        return
    rows = [cat.model(n).summary() for n in cat.model_names()]
    if as_json:
        emit_json(rows)
    else:
        render.console().print(render.models_table(rows))


@app.command()
def clusters(
    name: Annotated[str | None, typer.Argument(help="Catalog name, path, or inline form like 8xh800+16x910b.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the cluster catalog, or show one cluster."""
    from hapmoe_milp import render

    cat = STATE.catalog
    if name:
        c = catalog_cluster(name, "NAME")
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
            emit_json(d)
        else:
            render.console().print(render.kv_table(c.name, d))
        return
    rows = [cat.cluster(n).summary() for n in cat.cluster_names()]
    if as_json:
        emit_json(rows)
    else:
        render.console().print(render.clusters_table(rows))


@app.command()
def devices(
    name: Annotated[str | None, typer.Argument(help="Device id or path to a device table.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List device tables, or show one (with its provenance)."""
    from hapmoe_milp import render

    cat = STATE.catalog
    if name:
        dv = cat.device(name, "", "NAME")
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
            emit_json(d)
        else:
            render.console().print(render.kv_table(f"{dv.id} ({dv.provenance})", d))
        return
    rows = [cat.device(n).summary() for n in cat.device_names()]
    if as_json:
        emit_json(rows)
    else:
        render.console().print(render.devices_table(rows))


# ---------------------------------------------------------------------- estimate
def _knob_flag(fld: str | None) -> str:
    import re

    mt = re.fullmatch(r"stages\[\d+\]\.(\w+)", fld or "")
    if mt:
        return FLAGS.get(mt.group(1), f"--{mt.group(1)}")
    return FLAGS.get(fld or "", "--pp")


@app.command()
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

    overrides = _settings_kw(
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
@app.command()
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
@app.command()
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


@app.command("export")
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


# ---------------------------------------------------------------------- compare
@app.command()
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
    time_limit: Annotated[float, typer.Option("--time-limit", help="Seconds per solver, > 0.")] = 60.0,
    warm_start: Annotated[bool, typer.Option("--warm-start", help="Hand the DP plan to the exact solvers.")] = False,
    runtimes: Annotated[
        bool, typer.Option("--runtimes", help="Best plan per runtime that runs the cluster, next to --runtime any.")
    ] = False,
    gbs: GbsOpt = None,
    seq: SeqOpt = None,
    mbs: MbsOpt = None,
    optimizer_offload: Annotated[
        bool, typer.Option("--optimizer-offload/--no-optimizer-offload", help="Optimizer states in host memory.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Cross-validate the solvers on one instance, or put our plan next to baselines (HAPMoE Table 2 style)."""
    from hapmoe_milp.api import make_settings
    from hapmoe_milp.config import check_choice, check_time_limit

    m = catalog_model(require(model, "--model", "to compare"))
    c = catalog_cluster(require(cluster, "--cluster", "to compare"))
    with flags():
        check_choice("family", family, ("both", "megatron", "hetero"))
        limit = check_time_limit(time_limit)
        st = make_settings(
            m, None, global_batch_size=gbs, seq_length=seq, micro_batch_size=mbs, optimizer_offload=optimizer_offload
        )
    if runtimes:
        from hapmoe_milp.compare import compare_runtimes, format_runtimes_markdown

        with compute():
            rep = compare_runtimes(
                m, c, st, time_limit=limit, optimizer_offload="auto" if not optimizer_offload else True
            )
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
            rep = compare_against(
                m, c, st, names, time_limit=limit, optimizer_offload="auto" if not optimizer_offload else True
            )
        rep.pop("solutions", None)
        if as_json:
            emit_json(rep)
            return
        from hapmoe_milp import render

        render.console().print(render.baselines_table(rep, f"{m.name} on {c.name}: ratios vs Megatron-uniform"))
        for n in rep.get("notes", []):
            typer.echo(f"note: {n}")
        return
    from hapmoe_milp.compare import compare_solvers, format_markdown

    names = [x.strip() for x in solvers.split(",") if x.strip()]
    if not names:
        raise SettingsError("needs at least one solver (dp, dp-exact, cpsat, milp)", field="--solvers")
    with compute():
        rep = compare_solvers(m, c, st, solvers=names, time_limit=limit, family=family, warm_start=warm_start)
    if as_json:
        emit_json(rep)
    else:
        typer.echo(format_markdown(rep))


# ---------------------------------------------------------------------- sweep
@app.command()
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
    from hapmoe_milp.api import make_settings
    from hapmoe_milp.config import check_choice
    from hapmoe_milp.fileio import check_output_file
    from hapmoe_milp.sweep import best_table, cases_from_clusters, cases_from_mix, parse_prices, plot_sweep, run_sweep

    if (clusters is None) == (not mix):
        raise SettingsError("give either --clusters or --mix", field="--clusters")
    with flags():
        if family is not None:
            check_choice("family", family, ("both", "megatron", "hetero"))
        check_choice("x", x, ("devices", "price"))
        for ref in model:  # the settings layer checks --gbs/--seq against each model's defaults
            make_settings(catalog_model(ref), None, global_batch_size=gbs, seq_length=seq)
    if plot is not None:
        from hapmoe_milp.plot import require_matplotlib

        check_output_file(plot, "--plot")
        require_matplotlib("--plot")
    grid: dict[str, list[Any]] = {}
    for k, v in (("global_batch_size", gbs), ("seq_length", seq), ("family", family)):
        if v is not None:
            grid[k] = [v]
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
            progress=_stderr_is_tty(),
            catalog=STATE.catalog,
        )
    best = best_table(summary.rows)
    if plot is not None:
        plot_sweep(summary.rows, plot, x=x)  # type: ignore[arg-type]
    if as_json:
        emit_json(
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
    render.console().print(render.best_mixes_table(best, summary))


# ---------------------------------------------------------------------- profiler
@app.command()
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
    with compute():
        meas = profile_device(device_name, quick=quick, backend=backend, peak_tflops=peak_tflops)
        colls = list(collectives or ())
        if nproc:
            colls.append(launch_local_collectives(nproc, target_dir / f"{device_name}-intra.json", quick=quick))
        path = write_device_table(meas, target_dir, device_name=device_name, base=base_dev, collectives=colls)
    typer.echo(str(path))


@app.command("compare-profile")
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


@app.command()
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
    from hapmoe_milp.calibration import DEFAULT_FIT, summarize
    from hapmoe_milp.calibration import calibrate as run_calibration
    from hapmoe_milp.fileio import check_output_dir

    names = [n.strip() for n in params.split(",") if n.strip()] if params else list(DEFAULT_FIT)
    cat = STATE.catalog
    target = check_output_dir(out or cat.calibrated_dir, "--out")
    with compute():
        res = run_calibration(runs, device, catalog=cat, params=names, out=target, loo=loo, version=__version__)
    after = summarize(res.before, res.fit.errors)
    before = res.summary_before()
    loo_s = res.summary_loo()
    if as_json:
        emit_json(
            {
                "device": res.device,
                "path": str(res.path) if res.path else None,
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


# ---------------------------------------------------------------------- entry point
def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _usage_error(exc: Any) -> int:
    """A command-line usage error: the usage line, one ``error:`` line, a hint; exit status 2."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        typer.echo(ctx.get_usage(), err=True)
        typer.echo(f"error: missing command; run '{ctx.command_path} --help' for the list", err=True)
        return 2
    if ctx is not None:
        typer.echo(ctx.get_usage(), err=True)
    typer.echo(f"error: {_one_line(exc.format_message())}", err=True)
    if ctx is not None:
        typer.echo(f"Try '{ctx.command_path} --help' for help.", err=True)
    code = getattr(exc, "exit_code", 2)
    return code if isinstance(code, int) and code else 2


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwind: sweeps stop their workers, temp files are removed


def run(argv: list[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default: sys.argv) and return the exit status instead of exiting."""
    try:
        rc = app(args=argv, prog_name="hapmoe-milp", standalone_mode=False)
        return rc if isinstance(rc, int) else 0
    except HapmoeError as e:
        typer.echo(f"error: {e}", err=True)
        return 2
    except typer.Exit as e:
        return int(e.exit_code or 0)
    except typer.Abort:
        typer.echo("aborted", err=True)
        return 130
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        return 130
    except BrokenPipeError:  # `hapmoe-milp models --json | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep interpreter exit quiet
        return 0
    except Exception as e:
        if _is_usage_error(e):
            return _usage_error(e)
        raise


def _is_usage_error(exc: BaseException) -> bool:
    """Click's usage errors, whichever click raised them: recent typer vendors its own (typer._click) and
    older typer uses the click package; both have ``format_message`` and an integer ``exit_code``. We never
    import click itself -- it is not a dependency of ours, and may not be installed."""
    return callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int)


def main(argv: list[str] | None = None) -> None:
    with contextlib.suppress(ValueError):  # not in the main thread (embedded use): keep the default
        signal.signal(signal.SIGTERM, _sigterm)
    code = run(argv)
    if code:
        sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
