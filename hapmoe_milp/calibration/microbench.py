"""Published kernel and collective micro-benchmarks as constraints on a device table's runtime terms.

``bench/calibration/microbenchmarks.yaml`` lists measured rows (a GEMM's TFLOP/s at one shape, STREAM
bandwidth, an all-reduce's bus bandwidth, a dispatch kernel's bandwidth, the idle time per kernel of a
training profile), each with a tolerance. A device table -- shipped, profiled or calibrated -- must
reproduce every row that applies to it within that tolerance. The fitter uses the same rows as its
bounds: a runtime term may move only as far as keeps every applicable row within tolerance, so a fit
can never contradict the kernels it came from (the failure of the first calibration, which put H100's
FP8 GEMM 12% above the measured maximum achievable matmul).

A term with no applicable row on a device has no measured range there; the fitter keeps it at its
prior (:mod:`hapmoe_milp.calibration.terms`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from hapmoe_milp.cost.primitives import SCAN_TERMS, attention_time, collective_time, gemm_time, scan_time
from hapmoe_milp.errors import SpecError
from hapmoe_milp.specs._fields import load_document
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.mixers import GatedDeltaNetShape, Mamba2Shape
from hapmoe_milp.specs.runtime import PARAM_INFO

MICROBENCH_FILE = Path("bench") / "calibration" / "microbenchmarks.yaml"
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


BOUNDS = ("point", "lower")  # what a row's value is to a table: a point to match, or a floor


@dataclass(frozen=True)
class Row:
    id: str
    source: str
    device: str
    kind: str
    shape: Mapping[str, Any]
    value: float
    unit: str
    role: str
    tolerance: float
    # "point": the table must land within +-tolerance of the value; "lower": the measurement is a lower bound
    # (e.g. a kernel run at a shape that under-fills the chip), so the table must only not fall below
    # value x (1 - tolerance)
    bound: str = "point"

    def __post_init__(self) -> None:
        if self.bound not in BOUNDS:
            raise SpecError(f"must be one of {', '.join(BOUNDS)}, got {self.bound!r}", field=f"{self.id}.bound")

    def within(self, got: float, slack: float = 1e-9) -> bool:
        """Whether a table's prediction ``got`` for this row's case honours the row."""
        err = got / self.value - 1.0
        if self.bound == "lower":
            return err >= -(self.tolerance + slack)
        return abs(err) <= self.tolerance + slack

    @property
    def terms(self) -> tuple[str, ...]:
        """The runtime terms this row's prediction depends on (so it bounds them)."""
        if self.kind == "gemm":
            terms = ("gemm_scale", "fp8_gemm_scale") if self.shape.get("precision") == "fp8" else ("gemm_scale",)
            # a grouped GEMM (shape ``groups`` > 1, ``m`` rows per group) also reads the per-group tile term
            return (*terms, "grouped_rows_half") if int(self.shape.get("groups", 1)) > 1 else terms
        if self.kind == "memory":
            return ("memory_efficiency",)
        if self.kind == "attention":
            return ("attention_scale",)
        if self.kind in SCAN_TERMS:
            return (SCAN_TERMS[self.kind],)
        if self.kind in PARAM_INFO:
            return (self.kind,)
        return ()  # collectives live in the tables, not in runtime terms


@lru_cache(maxsize=8)
def _load(path: str) -> tuple[Row, ...]:
    doc = load_document(Path(path))
    return tuple(
        Row(
            id=r["id"],
            source=r["source"],
            device=r["device"],
            kind=r["kind"],
            shape=dict(r.get("shape") or {}),
            value=float(r["value"]),
            unit=str(r.get("unit", "")),
            role=r["role"],
            tolerance=float(r["tolerance"]),
            bound=str(r.get("bound", "point")),
        )
        for r in doc["rows"]
    )


def load_rows(root: Path) -> tuple[Row, ...]:
    """The micro-benchmark rows shipped under ``root`` (none when the catalog root has no bench folder)."""
    p = root / MICROBENCH_FILE
    return _load(str(p)) if p.is_file() else ()


def rows_for(device_id: str, rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r.device == device_id]


