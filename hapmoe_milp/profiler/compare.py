"""A profiled device table next to the shipped one: where do the public numbers miss this machine?

Every table is compared at the union of both tables' sample points (a point outside one table's range is
evaluated as that table would be by the cost model: clamped, or reported as out of range when the table
refuses to extrapolate), and every scalar the cost model reads is compared too. Efficiencies are fractions of
each file's own peak, so when the peaks differ the achieved TFLOP/s rows are the ones to read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hapmoe_milp.errors import TableRangeError
from hapmoe_milp.specs.device import LINK_CLASSES, PRIMITIVES, DeviceSpec
from hapmoe_milp.specs.tables import Table


@dataclass(frozen=True)
class Row:
    """One compared quantity at one sample point (``x`` is None for scalars)."""

    quantity: str
    x: float | None
    x_unit: str
    profiled: float
    shipped: float
    unit: str = ""
    note: str = ""

    @property
    def ratio(self) -> float:
        """profiled / shipped (NaN when either side is missing or the shipped value is 0)."""
        if math.isnan(self.profiled) or math.isnan(self.shipped) or self.shipped == 0:
            return math.nan
        return self.profiled / self.shipped

    def to_dict(self) -> dict[str, object]:
        return {
            "quantity": self.quantity,
            "x": self.x,
            "x_unit": self.x_unit,
            "profiled": self.profiled,
            "shipped": self.shipped,
            "ratio": self.ratio,
            "unit": self.unit,
            "note": self.note,
        }


def _lookup(t: Table, x: float) -> tuple[float, str]:
    """Value as the cost model would read it, plus a note when ``x`` is outside the measured range."""
    try:
        v = t(x)
    except TableRangeError:
        return math.nan, "out of range (extrapolate: error)"
    if x < t.x[0] or x > t.x[-1]:
        return v, "clamped"
    return v, ""


def _table_rows(
    quantity: str,
    prof: Table,
    ship: Table,
    unit: str,
    scale: tuple[float, float] = (1.0, 1.0),
) -> list[Row]:
    rows: list[Row] = []
    for x in sorted(set(prof.x) | set(ship.x)):
        pv, pn = _lookup(prof, x)
        sv, sn = _lookup(ship, x)
        notes = [f"profiled {pn}" if pn else "", f"shipped {sn}" if sn else ""]
        rows.append(
            Row(
                quantity=quantity,
                x=x,
                x_unit=prof.x_unit or ship.x_unit,
                profiled=pv * scale[0],
                shipped=sv * scale[1],
                unit=unit,
                note="; ".join(n for n in notes if n),
            )
        )
    return rows


def compare_tables(profiled: DeviceSpec, shipped: DeviceSpec) -> list[Row]:
    """Rows for every scalar and every table entry the cost model reads, profiled vs shipped."""
    rows: list[Row] = []

    def scalar(q: str, get: Callable[[DeviceSpec], float | None], unit: str = "") -> None:
        pv, sv = get(profiled), get(shipped)
        if pv is None and sv is None:
            return
        rows.append(
            Row(
                q,
                None,
                "",
                math.nan if pv is None else float(pv),
                math.nan if sv is None else float(sv),
                unit,
                "" if pv is not None and sv is not None else "missing on one side",
            )
        )

    scalar("peak_tflops.bf16", lambda d: d.peak("bf16"), "TFLOP/s")
    scalar("peak_tflops.fp8", lambda d: d.peak_tflops.get("fp8"), "TFLOP/s")
    scalar("memory_gib", lambda d: d.memory_gib, "GiB")
    scalar("memory_bandwidth_GBps", lambda d: d.memory_bandwidth_GBps, "GB/s")
    scalar("memory_bound_efficiency", lambda d: d.memory_bound_efficiency)
    scalar("memory_bound_GBps", lambda d: d.memory_bound_efficiency * d.memory_bandwidth_GBps, "GB/s")
    scalar("devices_per_node", lambda d: d.devices_per_node)
    scalar("intra_node.per_device_GBps", lambda d: d.intra.per_device_GBps, "GB/s")
    scalar("intra_node.per_pair_GBps", lambda d: d.intra.per_pair_GBps, "GB/s")
    scalar("nic_Gbps", lambda d: d.nic_Gbps, "Gb/s")

    pp, sp = profiled.peak("bf16"), shipped.peak("bf16")
    rows += _table_rows("gemm_efficiency", profiled.gemm_efficiency, shipped.gemm_efficiency, "fraction")
    rows += _table_rows("attention_efficiency", profiled.attention_efficiency, shipped.attention_efficiency, "fraction")
    rows += _table_rows(
        "attention_bwd_efficiency", profiled.attention_bwd_efficiency, shipped.attention_bwd_efficiency, "fraction"
    )
    if abs(pp - sp) > 1e-3 * max(pp, sp):
        rows += _table_rows("gemm_tflops", profiled.gemm_efficiency, shipped.gemm_efficiency, "TFLOP/s", (pp, sp))
        rows += _table_rows(
            "attention_tflops", profiled.attention_efficiency, shipped.attention_efficiency, "TFLOP/s", (pp, sp)
        )
        rows += _table_rows(
            "attention_bwd_tflops",
            profiled.attention_bwd_efficiency,
            shipped.attention_bwd_efficiency,
            "TFLOP/s",
            (pp, sp),
        )
    for link in LINK_CLASSES:
        for prim in PRIMITIVES:
            rows += _table_rows(
                f"collectives.{link}.{prim}",
                profiled.collectives[link][prim],
                shipped.collectives[link][prim],
                "GB/s busbw",
            )
    return rows


def summarize_rows(rows: Sequence[Row]) -> dict[str, float]:
    """Geometric-mean ratio per quantity over its finite rows: one number per table for a quick look."""
    acc: dict[str, list[float]] = {}
    for r in rows:
        if math.isfinite(r.ratio) and r.ratio > 0:
            acc.setdefault(r.quantity, []).append(math.log(r.ratio))
    return {q: math.exp(sum(v) / len(v)) for q, v in acc.items()}


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if math.isnan(v):
        return "n/a"
    return f"{v:.4g}"


def format_rows(rows: Sequence[Row]) -> str:
    """Plain-text table (the CLI can render the same rows with rich)."""
    head = ("quantity", "x", "profiled", "shipped", "ratio", "note")
    body = [
        (
            r.quantity,
            "" if r.x is None else f"{r.x:.4g} {r.x_unit}".strip(),
            f"{_fmt(r.profiled)} {r.unit}".strip(),
            f"{_fmt(r.shipped)} {r.unit}".strip(),
            _fmt(r.ratio),
            r.note,
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)).rstrip() for b in body]
    return "\n".join(lines)
