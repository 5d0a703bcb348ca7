"""The typer app: global options, the command table, and the entry points that turn errors into exit codes.

Commands live one module per group (:mod:`.catalog`, :mod:`.planning`, :mod:`.studies`,
:mod:`.measurement`) as plain functions and are registered here, in the order ``--help`` lists them, so this
file is the map of the CLI. :func:`run` is where every error ends: a ``HapmoeError`` becomes one
``error:`` line and exit status 2, a usage error its usage line plus one ``error:`` line, never a traceback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from hapmoe_milp.cli import catalog, measurement, planning, studies
from hapmoe_milp.cli.options import STATE, flags
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.specs.catalog import Catalog

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,  # a bare `hapmoe-milp` is a usage error (exit 2), its help would go to stdout
    pretty_exceptions_enable=False,
    context_settings={"max_content_width": 80, "help_option_names": ["-h", "--help"]},
    help="Heterogeneity-aware parallelism planner for MoE training: plans, estimates and launch files.",
)


@app.callback()
def _main(
    devices_dir: Annotated[
        list[Path] | None,
        typer.Option("--devices-dir", help="Extra folder of device tables (e.g. profiled), searched first."),
    ] = None,
    verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, help="Log to stderr: -v info, -vv debug.")] = 0,
) -> None:
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr, force=True)
    STATE.verbose = verbose
    with flags():
        STATE.catalog = Catalog(devices_dirs=tuple(devices_dir or ()))


# (command name, function), in --help order; typer derives a name from the function unless one is given
COMMANDS: tuple[tuple[str | None, Any], ...] = (
    (None, catalog.models),
    (None, catalog.clusters),
    (None, catalog.devices),
    (None, planning.estimate),
    (None, planning.solve),
    (None, planning.validate),
    ("export", planning.export_cmd),
    (None, studies.compare),
    (None, studies.sweep),
    (None, measurement.profile),
    ("compare-profile", measurement.compare_profile),
    (None, measurement.calibrate),
    (None, measurement.fidelity),
)
for _name, _fn in COMMANDS:
    app.command(_name)(_fn)


# ---------------------------------------------------------------------- entry point
def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _usage_error(exc: Any) -> int:
    """A command-line usage error: one ``error:`` line (what is wrong, then where the help is); exit status 2.
    One line like every other bad input, so a script reading stderr sees the same shape whatever went wrong."""
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else "hapmoe-milp"
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        typer.echo(f"error: missing command; run '{path} --help' for the list", err=True)
        return 2
    typer.echo(f"error: {_one_line(exc.format_message())} (see '{path} --help')", err=True)
    code = getattr(exc, "exit_code", 2)
    return code if isinstance(code, int) and code else 2


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # unwind: sweeps stop their workers, temp files are removed


def run(argv: list[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default: sys.argv) and return the exit status instead of exiting."""
    try:
        rc = app(args=argv, prog_name="hapmoe-milp", standalone_mode=False)
        return rc if isinstance(rc, int) else 0
    except HapmoeError as e:
        typer.echo(f"error: {e}", err=True)
        return 2
    except typer.Exit as e:
        return int(e.exit_code or 0)
    except typer.Abort:
        typer.echo("aborted", err=True)
        return 130
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        return 130
    except BrokenPipeError:  # `hapmoe-milp models --json | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep interpreter exit quiet
        return 0
    except Exception as e:
        if _is_usage_error(e):
            return _usage_error(e)
        raise


def _is_usage_error(exc: BaseException) -> bool:
    """Click's usage errors, whichever click raised them: recent typer vendors its own (typer._click) and
    older typer uses the click package; both have ``format_message`` and an integer ``exit_code``. We never
    import click itself -- it is not a dependency of ours, and may not be installed."""
    return callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int)


def main(argv: list[str] | None = None) -> None:
    with contextlib.suppress(ValueError):  # not in the main thread (embedded use): keep the default
        signal.signal(signal.SIGTERM, _sigterm)
    code = run(argv)
    if code:
        sys.exit(code)
