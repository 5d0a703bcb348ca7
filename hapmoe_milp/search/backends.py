"""Registry of the exact backends: each translates a :class:`~hapmoe_milp.search.depth_model.DepthModel`.

A backend is a module implementing :class:`Backend`; both (:mod:`hapmoe_milp.search.cpsat`,
:mod:`hapmoe_milp.search.milp`) build their model in the same sections, in the same order, as the OR-Tools
samples lay theirs out -- structure (one arc per slot, layers, inventory, group), layout rules, times
(with the cuts and the objective), hint, configure, decode -- so the two read line for line. The
orchestration (:mod:`hapmoe_milp.search.exact`) only goes through :func:`get`, so neither backend imports
the other or the orchestration, and the imports of the solver libraries stay lazy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Protocol, cast

from hapmoe_milp.errors import SolverError

if TYPE_CHECKING:
    from hapmoe_milp.search.depth_model import DepthModel
    from hapmoe_milp.search.formulation import SubResult

_MODULES = {"cpsat": "hapmoe_milp.search.cpsat", "milp": "hapmoe_milp.search.milp"}

NAMES = tuple(_MODULES)


class Backend(Protocol):
    """The contract of an exact backend module."""

    NAME: str

    def solve_model(
        self,
        model: DepthModel,
        *,
        time_limit: float | None = None,
        hint: list[int] | None = None,
        threads: int | None = None,
        relative_gap: float | None = None,
        **options: Any,
    ) -> SubResult:
        """Solve one depth model: "optimal" (within the backend's tolerance), "feasible", "timeout" (with a
        valid bound) or "infeasible" (nothing at or below the model's cutoff); ``hint`` is one arc per
        slot, first stage first."""
        ...

    def tolerance(self, model: DepthModel, result: SubResult) -> float:
        """Seconds by which a plan the backend returned as optimal may exceed the optimum."""
        ...

    def describe_scaling(self, options: dict[str, Any]) -> dict[str, Any]:
        """How the backend scales times (for the certificate)."""
        ...


def get(name: str) -> Backend:
    """The backend module for ``name`` (``cpsat`` or ``milp``)."""
    mod = _MODULES.get(name)
    if mod is None:
        raise SolverError(f"unknown exact solver {name!r}; use {', '.join(NAMES)} or auto", field="solver")
    return cast(Backend, importlib.import_module(mod))


__all__ = ["NAMES", "Backend", "get"]
