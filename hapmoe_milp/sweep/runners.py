"""Sweep runners: resolve every case's specs on the driver, then solve them in a local process pool or on Ray.

Specs are resolved on the driver and shipped to workers as values, so Ray workers need the package but not
the catalog folders, and a bad name becomes an error row instead of a crashed worker. A worker that dies
takes down only its own case: the suspects in flight are re-run one at a time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hapmoe_milp.config import SOLVERS, check_choice, check_time_limit
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.fileio import OutputError, check_output_dir, check_regular
from hapmoe_milp.specs.catalog import Catalog
from hapmoe_milp.specs.cluster import INLINE_RE, ClusterSpec, parse_inline
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.model import ModelSpec
from hapmoe_milp.sweep.cases import SweepCase
from hapmoe_milp.sweep.report import best_table
from hapmoe_milp.sweep.results import Sink, error_row, locked_output, repair, run_case

log = logging.getLogger(__name__)

RAY_INSTALL_HINT = "pip install 'hapmoe-milp[ray]' (or: pip install 'ray[default]>=2.30')"
BACKENDS = ("local", "ray")


# ---------------------------------------------------------------------- the sweep
@dataclass(frozen=True)
class SweepSummary:
    """What a run did. ``rows`` holds the result of every requested case (earlier runs' included)."""

    out: Path
    backend: str
    total: int
    skipped: int
    ran: int
    ok: int
    errors: int
    wall_s: float
    rows: tuple[dict[str, Any], ...] = field(default=(), repr=False)

    @property
    def complete(self) -> bool:
        return len(self.rows) == self.total

    def to_dict(self) -> dict[str, Any]:
        """The counts and the best cluster per model and metric (:func:`~.report.best_table`), as JSON."""
        return {
            "out": str(self.out),
            "total": self.total,
            "skipped": self.skipped,
            "ran": self.ran,
            "ok": self.ok,
            "errors": self.errors,
            "wall_s": self.wall_s,
            "best": best_table(self.rows),
        }


Work = tuple[SweepCase, ModelSpec, ClusterSpec]


class _Resolver:
    """Resolve names on the driver, once each; inline clusters share one device cache."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.models: dict[str, ModelSpec | Exception] = {}
        self.clusters: dict[str, ClusterSpec | Exception] = {}
        self.devices: dict[str, DeviceSpec] = {}

    def _device(self, ref: str, source: str = "", fld: str = "") -> DeviceSpec:
        key = ref.lower()
        if key not in self.devices:
            self.devices[key] = self.catalog.device(ref, source, fld)
        return self.devices[key]

    @staticmethod
    def _once(cache: dict[str, Any], ref: str, load: Callable[[str], Any]) -> Any:
        """``load(ref)`` once; a failure is remembered too and raised again (that case's error row)."""
        if ref not in cache:
            try:
                cache[ref] = load(ref)
            except Exception as exc:
                cache[ref] = exc
        v = cache[ref]
        if isinstance(v, Exception):
            raise v
        return v

    def model(self, ref: str) -> ModelSpec:
        return self._once(self.models, ref, self.catalog.model)

    def cluster(self, ref: str) -> ClusterSpec:
        return self._once(self.clusters, ref, self._load_cluster)

    def _load_cluster(self, ref: str) -> ClusterSpec:
        if INLINE_RE.match(ref) and not Path(ref).is_file():
            return parse_inline(ref, self._device)
        return self.catalog.cluster(ref)


class _Progress:
    """A rich progress bar on stderr (or nothing), with ok/error counts."""

    def __init__(self, enabled: bool, total: int, description: str) -> None:
        self.bar: Any = None
        self.task: Any = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("ok {task.fields[ok]}  errors {task.fields[err]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self.task = self.bar.add_task(description, total=total, ok=0, err=0)

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def update(self, ok: int, err: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=1, ok=ok, err=err)


def run_sweep(
    cases: Iterable[SweepCase],
    out_jsonl: str | Path,
    *,
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
    time_limit: float | None = None,
    solver: str = "dp",
    progress: bool = True,
    catalog: Catalog | None = None,
    runtime_env: dict[str, Any] | None = None,
) -> SweepSummary:
    """Solve every case and append one JSONL row per finished case to ``out_jsonl``.

    ``resume=True`` skips ids already in the file; without it a non-empty file is refused unless
    ``overwrite=True``. ``backend="ray"`` joins the Ray cluster at ``address`` (shipping this package to its
    workers via ``runtime_env`` py_modules unless one is given) or starts a local instance with ``workers``
    CPUs. ``time_limit`` is the solver's limit per case, in seconds. Returns the counts plus the rows of all
    requested cases.
    """
    _check_arguments(backend, workers, address, resume, overwrite, solver)
    if time_limit is not None:
        time_limit = check_time_limit(time_limit)
    if backend == "ray":
        _import_ray()  # fail before touching the output file
    ordered: list[SweepCase] = []
    ids: set[str] = set()
    for c in cases:
        if c.id in ids:
            log.info("dropping duplicate case %s (%s on %s)", c.id, c.model, c.cluster)
            continue
        ids.add(c.id)
        ordered.append(c)
    out = _check_output(Path(out_jsonl), resume, overwrite)
    t0 = time.perf_counter()
    with locked_output(out) as fd:
        if overwrite:
            os.ftruncate(fd, 0)
        previous = repair(fd, str(out)) if resume else []
        done = {r["id"]: r for r in previous}
        todo = [c for c in ordered if c.id not in done]
        skipped = len(ordered) - len(todo)
        if skipped:
            log.info("resume: %d of %d cases already in %s", skipped, len(ordered), out)
        with _Progress(progress and bool(todo), len(todo), f"sweep ({backend})") as bar:
            sink = Sink(fd, lambda _row: bar.update(sink.ok, sink.errors), str(out))
            if todo:
                work, failed = _resolve_all(todo, catalog or Catalog())
                for row in failed:
                    sink(row)
                if work:
                    if backend == "local":
                        _run_local(work, sink, workers, solver, time_limit)
                    else:
                        _run_ray(work, sink, workers, address, solver, time_limit, runtime_env)
        new = {r["id"]: r for r in sink.rows}
    rows = tuple(done.get(c.id) or new[c.id] for c in ordered if c.id in done or c.id in new)
    summary = SweepSummary(
        out=out,
        backend=backend,
        total=len(ordered),
        skipped=skipped,
        ran=len(sink.rows),
        ok=sink.ok,
        errors=sink.errors,
        wall_s=time.perf_counter() - t0,
        rows=rows,
    )
    log.info(
        "sweep: %d cases, %d skipped, %d ran (%d ok, %d errors) in %.1f s -> %s",
        summary.total,
        summary.skipped,
        summary.ran,
        summary.ok,
        summary.errors,
        summary.wall_s,
        out,
    )
    return summary


def _check_arguments(
    backend: str, workers: int | None, address: str | None, resume: bool, overwrite: bool, solver: str
) -> None:
    """Everything about a run that can be wrong, checked before any file is touched (errors name the
    Python argument; the CLI relabels them with its flags)."""
    if backend not in BACKENDS:
        raise HapmoeError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}", field="backend")
    if workers is not None and workers < 1:
        raise HapmoeError(f"must be at least 1, got {workers}", field="workers")
    if address is not None and backend != "ray":
        raise HapmoeError("--address only applies to --backend ray", field="address")
    if resume and overwrite:
        raise HapmoeError("--resume and --overwrite exclude each other", field="resume")
    check_choice("solver", solver, SOLVERS)


def _check_output(out: Path, resume: bool, overwrite: bool) -> Path:
    """The results file can be written, and a non-empty one is only continued or replaced on request."""
    if out.is_dir():
        raise OutputError("is a directory; give a .jsonl file name", source=str(out), field="out_jsonl")
    check_regular(out, "out_jsonl")
    check_output_dir(out.parent if str(out.parent) else Path("."), "out_jsonl")
    if not resume and out.exists() and out.stat().st_size > 0 and not overwrite:
        raise OutputError(
            "exists and is not empty; pass --resume to continue it or --overwrite to start over",
            source=str(out),
            field="out_jsonl",
        )
    return out


def _resolve_all(todo: list[SweepCase], catalog: Catalog) -> tuple[list[Work], list[dict[str, Any]]]:
    res = _Resolver(catalog)
    work: list[Work] = []
    failed: list[dict[str, Any]] = []
    for c in todo:
        try:
            cl = res.cluster(c.cluster)
        except Exception as exc:
            failed.append(error_row(c, exc))
            continue
        try:
            work.append((c, res.model(c.model), cl))
        except Exception as exc:
            failed.append(error_row(c, exc, cl))
    return work, failed


MAX_ATTEMPTS = 2  # Ray: a task whose worker process died is retried once


def _run_local(work: list[Work], sink: Sink, workers: int | None, solver: str, time_limit: float | None) -> None:
    """Process pool with at most ``workers`` cases in flight.

    Keeping no queue beyond the running cases means that when a worker process dies (out of memory, a
    crash in native code), the suspects are exactly the cases in flight. They are re-run one at a time in a
    one-worker pool, where a death is the case's own and becomes its error row; everything else goes on.
    """
    import multiprocessing

    n = min(workers or os.cpu_count() or 1, len(work))
    # spawn, not fork: the driver runs a progress thread, and forking a threaded process can deadlock.
    ctx = multiprocessing.get_context("spawn")
    queue: deque[Work] = deque(work)
    isolate: deque[Work] = deque()
    while queue or isolate:
        if queue:
            suspects = _pool_round(queue, n, ctx, sink, solver, time_limit)
            if suspects:
                log.warning("a worker process died; re-running its %d in-flight cases one at a time", len(suspects))
                isolate.extend(suspects)
        else:
            _pool_round(isolate, 1, ctx, sink, solver, time_limit)


def _pool_round(queue: deque[Work], n: int, ctx: Any, sink: Sink, solver: str, time_limit: float | None) -> list[Work]:
    """Drain ``queue`` through a pool of ``n`` workers until it is empty or the pool breaks.

    On a break, in-flight cases that still delivered a result are kept; with ``n == 1`` the one that did not
    is the culprit and gets its error row, with ``n > 1`` they are returned as suspects. Cases never
    submitted stay in ``queue`` for the next round.
    """
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    ex = ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_watch_parent, initargs=(os.getpid(),))
    inflight: dict[Future[dict[str, Any]], Work] = {}

    def settle() -> list[Work]:
        wait(list(inflight))  # after a break every in-flight future completes at once
        suspects: list[Work] = []
        for fut, w in inflight.items():
            exc = fut.exception()
            if exc is None:
                sink(fut.result())
            elif not isinstance(exc, BrokenProcessPool):
                sink(error_row(w[0], exc, w[2]))
            elif n == 1:
                sink(error_row(w[0], f"the worker process died while solving this case ({exc})", w[2]))
            else:
                suspects.append(w)
        return suspects

    clean = False
    try:
        while queue or inflight:
            try:
                while queue and len(inflight) < n:
                    fut = ex.submit(run_case, queue[0][0], queue[0][1], queue[0][2], solver, time_limit)
                    inflight[fut] = queue.popleft()
            except BrokenProcessPool:
                return settle()
            finished, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
            if any(isinstance(f.exception(), BrokenProcessPool) for f in finished):
                return settle()
            for fut in finished:
                w = inflight.pop(fut)
                exc = fut.exception()
                sink(fut.result() if exc is None else error_row(w[0], exc, w[2]))
        clean = True
        return []
    finally:
        if not clean:  # interrupted or broken: stop the workers now, do not leave them solving
            for proc in list(getattr(ex, "_processes", {}).values()):
                with contextlib.suppress(Exception):
                    proc.terminate()
        ex.shutdown(wait=clean, cancel_futures=True)


PARENT_POLL_S = 1.0


def _watch_parent(parent: int) -> None:
    """Pool-worker initializer: exit when the sweep driver is gone (killed, even with SIGKILL), instead of
    solving on as an orphan. The worker is re-parented when its parent dies, so its parent pid changes."""
    import threading

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="hapmoe-parent-watch", daemon=True).start()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise HapmoeError(
            f"the Ray backend needs ray, which is not installed ({exc}); {RAY_INSTALL_HINT}", field="backend"
        ) from None
    return ray


