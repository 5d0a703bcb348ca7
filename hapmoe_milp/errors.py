"""One error family for everything a user can get wrong.

The CLI catches :class:`HapmoeError` and prints ``str(err)`` on one line with exit code 2, so every
message must say *where* (file and field) and *what* is wrong without needing a traceback.
"""

from __future__ import annotations


class HapmoeError(Exception):
    """Base class of every user-facing error."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None) -> None:
        self.source = source
        self.field = field
        self.detail = message
        parts = []
        if source:
            parts.append(str(source))
        if field:
            parts.append(field)
        prefix = ": ".join(parts)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class SpecError(HapmoeError):
    """A model, cluster, device or preset file is missing, malformed or inconsistent."""


class TableRangeError(HapmoeError):
    """A lookup table was asked for a point outside its measured range and declares no extrapolation."""


class PlanError(HapmoeError):
    """A plan breaks an invariant (inventory, divisibility, framework rule)."""


class InfeasibleError(HapmoeError):
    """No plan fits; the message names the tightest constraint with its numbers."""

    def __init__(self, message: str, *, constraint: str = "", **kw: object) -> None:
        self.constraint = constraint
        super().__init__(message, **kw)  # type: ignore[arg-type]


class SolverError(HapmoeError):
    """A solver is unavailable or failed in a way the user can act on."""


class ExportError(HapmoeError):
    """A plan cannot be expressed in the requested target framework."""
