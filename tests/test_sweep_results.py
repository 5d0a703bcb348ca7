"""Sweep result rows: one checked reader for fresh and resumed rows, and appends that survive a full disk.

A resumed sweep reads its file back with the reader a fresh result goes through before it is appended
(:func:`hapmoe_milp.sweep.results.check_row`), so a hand-edited or foreign row is one ``error:`` line naming
the file, the line and the field -- never a traceback, never a NaN in the best table. A write that fails
(full disk, file-size limit) stops the sweep with one line and exit 2 and leaves no torn line; a torn last
line left by a kill is cut off on resume (the documented repair), a complete one whose newline was lost is
kept.
"""

from __future__ import annotations

import copy
import json
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hapmoe_milp import cli
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.sweep import cases_from_clusters, read_results
from hapmoe_milp.sweep.results import check_row, error_row
from tests.test_cli_bad_input import run_bad

CASES = cases_from_clusters(["mixtral-s"], ["16-1", "8xh800"])
# An ok row as run_case writes it (the values are a real 16-1 result's, rounded; only their types and
# ranges matter here).
OK_ROW: dict[str, Any] = {
    "id": CASES[0].id,
    "model": "mixtral-s",
    "cluster": {
        "spec": "16-1",
        "name": "16-1",
        "composition": "h800(1x8) + 910b(1x8)",
        "devices": 16,
        "by_type": {"h800": 8, "910b": 8},
    },
    "settings": {},
    "status": "ok",
    "iteration_time_s": 14.45,
    "tokens_per_s": 72586.7,
    "tokens_per_s_per_device": 4536.7,
    "mfu": 0.405,
    "fits": True,
    "devices": 16,
    "devices_used": 16,
    "price_per_hour": None,
    "tokens_per_dollar": None,
    "plan": {"family": "megatron", "pp": 2, "stages": []},
    "solver": {"name": "dp", "status": "feasible", "wall_s": 1.3, "gap": None},
    "wall_s": 1.4,
}
ERROR_ROW = error_row(CASES[1], "no plan fits")
SWEEP = ["sweep", "-m", "mixtral-s", "--clusters", "16-1,8xh800", "--out", "r.jsonl", "--resume", "--workers", "1"]