def _run_ray(
    work: list[Work],
    sink: Sink,
    workers: int | None,
    address: str | None,
    solver: str,
    time_limit: float | None,
    runtime_env: dict[str, Any] | None,
) -> None:
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        try:
            if address is not None:
                if runtime_env is None:
                    import hapmoe_milp

                    runtime_env = {"py_modules": [hapmoe_milp]}
                ray.init(address=address, runtime_env=runtime_env, logging_level=logging.WARNING)
            else:
                ray.init(
                    num_cpus=workers or os.cpu_count() or 1,
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                    runtime_env=runtime_env,
                )
        except ConnectionError as exc:
            raise HapmoeError(f"cannot join the Ray cluster at {address!r}: {exc}", field="address") from None
        started = True
    else:
        log.info("using the Ray instance this process already joined")
    try:
        task = ray.remote(num_cpus=1, max_retries=MAX_ATTEMPTS - 1)(run_case)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        window = max(4, 2 * (workers or cpus))  # bounded in flight: thousands of cases do not flood the scheduler
        model_refs: dict[int, Any] = {}
        cluster_refs: dict[int, Any] = {}

        def submit(w: Work) -> Any:
            # one object-store copy per distinct spec, not one per task
            m = model_refs.setdefault(id(w[1]), ray.put(w[1]))
            c = cluster_refs.setdefault(id(w[2]), ray.put(w[2]))
            return task.remote(w[0], m, c, solver, time_limit)

        queue = list(work)
        inflight: dict[Any, Work] = {}
        try:
            while queue or inflight:
                while queue and len(inflight) < window:
                    w = queue.pop(0)
                    inflight[submit(w)] = w
                ready, _ = ray.wait(list(inflight), num_returns=1)
                for ref in ready:
                    w = inflight.pop(ref)
                    try:
                        row = ray.get(ref)
                    except Exception as exc:
                        row = error_row(w[0], f"ray task failed: {type(exc).__name__}: {exc}", w[2])
                    sink(row)
        except BaseException:
            for ref in inflight:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
            raise
    finally:
        if started:
            ray.shutdown()
