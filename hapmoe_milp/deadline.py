"""A wall-clock deadline that long work checks, so that ``--time-limit`` bounds a whole command.

A solver's own time limit covers only its search; building the instances and the sub-problems it searches
can take longer than the search on a large cluster or a deep model (CP-SAT on 2,048 H800s spent minutes
building before it looked at the clock). The front end turns the user's limit into one :class:`Deadline`
when the command starts; builders call :meth:`Deadline.check` between units of work, which raises
:class:`TimeLimitReached`; the solver that catches it returns a ``timeout`` status with whatever it had,
exactly as when its search runs out of time. Uncaught, the error is an ordinary one-line ``error:``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from hapmoe_milp.errors import SolverError

T = TypeVar("T")


class TimeLimitReached(SolverError):
    """The time limit ran out while building or searching; ``what`` says during which step."""

    def __init__(self, what: str, limit_s: float | None = None) -> None:
        self.what = what
        self.limit_s = limit_s
        within = f" ({limit_s:g} s)" if limit_s is not None else ""
        super().__init__(f"the time limit{within} ran out while {what}", field="time_limit")


class Checkpoint(Protocol):
    """What a builder takes to stop at: anything whose ``check(what)`` raises :class:`TimeLimitReached`
    once its time is up (a :class:`Deadline`; the DP's ``Clock``, whose stop also reads CPU time and the
    offload retry's share). Builders that price options call it between units of pricing, which is what
    keeps a search that must stop from overrunning the limit by a whole pricing pass."""

    def check(self, what: str) -> None: ...


@dataclass(frozen=True)
class Deadline:
    """``at`` is a ``time.perf_counter()`` value (None: no deadline); ``limit_s`` the limit it came from."""

    at: float | None = None
    limit_s: float | None = None

    @classmethod
    def after(cls, seconds: float | None, start: float | None = None) -> Deadline:
        """The deadline ``seconds`` after ``start`` (default: now); None or a non-finite value means none."""
        if seconds is None or not math.isfinite(seconds):
            return cls()
        begin = time.perf_counter() if start is None else start
        return cls(begin + seconds, seconds)

    def left(self) -> float:
        """Seconds left (inf without a deadline; negative once passed)."""
        return math.inf if self.at is None else self.at - time.perf_counter()

    def passed(self) -> bool:
        return self.at is not None and time.perf_counter() > self.at

    def check(self, what: str) -> None:
        """Raise :class:`TimeLimitReached` naming ``what`` was under way, if the deadline has passed."""
        if self.passed():
            raise TimeLimitReached(what, self.limit_s)

    def each(self, items: Iterable[T], what: str) -> Iterator[T]:
        """``items`` with a :meth:`check` before each one is produced (for lazy builders)."""
        it = iter(items)
        while True:
            self.check(what)
            try:
                item = next(it)
            except StopIteration:
                return
            yield item


NO_DEADLINE = Deadline()

__all__ = ["NO_DEADLINE", "Checkpoint", "Deadline", "TimeLimitReached"]
