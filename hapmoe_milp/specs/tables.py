"""Lookup tables with log-space interpolation.

Device tables map a size (GEMM FLOPs, sequence length, message bytes) to an achieved rate. Sizes span
orders of magnitude, so we interpolate linearly in log(x). Asking outside the measured range is an error
unless the table itself declares how to extrapolate: a planner that silently guesses is how OOM and
slow plans get shipped.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Literal

from hapmoe_milp.errors import SpecError, TableRangeError
from hapmoe_milp.specs._fields import Fields, show

Extrapolate = Literal["error", "clamp"]


@dataclass(frozen=True)
class Table:
    """y(x) sampled at increasing positive x; linear in log(x) between samples."""

    x: tuple[float, ...]
    y: tuple[float, ...]
    extrapolate: Extrapolate = "error"
    name: str = ""
    x_unit: str = ""
    y_unit: str = ""
    source: str = ""
    _lx: tuple[float, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_lx", tuple(math.log(v) for v in self.x))

    def __call__(self, x: float) -> float:
        xs, ys = self.x, self.y
        if math.isnan(x):
            raise TableRangeError("lookup of NaN", source=self.source or None, field=self.name or None)
        if x < xs[0] or x > xs[-1]:
            if self.extrapolate == "clamp":
                return ys[0] if x < xs[0] else ys[-1]
            raise TableRangeError(
                f"{x:.4g} {self.x_unit} is outside the table's range [{xs[0]:.4g}, {xs[-1]:.4g}] and the table "
                "declares no extrapolation (set `extrapolate: clamp` to allow it)",
                source=self.source or None,
                field=self.name or None,
            )
        if len(xs) == 1:
            return ys[0]
        i = bisect_left(xs, x)
        if i < len(xs) and xs[i] == x:
            return ys[i]
        lx = math.log(x)
        x0, x1 = self._lx[i - 1], self._lx[i]
        w = (lx - x0) / (x1 - x0)
        return ys[i - 1] + w * (ys[i] - ys[i - 1])

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"x": list(self.x), "y": list(self.y), "extrapolate": self.extrapolate}
        if self.x_unit:
            d["x_unit"] = self.x_unit
        if self.y_unit:
            d["y_unit"] = self.y_unit
        return d


def _number(v: Any) -> bool:
    """A finite number that is not a denormal (which would turn into inf or 0 at the first division)."""
    return (
        not isinstance(v, bool)
        and isinstance(v, (int, float))
        and math.isfinite(v)
        and (v == 0 or abs(v) >= sys.float_info.min)
    )


def table_from_fields(f: Fields, *, positive_y: bool = True, y_range: tuple[float, float] | None = None) -> Table:
    """A table from its fields; ``y_range`` is the physical range of its values (limits.RANGE_*)."""
    xs = f.list_("x")
    ys = f.list_("y")
    if len(xs) != len(ys):
        raise f.err("y", f"has {len(ys)} values but x has {len(xs)}")
    if not xs:
        raise f.err("x", "must not be empty")
    fx: list[float] = []
    fy: list[float] = []
    for i, (a, b) in enumerate(zip(xs, ys, strict=True)):
        if not _number(a) or a <= 0:
            raise f.err(f"x[{i}]", f"must be a positive number, got {show(a)}")
        if not _number(b):
            raise f.err(f"y[{i}]", f"must be a finite number, got {show(b)}")
        if positive_y and b <= 0:
            raise f.err(f"y[{i}]", f"must be positive, got {b!r}")
        if y_range is not None and not y_range[0] <= b <= y_range[1]:
            raise f.err(f"y[{i}]", f"{b:g} is outside the physical range [{y_range[0]:g}, {y_range[1]:g}]")
        if fx and a <= fx[-1]:
            raise f.err(f"x[{i}]", "x values must be strictly increasing")
        fx.append(float(a))
        fy.append(float(b))
    ext = f.choice("extrapolate", ("error", "clamp"), "error")
    t = Table(
        tuple(fx),
        tuple(fy),
        ext,
        name=f.prefix,
        x_unit=f.str_("x_unit", ""),
        y_unit=f.str_("y_unit", ""),
        source=f.source,
    )
    f.reject_unknown(allowed_extra=("note",))
    return t


def constant_table(value: float, name: str = "") -> Table:
    if value <= 0:
        raise SpecError(f"constant table value must be positive, got {value}", field=name or None)
    return Table((1.0,), (value,), "clamp", name=name)
