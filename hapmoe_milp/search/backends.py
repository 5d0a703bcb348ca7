"""Registry of the exact backends: each translates a :class:`~hapmoe_milp.search.formulation.DepthModel`.

A backend is a module with ``NAME``, ``solve_model(model, *, time_limit, cutoff_hint, hint, threads,
relative_gap, backend, **options) -> SubResult``, ``tolerance(model, result) -> float`` (seconds by which
a returned "optimal" plan may exceed the optimum) and ``describe_scaling(options) -> dict``. The
orchestration (:mod:`hapmoe_milp.search.exact`) only goes through :func:`get`, so neither backend
imports the other or the orchestration, and the imports of the solver libraries stay lazy.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from hapmoe_milp.errors import SolverError

_MODULES = {"cpsat": "hapmoe_milp.search.cpsat", "milp": "hapmoe_milp.search.milp"}

NAMES = tuple(_MODULES)


def get(name: str) -> ModuleType:
    """The backend module for ``name`` (``cpsat`` or ``milp``)."""
    mod = _MODULES.get(name)
    if mod is None:
        raise SolverError(f"unknown exact solver {name!r}; use {', '.join(NAMES)} or auto", field="solver")
    return importlib.import_module(mod)


__all__ = ["NAMES", "get"]
