"""Sweep results: one JSON row per finished case, appended to a JSONL file.

Each row is written with a single ``write`` and ``fsync``ed, so a sweep killed at any point keeps every
case it finished; a truncated trailing line (the only damage a kill can do) is repaired on resume. The file
is locked while a sweep writes it. A failing case is a row too (``status: error``), not an abort:
infeasible mixes are an expected answer in a sweep.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.fileio import OutputError, clean_json
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec
from hapmoe_milp.sweep.cases import SweepCase

log = logging.getLogger(__name__)


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
        return clean_json(row)
    except Exception as exc:  # a case must never take the sweep down
        log.debug("case %s failed", case.id, exc_info=True)
        return error_row(case, exc, cluster, time.perf_counter() - t0)


# ---------------------------------------------------------------------- the JSONL file
def _parse_lines(data: bytes, source: str) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise HapmoeError(f"line {n} is not valid JSON (edit or remove it, then resume)", source=source) from None
        if not isinstance(row, dict) or "id" not in row:
            raise HapmoeError(f"line {n} is not a sweep result (no 'id')", source=source)
        rows.append(row)
    return rows


def _split_tail(data: bytes) -> tuple[bytes, bytes]:
    """(complete lines, trailing bytes after the last newline)."""
    cut = data.rfind(b"\n") + 1
    return data[:cut], data[cut:]


def _tail_row(tail: bytes) -> dict[str, Any] | None:
    try:
        row = json.loads(tail)
    except ValueError:
        return None
    return row if isinstance(row, dict) and "id" in row else None


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
        row = _tail_row(tail)
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
    """Read an open results file and fix a truncated last line (complete it or cut it off)."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, size, 0) if size else b""
    body, tail = _split_tail(data)
    rows = _parse_lines(body, source)
    if tail:
        row = _tail_row(tail) if tail.strip() else None
        if row is not None:
            os.write(fd, b"\n")
            rows.append(row)
        else:
            log.warning("%s: removing a truncated last line (%d bytes) left by an interrupted sweep", source, len(tail))
            os.ftruncate(fd, len(body))
        os.fsync(fd)
    return rows


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


class Sink:
    """Appends one fsynced line per finished case and keeps the tallies."""

    def __init__(self, fd: int, on_row: Callable[[dict[str, Any]], None]) -> None:
        self.fd = fd
        self.on_row = on_row
        self.ok = 0
        self.errors = 0
        self.rows: list[dict[str, Any]] = []

    def __call__(self, row: dict[str, Any]) -> None:
        data = (json.dumps(row, allow_nan=False, separators=(",", ":")) + "\n").encode()
        os.write(self.fd, data)
        os.fsync(self.fd)
        self.rows.append(row)
        if row.get("status") == "ok":
            self.ok += 1
        else:
            self.errors += 1
        self.on_row(row)
