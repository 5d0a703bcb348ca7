"""Solver presets (solvers/*.yaml): time limit, threads, gap, pruning switches.

A preset is read like every spec: the strict field readers of :mod:`hapmoe_milp.specs._fields` check each
value's type and refuse unknown keys, and the ranges are checked once, where they live (the time limit,
threads, gap and backend in ``config.py``, the pruning switches in :class:`~hapmoe_milp.space.Pruning`).
Every error names the preset file and the field (``solvers/x.yaml: pruning.delta: ...``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hapmoe_milp.config import SOLVER_BACKENDS, SOLVERS, check_solver_options, check_time_limit
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.space import Pruning
from hapmoe_milp.specs._fields import Fields, load_document


@dataclass(frozen=True)
class Preset:
    name: str
    solver: str = "dp"
    time_limit: float | None = None
    pruning: Pruning = field(default_factory=Pruning)
    options: dict[str, Any] = field(default_factory=dict)


def _pruning(f: Fields | None) -> Pruning:
    """The preset's pruning switches over the defaults: type by the field readers, range by Pruning."""
    if f is None:
        return Pruning()
    vals: dict[str, Any] = {}
    for fl in fields(Pruning):
        if fl.type in ("bool", bool):
            v = f.bool_(fl.name, None)
        elif fl.type in ("int", int):
            v = f.int_(fl.name, None, minimum=None)
        else:
            v = f.float_(fl.name, None, positive=False)
        if v is not None:
            vals[fl.name] = v
    f.reject_unknown(allowed_extra=("note",))
    try:
        return Pruning(**vals)
    except HapmoeError as exc:
        raise exc.at(source=f.source, field=f"pruning.{exc.field}") from None


def load_preset(ref: str | Path, root: Path) -> Preset:
    p = Path(ref)
    if not p.suffix and not p.exists():
        p = root / "solvers" / f"{ref}.yaml"
    src = str(p)
    f = Fields(load_document(p), src)
    name = f.str_("name", p.stem)
    solver = f.choice("solver", SOLVERS, "dp")
    tl = f.float_("time_limit", None, positive=False)
    pruning = _pruning(f.sub("pruning", None))
    opts: dict[str, Any] = {
        "threads": f.int_("threads", None, minimum=None),
        "relative_gap": f.float_("relative_gap", None, positive=False),
        "backend": f.choice("backend", SOLVER_BACKENDS, None),
    }
    f.reject_unknown(allowed_extra=("description",))
    try:
        if tl is not None:
            tl = check_time_limit(tl)
        opts = check_solver_options({k: v for k, v in opts.items() if v is not None})
    except HapmoeError as exc:
        raise exc.at(source=src, field=exc.field) from None
    return Preset(name=name, solver=solver, time_limit=tl, pruning=pruning, options=opts)