def predicted(dev: DeviceSpec, row: Row) -> float:
    """What the table predicts for the row's case, in the row's unit."""
    sh = row.shape
    if row.kind == "gemm":
        # ``groups`` GEMMs of m x n x k each run as one grouped kernel (1: a plain GEMM); TFLOP/s over all groups
        g = int(sh.get("groups", 1))
        t = gemm_time(dev, sh["m"], sh["n"], sh["k"], sh["precision"], groups=g)
        return 2 * sh["m"] * sh["n"] * sh["k"] * g / t / 1e12
    if row.kind == "memory":
        return dev.runtime.memory_efficiency * dev.memory_bandwidth_GBps
    if row.kind == "attention":
        # attention FLOPs of one (batch, heads, seq, head_dim) call, forward: 4*b*h*s^2*d, halved when causal
        b, h, s, d = sh["batch"], sh["heads"], sh["seq"], sh["head_dim"]
        flops = 4 * b * h * s * s * d / (2 if sh.get("causal", True) else 1)
        bwd = sh.get("direction", "fwd") == "bwd"
        flops *= 2.5 if bwd else 1.0
        return flops / attention_time(dev, flops, s, backward=bwd) / 1e12
    if row.kind in SCAN_TERMS:
        # a chunked scan's forward over batch x seq tokens, FLOPs counted as the cost model counts them
        if row.kind == "ssd":
            macs = Mamba2Shape(
                hidden=1, heads=sh["heads"], head_dim=sh["head_dim"], groups=sh["groups"], state=sh["state"]
            ).scan_macs(sh["chunk"])
        else:
            macs = GatedDeltaNetShape(
                hidden=1,
                key_heads=sh["key_heads"],
                value_heads=sh["value_heads"],
                key_dim=sh["key_dim"],
                value_dim=sh["value_dim"],
            ).scan_macs(sh["chunk"])
        flops = 2 * sh["batch"] * sh["seq"] * macs
        return flops / scan_time(dev, flops, row.kind) / 1e12
    if row.kind in COLLECTIVE_KINDS:
        n, size = sh["ranks"], sh["bytes"]
        link = sh.get("link", "intra")
        t = collective_time(dev, row.kind, link, size, n, rails=int(sh.get("per_node", 1)))
        factor = 2 * (n - 1) / n if row.kind == "all_reduce" else (n - 1) / n
        return factor * size / t / 1e9
    return float(getattr(dev.runtime, row.kind))


def violations(dev: DeviceSpec, rows: Sequence[Row], slack: float = 1e-9) -> list[tuple[Row, float]]:
    """Rows (of this device) the table misses by more than their tolerance, with the relative error."""
    out = []
    for r in rows_for(dev.id, rows):
        got = predicted(dev, r)
        if not r.within(got, slack):
            out.append((r, got / r.value - 1.0))
    return out


def _ok(dev: DeviceSpec, rows: Sequence[Row]) -> bool:
    return all(r.within(predicted(dev, r), 0.0) for r in rows)


def term_interval(dev: DeviceSpec, name: str, rows: Sequence[Row]) -> tuple[float, float, tuple[str, ...]] | None:
    """The range of runtime term ``name`` (others as in ``dev``) over which every row of ``dev`` that depends
    on it stays within tolerance, intersected with the term's physical range; ``None`` when no row applies
    (the term has no measured range on this device). Found by bisection from the table's own value, which
    must itself be inside (a table that misses its rows has no valid range to fit in)."""
    mine = [r for r in rows_for(dev.id, rows) if name in r.terms]
    if not mine:
        return None
    info = PARAM_INFO[name]
    v0 = float(getattr(dev.runtime, name))

    def ok(v: float) -> bool:
        return _ok(replace(dev, runtime=dev.runtime.with_values({name: v})), mine)

    if not ok(v0):
        return (v0, v0, tuple(r.id for r in mine))

    def edge(limit: float) -> float:
        if ok(limit):
            return limit
        good, bad = v0, limit
        for _ in range(40):
            mid = math.sqrt(good * bad) if good > 0 and bad > 0 else (good + bad) / 2
            good, bad = (mid, bad) if ok(mid) else (good, mid)
        return good

    return (edge(info.lo), edge(info.hi), tuple(r.id for r in mine))


def table_rows_report(dev: DeviceSpec, rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Each applicable row with the table's prediction and whether it is within tolerance (for reports)."""
    out = []
    for r in rows_for(dev.id, rows):
        got = predicted(dev, r)
        rec = {
            "id": r.id,
            "measured": r.value,
            "table": round(got, 4),
            "error": round(got / r.value - 1, 4),
            "tolerance": r.tolerance,
            "within": r.within(got),
        }
        if r.bound != "point":
            rec["bound"] = r.bound  # the measurement is a bound, not a point the table must match
        out.append(rec)
    return out
