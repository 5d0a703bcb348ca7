"""Batch sweeps: solve one model on many cluster mixes, locally or on a Ray cluster, into a JSONL file.

The question a sweep answers is *which mix to buy or rent*: for every cluster (named, or generated from
``DEVICE:MIN-MAX:STEP`` ranges) it runs the solver and records throughput, per-device throughput and,
when prices are known, tokens per dollar.

Why the design is what it is:

* **Results stream to JSONL** — one line per finished case, written with a single ``write`` and
  ``fsync``ed, so a sweep killed at any point keeps every case it finished. A truncated trailing line
  (the only damage a kill can do) is repaired on resume.
* **Stable case ids** — a hash of (model, cluster spec, settings), independent of order and of the run,
  so ``resume=True`` skips exactly the cases already in the file (successful or failed) and never
  duplicates one.
* **Specs are resolved on the driver** and shipped to workers as values, so Ray workers need the package
  but not the catalog folders, and a bad name becomes an error row instead of a crashed worker.
* **A failing case is a row, not an abort** — infeasible mixes are an expected answer in a sweep.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import math
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from hapmoe_milp.config import Settings, check_time_limit
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.fileio import check_output_dir
from hapmoe_milp.limits import MAX_DEVICES, MAX_MIX_COUNTS, MAX_SWEEP_CASES
from hapmoe_milp.specs.catalog import Catalog
from hapmoe_milp.specs.cluster import INLINE_RE, ClusterSpec, parse_inline
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.model import ModelSpec

log = logging.getLogger(__name__)

RAY_INSTALL_HINT = "pip install 'hapmoe-milp[ray]' (or: pip install 'ray[default]>=2.30')"
BACKENDS = ("local", "ray")
XAxis = Literal["devices", "price"]

# Keys a case's settings may carry: the solve() switches plus every Settings field.
SOLVE_KEYS = frozenset({"family", "optimizer_offload"})
SETTINGS_KEYS = frozenset(f.name for f in fields(Settings))
CASE_SETTING_KEYS = SOLVE_KEYS | SETTINGS_KEYS

MIX_RE = re.compile(
    r"^\s*(?P<dev>[A-Za-z0-9_.-]+)\s*:\s*(?P<lo>\d+)(?:\s*-\s*(?P<hi>\d+))?(?:\s*:\s*(?P<step>\d+))?\s*$", re.ASCII
)
BUDGET_RE = re.compile(r"^\s*(?P<key>devices|price)\s*(?P<op><=|<)\s*(?P<val>[0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*$")


# ---------------------------------------------------------------------- cases
def _canon_ref(ref: str) -> str:
    """Canonical spelling of a model/cluster reference, so ids do not depend on case or whitespace."""
    s = ref.strip()
    if INLINE_RE.match(s):
        return re.sub(r"\s+", "", s).replace("*", "x").lower()
    if "/" in s or os.sep in s or s.endswith((".yaml", ".yml", ".json")):
        return s
    return s.lower()


def _json_value(v: Any, where: str) -> Any:
    try:
        return json.loads(json.dumps(v, allow_nan=False))
    except (TypeError, ValueError):
        raise HapmoeError(f"{v!r} is not a plain JSON value (number, string, bool)", field=where) from None


def _check_settings(settings: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    out = []
    for k in sorted(settings):
        if k not in CASE_SETTING_KEYS:
            raise HapmoeError(
                f"unknown setting {k!r}; known: {', '.join(sorted(CASE_SETTING_KEYS))}", field=f"settings.{k}"
            )
        v = settings[k]
        if v is None:
            continue
        out.append((k, _json_value(v, f"settings.{k}")))
    return tuple(out)


@dataclass(frozen=True)
class SweepCase:
    """One (model, cluster, settings) point. ``prices`` only labels the result; it is not part of the id."""

    model: str
    cluster: str
    settings: tuple[tuple[str, Any], ...] = ()
    prices: tuple[tuple[str, float], ...] = ()

    @staticmethod
    def make(
        model: str,
        cluster: str,
        settings: Mapping[str, Any] | None = None,
        prices: Mapping[str, float] | None = None,
    ) -> SweepCase:
        return SweepCase(
            model=_canon_ref(model),
            cluster=_canon_ref(cluster),
            settings=_check_settings(settings or {}),
            prices=tuple(sorted((k.lower(), float(v)) for k, v in (prices or {}).items())),
        )

    @property
    def settings_dict(self) -> dict[str, Any]:
        return dict(self.settings)

    @property
    def id(self) -> str:
        key = json.dumps(
            {"model": self.model, "cluster": self.cluster, "settings": self.settings_dict},
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(key.encode()).hexdigest()[:16]


def _settings_list(grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """A grid is either {key: [values...]} (cartesian product, keys in the given order) or a list of dicts."""
    if grid is None:
        return [{}]
    if isinstance(grid, Mapping):
        keys = list(grid)
        values = []
        for k in keys:
            v = grid[k]
            vals = list(v) if isinstance(v, list | tuple) else [v]
            if not vals:
                raise HapmoeError("has no values", field=f"settings.{k}")
            values.append(vals)
        if math.prod(len(v) for v in values) > MAX_SWEEP_CASES:
            raise HapmoeError(f"the settings grid exceeds {MAX_SWEEP_CASES:,} combinations", field="settings")
        return [dict(zip(keys, combo)) for combo in itertools.product(*values)]
    out = [dict(g) for g in grid]
    return out or [{}]


def cases_from_clusters(
    models: Sequence[str],
    clusters: Sequence[str],
    settings_grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]] | None = None,
    *,
    prices: Mapping[str, float] | None = None,
) -> list[SweepCase]:
    """Every model x cluster x settings combination, in that nesting order (deterministic)."""
    if not models:
        raise HapmoeError("needs at least one model", field="--model")
    if not clusters:
        raise HapmoeError("needs at least one cluster", field="--clusters")
    grid = _settings_list(settings_grid)
    n = len(models) * len(clusters) * len(grid)
    if n > MAX_SWEEP_CASES:
        raise HapmoeError(
            f"{len(models)} models x {len(clusters)} clusters x {len(grid)} settings = {n:,} cases, more than the "
            f"supported {MAX_SWEEP_CASES:,} per sweep",
            field="--clusters",
        )
    return [SweepCase.make(m, c, s, prices) for m in models for c in clusters for s in grid]


@dataclass(frozen=True)
class MixRange:
    """Counts of one device type a mix sweeps over (already filtered by the node-size rule)."""

    device: str
    counts: tuple[int, ...]
    devices_per_node: int
    price_per_hour: float | None


@dataclass(frozen=True)
class Budget:
    """Upper limits on a generated cluster: total devices and/or total price per hour."""

    max_devices: float | None = None
    max_price: float | None = None
    strict_devices: bool = False
    strict_price: bool = False

    def allows(self, devices: int, price: float | None) -> bool:
        if self.max_devices is not None and not (
            devices < self.max_devices if self.strict_devices else devices <= self.max_devices
        ):
            return False
        if self.max_price is not None:
            assert price is not None
            if not (price < self.max_price if self.strict_price else price <= self.max_price + 1e-9):
                return False
        return True


def parse_budget(text: str | Budget | None) -> Budget | None:
    """``devices<=32``, ``price<=40``, or both comma-separated (``devices<=32,price<40``)."""
    if text is None or isinstance(text, Budget):
        return text
    b: dict[str, Any] = {}
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise HapmoeError(f"empty budget {text!r} (expected e.g. devices<=32 or price<=40)", field="--budget")
    for part in parts:
        m = BUDGET_RE.match(part)
        if m is None:
            raise HapmoeError(f"cannot parse {part.strip()!r} (expected devices<=N or price<=X)", field="--budget")
        key, strict, val = m.group("key"), m.group("op") == "<", float(m.group("val"))
        if key == "devices":
            if val != int(val):
                raise HapmoeError(f"device budget must be a whole number, got {val:g}", field="--budget")
            b["max_devices"], b["strict_devices"] = val, strict
        else:
            b["max_price"], b["strict_price"] = val, strict
    return Budget(**b)


def parse_prices(text: str | Mapping[str, float] | None) -> dict[str, float]:
    """``h800=2.5,910b=1.2``: USD (or any currency) per device-hour, overriding the device entries."""
    if text is None:
        return {}
    if isinstance(text, Mapping):
        items = list(text.items())
    else:
        items = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            k, sep, v = part.partition("=")
            if not sep or not k.strip():
                raise HapmoeError(f"cannot parse {part!r} (expected DEVICE=PRICE, e.g. h800=2.5)", field="--prices")
            items.append((k.strip(), v.strip()))
    out: dict[str, float] = {}
    for k, v in items:
        try:
            p = float(v)
        except (TypeError, ValueError):
            raise HapmoeError(f"price of {k} is not a number: {v!r}", field="--prices") from None
        if not math.isfinite(p) or p < 0:
            raise HapmoeError(f"price of {k} must be a non-negative number, got {v!r}", field="--prices")
        out[str(k).lower()] = p
    return out


def parse_mix(text: str, catalog: Catalog | None = None, prices: Mapping[str, float] | None = None) -> MixRange:
    """``DEVICE:MIN-MAX:STEP`` (``DEVICE:N`` and ``DEVICE:MIN-MAX`` too; STEP defaults to a node).

    Counts that are neither a whole number of nodes nor less than one node cannot be laid out
    (``parse_inline`` would refuse them), so they are dropped here; a range with no usable count is an error.
    """
    m = MIX_RE.match(text)
    if m is None:
        raise HapmoeError(
            f"cannot parse {text.strip()!r} (expected DEVICE:MIN-MAX:STEP, e.g. h800:0-32:8)", field="--mix"
        )
    cat = catalog or Catalog()
    dev = cat.device(m.group("dev"), "", "--mix")
    dpn = dev.devices_per_node
    lo = int(m.group("lo"))
    hi = int(m.group("hi")) if m.group("hi") is not None else lo
    step = int(m.group("step")) if m.group("step") is not None else dpn
    if hi < lo:
        raise HapmoeError(f"{text.strip()!r}: MAX {hi} is below MIN {lo}", field="--mix")
    if step <= 0:
        raise HapmoeError(f"{text.strip()!r}: STEP must be positive", field="--mix")
    if hi > MAX_DEVICES:
        raise HapmoeError(
            f"{text.strip()!r}: MAX {hi:,} exceeds the supported maximum of {MAX_DEVICES:,} devices per cluster",
            field="--mix",
        )
    if (hi - lo) // step + 1 > MAX_MIX_COUNTS:
        raise HapmoeError(
            f"{text.strip()!r} gives {(hi - lo) // step + 1:,} counts, more than the supported {MAX_MIX_COUNTS:,}; "
            "use a larger STEP",
            field="--mix",
        )
    counts = tuple(n for n in range(lo, hi + 1, step) if n == 0 or n < dpn or n % dpn == 0)
    skipped = [n for n in range(lo, hi + 1, step) if n not in counts]
    if skipped:
        log.info("--mix %s: skipping %s (not a whole number of %d-device nodes)", dev.id, skipped, dpn)
    if not counts:
        raise HapmoeError(
            f"{text.strip()!r} has no count that is a whole number of {dpn}-device {dev.id} nodes or less than one node",
            field="--mix",
        )
    price = (prices or {}).get(dev.id, dev.price_per_hour)
    return MixRange(device=dev.id, counts=counts, devices_per_node=dpn, price_per_hour=price)


def _split_mixes(mixes: str | Sequence[str]) -> list[str]:
    items = [mixes] if isinstance(mixes, str) else list(mixes)
    return [p for item in items for p in item.split(",") if p.strip()]


def mix_clusters(
    mixes: str | Sequence[str],
    budget: str | Budget | None = None,
    *,
    prices: Mapping[str, float] | str | None = None,
    catalog: Catalog | None = None,
) -> list[str]:
    """Inline cluster specs (``8xh800+16x910b``) for every combination of counts within the budget."""
    price_map = parse_prices(prices)
    ranges = [parse_mix(t, catalog, price_map) for t in _split_mixes(mixes)]
    if not ranges:
        raise HapmoeError("needs at least one DEVICE:MIN-MAX:STEP range", field="--mix")
    seen: set[str] = set()
    for r in ranges:
        if r.device in seen:
            raise HapmoeError(f"device {r.device} is given twice", field="--mix")
        seen.add(r.device)
    unused = sorted(set(price_map) - seen)
    if unused:
        raise HapmoeError(
            f"a price for {unused[0]}, which no --mix range uses ({', '.join(sorted(seen))})", field="--prices"
        )
    combos = math.prod(len(r.counts) for r in ranges)
    if combos > MAX_SWEEP_CASES:
        raise HapmoeError(
            f"the ranges combine to {combos:,} clusters, more than the supported {MAX_SWEEP_CASES:,} per sweep; "
            "narrow them or use larger steps",
            field="--mix",
        )
    bud = parse_budget(budget)
    if bud is not None and bud.max_price is not None:
        missing = [r.device for r in ranges if r.price_per_hour is None]
        if missing:
            raise HapmoeError(
                f"a price budget needs a price for {', '.join(missing)}; pass --prices {missing[0]}=X,...",
                field="--budget",
            )
    out: list[str] = []
    for combo in itertools.product(*(r.counts for r in ranges)):
        n = sum(combo)
        if n == 0:
            continue
        price = None
        if bud is not None and bud.max_price is not None:
            price = sum(c * (r.price_per_hour or 0.0) for c, r in zip(combo, ranges))
        if bud is not None and not bud.allows(n, price):
            continue
        out.append("+".join(f"{c}x{r.device}" for c, r in zip(combo, ranges) if c > 0))
    if not out:
        raise HapmoeError("no cluster in the mix ranges fits the budget", field="--budget" if bud else "--mix")
    return out


def cases_from_mix(
    models: Sequence[str],
    mixes: str | Sequence[str],
    budget: str | Budget | None = None,
    *,
    prices: Mapping[str, float] | str | None = None,
    settings_grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]] | None = None,
    catalog: Catalog | None = None,
) -> list[SweepCase]:
    """Cases for every model x mix combination (x settings), counts ascending, first device outermost."""
    price_map = parse_prices(prices)
    clusters = mix_clusters(mixes, budget, prices=price_map, catalog=catalog)
    return cases_from_clusters(models, clusters, settings_grid, prices=price_map)


# ---------------------------------------------------------------------- one case
def _clean(v: Any) -> Any:
    """JSON-safe copy: NaN/inf become null (strict JSON has no NaN), tuples become lists."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
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


