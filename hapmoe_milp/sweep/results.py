"""Sweep results: one JSON row per finished case, appended to a JSONL file.

Each row is written with a single ``write`` and ``fsync``ed, so a sweep killed at any point keeps every
case it finished; a truncated trailing line (the only damage a kill can do) is repaired on resume. The file
is locked while a sweep writes it. A failing case is a row too (``status: error``), not an abort:
infeasible mixes are an expected answer in a sweep.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hapmoe_milp.errors import HapmoeError, SpecError
from hapmoe_milp.fileio import OutputError, clean_json
from hapmoe_milp.limits import (
    MAX_DEVICES,
    RANGE_PRICE_PER_HOUR,
    RANGE_STEP_TIME_S,
    RANGE_TOKENS_PER_S,
    RANGE_TOKENS_PER_S_PER_DEVICE,
)
from hapmoe_milp.specs._fields import Fields, python_json_loads, show
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec
from hapmoe_milp.sweep.cases import SweepCase

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- one row, checked
STATUSES = ("ok", "error")
NL = b"\n"
_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_row(row: Any, source: str) -> dict[str, Any]:
    """A result row as the report and ``--resume`` read it; raises SpecError naming ``source`` and the field.

    The one reader for every row: a fresh result is checked before it is appended (so an unphysical number
    becomes that case's error row, see :func:`run_case`) and a row read back on resume goes through the same
    checks, so a hand-edited file cannot put a NaN, a list id or a throughput of 1e308 into the best table.
    Fields the report does not read are kept as they are."""
    f = Fields(row, source)
    rid = _text(f, "id")
    if not _ID_RE.fullmatch(rid):
        raise f.err("id", f"must be a case id (letters, digits, _ and -), got {show(rid)}")
    _text(f, "model")
    status = f.choice("status", STATUSES)
    cf = f.sub("cluster")
    assert cf is not None
    _text(cf, "spec")
    for k in ("name", "composition"):
        _text(cf, k, None)
    cf.int_("devices", None, maximum=MAX_DEVICES)
    by_type = cf.sub("by_type", None)
    if by_type is not None:
        for k in by_type.doc:
            by_type.int_(k, maximum=MAX_DEVICES)
    f.sub("settings")
    f.float_("wall_s", None, allow_zero=True)
    if status == "error":
        _text(f, "error")
        _text(f, "error_type", None)
        return dict(row)
    f.float_("tokens_per_s", within=RANGE_TOKENS_PER_S, unit="tokens/s")
    f.float_("tokens_per_s_per_device", within=RANGE_TOKENS_PER_S_PER_DEVICE, unit="tokens/s")
    f.float_("iteration_time_s", within=RANGE_STEP_TIME_S, unit="s")
    f.float_("mfu", None, allow_zero=True, within=(0.0, 1.0))
    f.bool_("fits", None)
    f.int_("devices", maximum=MAX_DEVICES)
    f.int_("devices_used", None, maximum=MAX_DEVICES)
    f.float_("price_per_hour", None, allow_zero=True, within=(0.0, RANGE_PRICE_PER_HOUR[1] * MAX_DEVICES))
    f.float_("tokens_per_dollar", None, allow_zero=True)
    f.sub("plan", None)
    f.sub("solver", None)
    return dict(row)


def _text(f: Fields, key: str, default: Any = ...) -> Any:
    """A string field that is a JSON string (the spec readers also take a YAML number as a name)."""
    v = f.raw(key) if default is ... else f.raw(key, default)
    if v is not default and not isinstance(v, str):
        raise f.err(key, f"must be a string, got {show(v)}")
    return v


def cluster_info(case: SweepCase, cluster: ClusterSpec | None) -> dict[str, Any]:
    info: dict[str, Any] = {"spec": case.cluster}
    if cluster is not None:
        s = cluster.summary()
        info.update(
            name=cluster.name, composition=s["composition"], devices=cluster.world_size, by_type=cluster.inventory
        )
    return info


def cluster_price(cluster: ClusterSpec, overrides: Mapping[str, float]) -> float | None:
    """Price per hour of the whole cluster (what one rents), or None when any device type has no price."""
    total = 0.0
    for did, n in cluster.inventory.items():
        p = overrides.get(did)
        if p is None:
            p = cluster.price(did)
        if p is None:
            return None
        total += n * p
    return total


def error_row(
    case: SweepCase, exc: BaseException | str, cluster: ClusterSpec | None = None, wall_s: float = 0.0
) -> dict[str, Any]:
    msg = (
        exc if isinstance(exc, str) else (str(exc) if isinstance(exc, HapmoeError) else f"{type(exc).__name__}: {exc}")
    )
    return clean_json(
        {
            "id": case.id,
            "model": case.model,
            "cluster": cluster_info(case, cluster),
            "settings": case.settings_dict,
            "status": "error",
            "error": msg,
            "error_type": "WorkerError" if isinstance(exc, str) else type(exc).__name__,
            "wall_s": wall_s,
        }
    )


def run_case(
    case: SweepCase,
    model: ModelSpec,
    cluster: ClusterSpec,
    solver: str = "dp",
    time_limit: float | None = None,
) -> dict[str, Any]:
    """Solve one case and return its result row. Never raises: any failure becomes an error row."""
    t0 = time.perf_counter()
    try:
        from hapmoe_milp.api import solve

        kw = case.settings_dict
        sol = solve(model, cluster, solver, time_limit=time_limit, **kw)
        plan = sol.plan
        assert plan is not None
        pred = plan.predicted
        price = cluster_price(cluster, dict(case.prices))
        tps = float(pred["tokens_per_s"])
        row = {
            "id": case.id,
            "model": case.model,
            "cluster": cluster_info(case, cluster),
            "settings": case.settings_dict,
            "status": "ok",
            "iteration_time_s": pred["iteration_time_s"],
            "tokens_per_s": tps,
            "tokens_per_s_per_device": pred["tokens_per_s_per_device"],
            "mfu": pred["mfu"],
            "fits": pred["fits"],
            "devices": cluster.world_size,
            "devices_used": pred["devices"],
            "price_per_hour": price,
            "tokens_per_dollar": tps * 3600.0 / price if price else None,
            "plan": plan.summary(),
            "solver": {"name": sol.solver, "status": sol.status, "wall_s": sol.wall_s, "gap": sol.gap},
            "wall_s": time.perf_counter() - t0,
        }
        return check_row(clean_json(row), "result")  # the reader --resume uses: what it refuses is an error row
    except Exception as exc:  # a case must never take the sweep down
        log.debug("case %s failed", case.id, exc_info=True)
        return error_row(case, exc, cluster, time.perf_counter() - t0)


# ---------------------------------------------------------------------- the JSONL file
def _parse_line(line: bytes, where: str) -> dict[str, Any]:
    """One line: JSON without duplicate keys, then :func:`check_row`. ``NaN``/``Infinity`` (which Python's
    json writes and we never do) are read as numbers first, so the error names the field that holds one."""
    try:
        row, constants = python_json_loads(line.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        first = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise SpecError(f"not valid JSON ({first}); edit or remove the line, then resume", source=where) from None
    out = check_row(row, where)
    if constants:
        raise SpecError(f"{constants[0]} is not valid JSON (results hold finite numbers or null)", source=where)
    return out


def _parse_lines(data: bytes, source: str) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(data.split(b"\n"), start=1):
        if line.strip():
            rows.append(_parse_line(line, f"{source}: line {n}"))
    return rows


def _split_tail(data: bytes) -> tuple[bytes, bytes]:
    """(complete lines, trailing bytes after the last newline)."""
    cut = data.rfind(b"\n") + 1
    return data[:cut], data[cut:]


def _tail_row(tail: bytes, where: str) -> dict[str, Any] | None:
    """The bytes after the last newline: a whole valid row whose newline was lost, or None for what an
    interrupted write leaves behind (a torn line is never a valid row: only the last byte is the newline)."""
    try:
        return _parse_line(tail, where)
    except SpecError:
        return None


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a sweep file (first occurrence of each id wins); a truncated last line is ignored."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise HapmoeError("no such sweep results file", source=str(p)) from None
    body, tail = _split_tail(data)
    rows = _parse_lines(body, str(p))
    if tail.strip():
        row = _tail_row(tail, f"{p}: line {body.count(NL) + 1}")
        if row is None:
            log.warning("%s: ignoring a truncated last line (%d bytes)", p, len(tail))
        else:
            rows.append(row)
    seen: set[str] = set()
    out = []
    for r in rows:
        if r["id"] not in seen:
            seen.add(r["id"])
            out.append(r)
    return out


def repair(fd: int, source: str) -> list[dict[str, Any]]:
    """Read an open results file and fix a truncated last line (complete it or cut it off).

    Every complete line must be a valid row (else one error names the file, line and field); the bytes
    after the last newline are what an interrupted or disk-full write leaves behind and are repaired."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, size, 0) if size else b""
    body, tail = _split_tail(data)
    rows = _parse_lines(body, source)
    if tail:
        row = _tail_row(tail, f"{source}: line {body.count(NL) + 1}") if tail.strip() else None
        with disk_errors(source):
            if row is not None:
                _write_all(fd, b"\n")
                rows.append(row)
            else:
                log.warning(
                    "%s: removing a truncated last line (%d bytes) left by an interrupted sweep", source, len(tail)
                )
                os.ftruncate(fd, len(body))
            os.fsync(fd)
    return rows


@contextlib.contextmanager
def disk_errors(source: str, done: int | None = None) -> Iterator[None]:
    """A write that fails (disk full, file-size limit, quota, I/O error) stops the sweep with one line."""
    try:
        yield
    except OSError as exc:
        why = exc.strerror or str(exc)
        kept = f" after appending {done} result(s), no partial line left" if done is not None else ""
        raise OutputError(
            f"cannot write: {why}{kept}; free space (or raise the file-size limit), then run again with --resume",
            source=source,
            field="out_jsonl",
        ) from None


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written: a write near a file-size limit or a full disk can be short."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:  # pragma: no cover - os.write raises rather than return 0
            raise OSError(errno.EIO, "short write")
        view = view[n:]


@contextlib.contextmanager
def locked_output(path: Path) -> Iterator[int]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(
            f"cannot create its folder: {exc.strerror or exc}", source=str(path), field="out_jsonl"
        ) from None
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OutputError(f"cannot open for writing: {exc}", source=str(path), field="out_jsonl") from None
    try:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no advisory locks
            fcntl = None  # type: ignore[assignment]
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise OutputError("another sweep is writing this file", source=str(path), field="out_jsonl") from None
        yield fd
    finally:
        os.close(fd)


def _invalid_row(row: Any, exc: HapmoeError) -> dict[str, Any]:
    """An error row in place of a result row the reader refuses (a worker's row that lost its numbers)."""
    get = row.get if isinstance(row, dict) else (lambda _k, d=None: d)
    cluster = get("cluster")
    spec = cluster.get("spec") if isinstance(cluster, dict) else cluster
    return {
        "id": get("id"),
        "model": get("model"),
        "cluster": {"spec": spec},
        "settings": get("settings") if isinstance(get("settings"), dict) else {},
        "status": "error",
        "error": f"invalid result: {exc}",
        "error_type": "InvalidResult",
        "wall_s": 0.0,
    }


class Sink:
    """Appends one fsynced line per finished case and keeps the tallies."""

    def __init__(self, fd: int, on_row: Callable[[dict[str, Any]], None], source: str = "results") -> None:
        self.fd = fd
        self.on_row = on_row
        self.source = source
        self.ok = 0
        self.errors = 0
        self.rows: list[dict[str, Any]] = []

    def __call__(self, row: dict[str, Any]) -> None:
        try:
            row = check_row(row, "result")  # what --resume will read back, checked now
        except HapmoeError as exc:  # a case must never take the sweep down: its row becomes an error row
            row = check_row(_invalid_row(row, exc), f"{self.source}: new row")
        data = (json.dumps(row, allow_nan=False, separators=(",", ":")) + "\n").encode()
        start = os.fstat(self.fd).st_size
        with disk_errors(self.source, len(self.rows)):
            try:
                _write_all(self.fd, data)
                os.fsync(self.fd)
            except OSError:
                # never leave a torn line behind (shrinking needs no space); should even that fail, the
                # partial line stays and --resume removes it
                with contextlib.suppress(OSError):
                    os.ftruncate(self.fd, start)
                raise
        self.rows.append(row)
        if row.get("status") == "ok":
            self.ok += 1
        else:
            self.errors += 1
        self.on_row(row)