def _mutate(row: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(row)
    node = out
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[k]
    if value is _DEL:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return out


_DEL = object()

# (row, path, value, field the error names); NaN is written the way Python's json writes it
ROW_CASES: list[tuple[str, str, Any, str]] = [
    ("ok", "id", [1, 2], "id"),
    ("ok", "id", "", "id"),
    ("ok", "id", "a b; rm", "id"),
    ("ok", "model", _DEL, "model"),
    ("ok", "model", 3, "model"),
    ("ok", "status", "done", "status"),
    ("ok", "devices", "abc", "devices"),
    ("ok", "devices", 2**70, "devices"),
    ("ok", "cluster", "16-1", "cluster"),
    ("ok", "cluster.spec", _DEL, "cluster.spec"),
    ("ok", "cluster.devices", -3, "cluster.devices"),
    ("ok", "cluster.by_type", {"h800": "8"}, "cluster.by_type.h800"),
    ("ok", "settings", [], "settings"),
    ("ok", "tokens_per_s", math.nan, "tokens_per_s"),
    ("ok", "tokens_per_s", math.inf, "tokens_per_s"),
    ("ok", "tokens_per_s", 1e308, "tokens_per_s"),
    ("ok", "tokens_per_s", 5e-324, "tokens_per_s"),
    ("ok", "tokens_per_s", -5.0, "tokens_per_s"),
    ("ok", "tokens_per_s", None, "tokens_per_s"),
    ("ok", "tokens_per_s", "fast", "tokens_per_s"),
    ("ok", "tokens_per_s_per_device", 1e300, "tokens_per_s_per_device"),
    ("ok", "iteration_time_s", 0.0, "iteration_time_s"),
    ("ok", "mfu", 7.0, "mfu"),
    ("ok", "fits", "yes", "fits"),
    ("ok", "price_per_hour", -1.0, "price_per_hour"),
    ("ok", "plan", "pp2", "plan"),
    ("ok", "wall_s", -1.0, "wall_s"),
    ("error", "error", _DEL, "error"),
    ("error", "error", {"why": 1}, "error"),
    ("error", "cluster", None, "cluster"),
]


def _write_rows(folder: Path, rows: list[Any], tail: bytes = b"") -> Path:
    p = folder / "r.jsonl"
    text = "".join(json.dumps(r) + "\n" for r in rows)  # Python's json writes NaN, as a foreign tool may
    p.write_bytes(text.encode() + tail)
    return p


@pytest.mark.parametrize(("which", "path", "value", "field"), ROW_CASES, ids=lambda v: str(v)[:20])
def test_resume_refuses_a_bad_row_naming_file_line_and_field(
    which: str, path: str, value: Any, field: str, tmp_path: Path, capsys: Any
) -> None:
    good = OK_ROW if which == "ok" else ERROR_ROW
    bad = _mutate(good, path, value)
    rows = [ERROR_ROW, bad] if which == "ok" else [OK_ROW, bad]
    _write_rows(tmp_path, rows)
    run_bad(SWEEP, tmp_path, capsys, "r.jsonl", "line 2", field)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"id": "a",', "line 1"),
        ("[1, 2]", "expected a mapping"),
        ('{"id": "x", "id": "y"}', "duplicate key"),
        ("\udcff", "line 1"),
    ],
    ids=["json", "list", "dup", "bytes"],
)
def test_resume_refuses_a_broken_line(text: str, words: str, tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "r.jsonl").write_bytes(text.encode("utf-8", "surrogateescape") + b"\n")
    run_bad(SWEEP, tmp_path, capsys, "r.jsonl", words)


def test_the_reader_accepts_what_a_sweep_writes() -> None:
    assert check_row(OK_ROW, "x") == OK_ROW
    assert check_row(ERROR_ROW, "x") == ERROR_ROW


def test_torn_last_line_is_ignored_by_reading_and_cut_off_by_resume(tmp_path: Path) -> None:
    """The documented repair: bytes after the last newline that are not a whole valid row are what an
    interrupted write leaves; reading skips them, resuming removes them. A whole row missing only its
    newline is kept (its JSON is complete), even when it would not pass as a row it is never trusted."""
    ok = copy.deepcopy(OK_ROW)
    torn = json.dumps(ok)[:-25].encode()
    p = _write_rows(tmp_path, [ERROR_ROW], torn)
    assert [r["id"] for r in read_results(p)] == [ERROR_ROW["id"]]
    whole_bad = _write_rows(tmp_path, [ERROR_ROW], json.dumps({**ok, "tokens_per_s": 1e308}).encode())
    assert [r["id"] for r in read_results(whole_bad)] == [ERROR_ROW["id"]]  # not a valid row: torn


def test_fresh_unphysical_result_becomes_an_error_row() -> None:
    """run_case checks its own row with the reader --resume uses: a non-finite throughput is an error row."""
    with pytest.raises(HapmoeError, match="tokens_per_s"):
        check_row({**OK_ROW, "tokens_per_s": None}, "result")