def plan_summary(plan: Any) -> dict[str, Any]:
    return {
        "family": plan.family,
        "runtime": plan.runtime,
        "pp": plan.pp,
        "vpp": plan.vpp,
        "num_microbatches": plan.num_microbatches,
        "micro_batch_size": plan.micro_batch_size,
        "global_batch_size": plan.global_batch_size,
        "seq_length": plan.seq_length,
        "stages": [
            {
                "device": s.device,
                "devices": s.devices,
                "layers": [s.layer_start, s.layer_end],
                "config": s.cfg.label(),
                "recompute": s.recompute,
            }
            for s in plan.stages
        ],
    }


def error_row(
    case: SweepCase, exc: BaseException | str, cluster: ClusterSpec | None = None, wall_s: float = 0.0
) -> dict[str, Any]:
    msg = (
        exc if isinstance(exc, str) else (str(exc) if isinstance(exc, HapmoeError) else f"{type(exc).__name__}: {exc}")
    )
    return _clean(
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
            "plan": plan_summary(plan),
            "solver": {"name": sol.solver, "status": sol.status, "wall_s": sol.wall_s, "gap": sol.gap},
            "wall_s": time.perf_counter() - t0,
        }
        return _clean(row)
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


def _repair(fd: int, source: str) -> list[dict[str, Any]]:
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
def _locked_output(path: Path) -> Iterator[int]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HapmoeError(f"cannot create its folder: {exc.strerror or exc}", source=str(path), field="--out") from None
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise HapmoeError(f"cannot open for writing: {exc}", source=str(path), field="--out") from None
    try:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no advisory locks
            fcntl = None  # type: ignore[assignment]
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise HapmoeError("another sweep is writing this file", source=str(path), field="--out") from None
        yield fd
    finally:
        os.close(fd)


