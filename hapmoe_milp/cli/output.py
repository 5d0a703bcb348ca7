"""What the CLI writes: strict JSON or tables on stdout, notes and progress on stderr.

stdout carries only the answer, so everything else is steered away from it here: ``compute()`` wraps long
work with a progress line on stderr (only on a terminal) and points file descriptor 1 at stderr, because
solver libraries print banners from C code that no Python-level redirect catches.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import typer

from hapmoe_milp.fileio import stdout_to_stderr


def progress_renderer() -> Any:
    """A context manager yielding a ``Progress`` callback drawing a rich status line on stderr, or None
    when stderr is not a terminal (logs, CI, pipes get no control characters)."""
    return _RichProgress() if stderr_is_tty() else contextlib.nullcontext(None)


def stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class _RichProgress:
    """Instance i/n, best iteration time so far, bound, elapsed vs limit -- from ``ProgressEvent``s."""

    def __enter__(self) -> Any:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[best]}  {task.fields[clock]}"),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.bar.add_task("search", total=None, best="", clock="")
        self.bar.start()
        return self.update

    def update(self, ev: Any) -> None:
        best = f"best {ev.best_s:.4f} s" if ev.best_s == ev.best_s and ev.best_s < float("inf") else "no plan yet"
        if ev.bound_s == ev.bound_s:
            best += f", bound {ev.bound_s:.4f} s"
        clock = f"{ev.elapsed_s:.0f} s" + (f" of {ev.limit_s:g} s" if ev.limit_s else "")
        self.bar.update(
            self.task, description=ev.phase, completed=ev.done, total=ev.total or None, best=best, clock=clock
        )

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()


@contextlib.contextmanager
def compute() -> Iterator[Any]:
    """Around long work: a progress callback (or None) and stdout guarded against library output."""
    with progress_renderer() as prog, stdout_to_stderr():
        yield prog


def emit_json(obj: Any) -> None:
    """Print strict JSON (NaN/Infinity become null) on stdout."""
    from hapmoe_milp.fileio import dumps

    typer.echo(dumps(obj, indent=2))


def note(text: str) -> None:
    typer.echo(f"note: {text}", err=True)