# ---------------------------------------------------------------------- property-based
_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([5e-324, 1e-320, 1e308, -0.0, 0, 1e-300]),
)
_VALUES = st.one_of(
    _NUMBERS,
    st.none(),
    st.booleans(),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
ROW_PATHS = [
    "id",
    "model",
    "status",
    "devices",
    "devices_used",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "iteration_time_s",
    "mfu",
    "fits",
    "price_per_hour",
    "tokens_per_dollar",
    "wall_s",
    "cluster",
    "cluster.spec",
    "cluster.devices",
    "cluster.by_type",
    "settings",
    "plan",
    "solver",
]
H = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@H
@given(path=st.sampled_from(ROW_PATHS), value=_VALUES)
def test_property_random_row_values(path: str, value: Any) -> None:
    """Random types and numbers in any field: the reader accepts the row or raises a HapmoeError naming the
    field -- nothing else -- and what it accepts is finite, in range, and usable by the report."""
    row = _mutate(OK_ROW, path, value)
    try:
        out = check_row(row, "rows.jsonl: line 1")
    except HapmoeError as exc:
        assert str(exc).startswith("rows.jsonl: line 1: ") and exc.field, str(exc)
        assert not str(exc).rstrip().endswith(":"), str(exc)
        return
    for key in ("tokens_per_s", "tokens_per_s_per_device", "iteration_time_s"):
        assert isinstance(out[key], int | float) and math.isfinite(out[key]) and out[key] > 0
    assert isinstance(out["id"], str) and isinstance(out["model"], str)


@H
@given(path=st.sampled_from(ROW_PATHS), value=_VALUES)
def test_property_resume_with_random_rows(path: str, value: Any, capsys: Any) -> None:
    """The same rows through ``sweep --resume``: exit 2 with one line naming the file and line 1, or (for
    a row the reader accepts) no error about the file -- the case is then already done."""
    row = _mutate(OK_ROW, path, value)
    try:
        check_row(json.loads(json.dumps(row)), "x")
        valid = not any(isinstance(v, float) and not math.isfinite(v) for v in _leaves(row))
    except (HapmoeError, ValueError):
        valid = False
    if valid:
        return  # a valid row: resuming would solve the other case; not what this test is about
    with tempfile.TemporaryDirectory() as td:
        _write_rows(Path(td), [row])
        run_bad(SWEEP, Path(td), capsys, "r.jsonl", "line 1")


def _leaves(v: Any) -> list[Any]:
    if isinstance(v, dict):
        return [x for y in v.values() for x in _leaves(y)]
    if isinstance(v, list):
        return [x for y in v for x in _leaves(y)]
    return [v]


# ---------------------------------------------------------------------- disk full
DISK_FULL_SWEEP = textwrap.dedent(
    """
    import sys
    from hapmoe_milp import cli
    sys.exit(cli.run(sys.argv[1:]))
    """
)


def _limited(limit: int) -> Any:
    def setup() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return setup


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="needs RLIMIT_FSIZE (POSIX)")
def test_a_full_disk_stops_the_sweep_cleanly_and_resume_finishes_it(tmp_path: Path) -> None:
    """A real EFBIG: the file-size limit lets the first row in, cuts the second one short. The sweep stops
    with one line and exit 2, the file holds only whole lines, and --resume (with room again) finishes."""
    out = tmp_path / "r.jsonl"
    argv = ["sweep", "-m", "mixtral-s", "--clusters", "no-such-a,no-such-b,no-such-c", "--out", str(out)]
    assert cli.run([*argv[:-1], str(tmp_path / "free.jsonl")]) == 0  # the same rows with room: their sizes
    first = len((tmp_path / "free.jsonl").read_bytes().split(b"\n")[0]) + 1
    (tmp_path / "free.jsonl").unlink()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for resume in ([], ["--resume"]):
        p = subprocess.run(
            [sys.executable, "-c", DISK_FULL_SWEEP, *argv, "--workers", "1", *resume],
            preexec_fn=_limited(first + 40),  # room for the first row and a part of the second
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
        )
        assert p.returncode == 2, p.stderr
        assert "Traceback" not in p.stderr
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and str(out) in errors[0] and "--out" in errors[0], p.stderr
        assert "File too large" in errors[0]
        data = out.read_bytes()
        assert data.endswith(b"\n") and data.count(b"\n") == 1, data[-200:]  # no torn line
    assert cli.run([*argv, "--resume"]) == 0
    lines = out.read_bytes().decode().splitlines()
    assert sorted(json.loads(ln)["id"] for ln in lines) == sorted(
        c.id for c in cases_from_clusters(["mixtral-s"], ["no-such-a", "no-such-b", "no-such-c"])
    )
