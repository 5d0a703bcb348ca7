"""Command-line interface: parse, call the library, render. No planning logic lives here.

What every command promises (the bad-input and CLI tests check it):

* stdout carries only the answer -- a table, or strict JSON with ``--json`` (no NaN/Infinity);
  progress, warnings and logs go to stderr, and so does whatever a solver library prints: compute runs
  with file descriptor 1 pointed at stderr (:func:`.output.stdout_to_stderr`);
* a bad value gets one line ``error: <flag or file>: <field>: <what is wrong>`` and exit status 2, never a
  traceback; values are checked once, by the library's validation layer, and relabelled here with the
  flag they came from (:data:`.options.FLAGS`); usage errors print the usage line, that one error line, exit 2;
* output paths are checked before any long computation, and files are written atomically.

The rooms: :mod:`.app` (typer app, command table, exit codes), :mod:`.options` (option aliases, the
field -> flag table, catalog look-ups), :mod:`.output` (JSON, notes, progress, stdout guard), and one module
per command group: :mod:`.catalog`, :mod:`.planning`, :mod:`.studies`, :mod:`.measurement`.

Adding a command (e.g. ``calibrate``): one function in its group's module with the option aliases of
:mod:`.options`, ``with flags():`` around the calls that check values, ``emit_json`` / ``render.console()``
for the answer, ``compute()`` around long work (progress + stdout guard); then one row in
:data:`.app.COMMANDS`.
"""

from __future__ import annotations

from hapmoe_milp.cli.app import app, main, run

__all__ = ["app", "main", "run"]
