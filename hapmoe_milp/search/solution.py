"""The one result type every solver returns, with its certificate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from hapmoe_milp.plan import Plan

Status = Literal["optimal", "feasible", "infeasible", "timeout"]


@dataclass(frozen=True)
class ProgressEvent:
    """What a long search reports while it runs, so a front end can show it (the CLI draws it on stderr).

    ``phase`` names the step (e.g. ``"build"``, ``"dp"``, ``"refine"``, ``"cpsat"``, ``"milp"``);
    ``done``/``total`` count its units of work (instances, sub-models); ``best_s`` is the best iteration
    time found so far (inf before any plan); ``bound_s`` the best proven lower bound (nan if none).
    """

    phase: str
    done: int
    total: int
    best_s: float
    elapsed_s: float
    limit_s: float | None = None
    bound_s: float = float("nan")


Progress = Callable[[ProgressEvent], None]


@dataclass(frozen=True)
class Solution:
    """A plan with the solver's certificate.

    ``objective_s`` is the closed-form iteration time of ``plan`` (what `estimate --plan` reports);
    ``bound_s`` is the best proven lower bound on the optimum within the solver's space; ``gap`` is
    ``(objective - bound) / objective``.
    """

    solver: str
    status: Status
    plan: Plan | None
    objective_s: float
    bound_s: float
    wall_s: float
    pruned: dict[str, int] = field(default_factory=dict)
    runner_up: Plan | None = None
    runner_up_s: float | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    message: str = ""

    @property
    def gap(self) -> float:
        if self.plan is None or self.objective_s <= 0 or self.bound_s != self.bound_s:
            return float("nan")
        return max(0.0, (self.objective_s - self.bound_s) / self.objective_s)

    def certificate(self) -> dict[str, Any]:
        return {
            "name": self.solver,
            "status": self.status,
            "objective_s": self.objective_s,
            "bound_s": self.bound_s,
            "gap": self.gap,
            "wall_s": self.wall_s,
            "pruned": dict(self.pruned),
            **({"message": self.message} if self.message else {}),
            **self.stats,
        }
