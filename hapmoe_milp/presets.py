"""Solver presets (solvers/*.yaml): time limit, threads, gap, pruning switches."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hapmoe_milp.config import SOLVERS
from hapmoe_milp.errors import SpecError
from hapmoe_milp.space import Pruning
from hapmoe_milp.specs._fields import Fields, load_document


@dataclass(frozen=True)
class Preset:
    name: str
    solver: str = "dp"
    time_limit: float | None = None
    pruning: Pruning = field(default_factory=Pruning)
    options: dict[str, Any] = field(default_factory=dict)


def load_preset(ref: str | Path, root: Path) -> Preset:
    p = Path(ref)
    if not p.suffix and not p.exists():
        p = root / "solvers" / f"{ref}.yaml"
    doc = load_document(p)
    f = Fields(doc, str(p))
    name = f.str_("name", p.stem)
    solver = f.choice("solver", SOLVERS, "dp")
    tl = f.float_("time_limit", None)
    pr_doc = f.raw("pruning", {})
    if not isinstance(pr_doc, dict):
        raise f.err("pruning", "must be a mapping of switch: value")
    try:
        pruning = Pruning.from_dict(pr_doc)
    except Exception as exc:  # PlanError from unknown switches
        raise SpecError(str(exc), source=str(p), field="pruning") from None
    opts: dict[str, Any] = {}
    for k in ("threads", "relative_gap", "backend"):
        if f.has(k):
            opts[k] = f.raw(k)
    f.reject_unknown(allowed_extra=("description",))
    return Preset(name=name, solver=solver, time_limit=tl, pruning=pruning, options=opts)
