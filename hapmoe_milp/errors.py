"""One error family for everything a user can get wrong.

The CLI catches :class:`HapmoeError` and prints ``str(err)`` on one line with exit code 2, so every
message must say *where* (file and field) and *what* is wrong without needing a traceback.
"""

from __future__ import annotations

MAX_MESSAGE = 1000  # characters; an error quotes what is wrong, never megabytes of input


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
        text = f"{prefix}: {message}" if prefix else message
        # one line, whatever a path, key or value contained (the CLI promises one line per error)
        text = text.replace("\r", "\\r").replace("\n", "\\n")
        if len(text) > MAX_MESSAGE:
            text = text[: MAX_MESSAGE - 20] + " ... (message cut)"
        super().__init__(text)

    def at(self, *, source: str | None = None, field: str | None = None) -> HapmoeError:
        """The same error (class and detail) reported at another place: a front end (CLI flag, plan file,
        YAML) re-raises what the validation layer found under its own name for the value, so the message
        reads the same wherever the value came from."""
        err = type(self).__new__(type(self))
        err.__dict__.update(self.__dict__)
        HapmoeError.__init__(err, self.detail, source=source, field=field)
        return err


class SpecError(HapmoeError):
    """A model, cluster, device or preset file is missing, malformed or inconsistent."""


class SettingsError(HapmoeError):
    """A run setting or parallel degree is out of range (checked once, in ``config.py``)."""


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