class _Sink:
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

    def model(self, ref: str) -> ModelSpec:
        if ref not in self.models:
            try:
                self.models[ref] = self.catalog.model(ref)
            except Exception as exc:  # a bad entry is that case's error row
                self.models[ref] = exc
        v = self.models[ref]
        if isinstance(v, Exception):
            raise v
        return v

    def cluster(self, ref: str) -> ClusterSpec:
        if ref not in self.clusters:
            try:
                if INLINE_RE.match(ref) and not Path(ref).is_file():
                    self.clusters[ref] = parse_inline(ref, self._device)
                else:
                    self.clusters[ref] = self.catalog.cluster(ref)
            except Exception as exc:  # a bad entry is that case's error row
                self.clusters[ref] = exc
        v = self.clusters[ref]
        if isinstance(v, Exception):
            raise v
        return v


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
    if backend not in BACKENDS:
        raise HapmoeError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}", field="--backend")
    if workers is not None and workers < 1:
        raise HapmoeError(f"must be at least 1, got {workers}", field="--workers")
    if address is not None and backend != "ray":
        raise HapmoeError("--address only applies to --backend ray", field="--address")
    if resume and overwrite:
        raise HapmoeError("--resume and --overwrite exclude each other", field="--resume")
    if time_limit is not None:
        try:
            time_limit = check_time_limit(time_limit)
        except HapmoeError as exc:
            raise exc.at(field="--time-limit") from None
    if solver not in ("dp", "cpsat", "milp", "auto"):
        raise HapmoeError(f"unknown solver {solver!r}; choose one of dp, cpsat, milp, auto", field="--solver")
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
    out = Path(out_jsonl)
    if out.is_dir():
        raise HapmoeError("is a directory; give a .jsonl file name", source=str(out), field="--out")
    check_output_dir(out.parent if str(out.parent) else Path("."), "--out")
    t0 = time.perf_counter()
    if not resume and out.exists() and out.stat().st_size > 0 and not overwrite:
        raise HapmoeError(
            "exists and is not empty; pass --resume to continue it or --overwrite to start over",
            source=str(out),
            field="--out",
        )
    with _locked_output(out) as fd:
        if overwrite:
            os.ftruncate(fd, 0)
        previous = _repair(fd, str(out)) if resume else []
        done = {r["id"]: r for r in previous}
        todo = [c for c in ordered if c.id not in done]
        skipped = len(ordered) - len(todo)
        if skipped:
            log.info("resume: %d of %d cases already in %s", skipped, len(ordered), out)
        with _Progress(progress and bool(todo), len(todo), f"sweep ({backend})") as bar:
            sink = _Sink(fd, lambda _row: bar.update(sink.ok, sink.errors))
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


def _run_local(work: list[Work], sink: _Sink, workers: int | None, solver: str, time_limit: float | None) -> None:
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


def _pool_round(queue: deque[Work], n: int, ctx: Any, sink: _Sink, solver: str, time_limit: float | None) -> list[Work]:
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
            f"the Ray backend needs ray, which is not installed ({exc}); {RAY_INSTALL_HINT}", field="--backend"
        ) from None
    return ray


def _run_ray(
    work: list[Work],
    sink: _Sink,
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
            raise HapmoeError(f"cannot join the Ray cluster at {address!r}: {exc}", field="--address") from None
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


# ---------------------------------------------------------------------- analysis
def ok_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [dict(r) for r in rows if r.get("status") == "ok" and r.get("tokens_per_s")]


def _label(r: Mapping[str, Any]) -> str:
    c = r.get("cluster") or {}
    return str(c.get("spec") or c.get("name") or "?")


def _devices(r: Mapping[str, Any]) -> int:
    c = r.get("cluster") or {}
    return int(r.get("devices") or c.get("devices") or 0)


METRICS: tuple[tuple[str, str], ...] = (
    ("tokens_per_s", "throughput (tokens/s)"),
    ("tokens_per_s_per_device", "tokens/s per device"),
    ("tokens_per_dollar", "tokens per dollar"),
)


def best_table(rows: Iterable[Mapping[str, Any]], top: int = 1) -> list[dict[str, Any]]:
    """Best ``top`` clusters per model for each metric; tokens per dollar only where prices are known.

    Ties break by fewer devices, then by the cluster spec, so the table is deterministic.
    """
    good = ok_rows(rows)
    out: list[dict[str, Any]] = []
    for model in sorted({r["model"] for r in good}):
        mine = [r for r in good if r["model"] == model]
        for key, label in METRICS:
            have = [r for r in mine if isinstance(r.get(key), int | float)]
            have.sort(key=lambda r, k=key: (-float(r[k]), _devices(r), _label(r)))
            for rank, r in enumerate(have[:top], start=1):
                out.append(
                    {
                        "metric": key,
                        "label": label,
                        "rank": rank,
                        "model": model,
                        "id": r["id"],
                        "cluster": _label(r),
                        "composition": (r.get("cluster") or {}).get("composition", ""),
                        "value": r[key],
                        "tokens_per_s": r["tokens_per_s"],
                        "devices": _devices(r),
                        "price_per_hour": r.get("price_per_hour"),
                        "settings": r.get("settings", {}),
                    }
                )
    return out


def _x(r: Mapping[str, Any], x: str) -> float | None:
    if x == "devices":
        return float(_devices(r))
    p = r.get("price_per_hour")
    return float(p) if isinstance(p, int | float) else None


def pareto_front(rows: Iterable[Mapping[str, Any]], x: XAxis = "devices") -> list[dict[str, Any]]:
    """Rows no other row of the same model beats on both fewer ``x`` and higher tokens/s, by x ascending.

    ``x="devices"`` counts the cluster's devices (what one pays for), not only those the plan uses.
    """
    if x not in ("devices", "price"):
        raise HapmoeError(f"x must be devices or price, got {x!r}", field="--x")
    good = [r for r in ok_rows(rows) if _x(r, x) is not None]
    if x == "price" and not good and ok_rows(rows):
        raise HapmoeError("no result has a price; give device prices (--prices h800=2.5,...)", field="--prices")
    out: list[dict[str, Any]] = []
    for model in sorted({r["model"] for r in good}):
        mine = sorted(
            (r for r in good if r["model"] == model),
            key=lambda r: (_x(r, x), -float(r["tokens_per_s"]), _label(r)),
        )
        best = -math.inf
        for r in mine:
            tps = float(r["tokens_per_s"])
            if tps > best:
                out.append(r)
                best = tps
    return out


def plot_sweep(rows: Iterable[Mapping[str, Any]], out_png: str | Path, x: XAxis = "devices") -> Path:
    """Scatter of throughput vs cluster devices (or price per hour), Pareto front marked, one colour per model."""
    from hapmoe_milp.plot import require_matplotlib, save_figure

    Figure, Canvas = require_matplotlib()
    rows = list(rows)
    front = pareto_front(rows, x)
    good = [r for r in ok_rows(rows) if _x(r, x) is not None]
    if not good:
        raise HapmoeError("no successful case to plot", field="--plot")
    fig = Figure(figsize=(8.0, 5.0))
    ax = fig.add_subplot(1, 1, 1)
    models = sorted({r["model"] for r in good})
    colors = [f"C{i % 10}" for i in range(len(models))]
    for model, color in zip(models, colors):
        mine = [r for r in good if r["model"] == model]
        ax.scatter(
            [_x(r, x) for r in mine], [r["tokens_per_s"] for r in mine], s=18, alpha=0.5, color=color, label=model
        )
        pf = [r for r in front if r["model"] == model]
        if pf:
            xs = [_x(r, x) for r in pf]
            ys = [r["tokens_per_s"] for r in pf]
            ax.step(xs, ys, where="post", color=color, linewidth=1.2)
            ax.scatter(xs, ys, s=48, facecolors="none", edgecolors=color, linewidths=1.5)
            for r, xv, yv in zip(pf, xs, ys):
                ax.annotate(_label(r), (xv, yv), textcoords="offset points", xytext=(4, 4), fontsize=6)
    ax.set_xlabel("cluster devices" if x == "devices" else "cluster price per hour")
    ax.set_ylabel("tokens/s")
    ax.set_title(
        "sweep: throughput vs " + ("devices" if x == "devices" else "price") + " (circled: Pareto front)", fontsize=10
    )
    ax.scatter([], [], s=48, facecolors="none", edgecolors="black", linewidths=1.5, label="Pareto front")
    ax.margins(x=0.12, y=0.1)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, Canvas, out_png)


__all__ = [
    "Budget",
    "MixRange",
    "SweepCase",
    "SweepSummary",
    "best_table",
    "cases_from_clusters",
    "cases_from_mix",
    "mix_clusters",
    "pareto_front",
    "parse_budget",
    "parse_mix",
    "parse_prices",
    "plot_sweep",
    "read_results",
    "run_case",
    "run_sweep",
]
