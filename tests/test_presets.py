"""Solver presets: the shipped ones load, and every value goes through the strict readers and its range.

The table of hand-picked bad presets is in tests/test_cli_bad_input.py (through the CLI); here a hypothesis
test drives preset YAML with random types and numbers in every field: the loader either returns a preset
whose values are all in their documented ranges or raises one HapmoeError naming the file and the field,
with a reason -- never another exception.
"""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hapmoe_milp.config import SOLVER_BACKENDS, check_solver_options
from hapmoe_milp.errors import HapmoeError, SettingsError
from hapmoe_milp.limits import MAX_THREADS, MAX_TIME_LIMIT_S
from hapmoe_milp.presets import load_preset
from hapmoe_milp.space import PRUNING_RANGES, Pruning
from hapmoe_milp.specs import Catalog

ROOT = Catalog().root


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "solvers").glob("*.yaml")))
def test_shipped_presets_load(name: str) -> None:
    pr = load_preset(name, ROOT)
    assert pr.name == name and pr.time_limit is not None and 0 < pr.time_limit <= MAX_TIME_LIMIT_S


def test_fast_preset_values() -> None:
    """The values solvers/fast.yaml states, read back (HAPMoE's delta=0.2, eta=2; 16 stages)."""
    pr = load_preset("fast", ROOT)
    assert (pr.solver, pr.time_limit) == ("dp", 60.0)
    assert (pr.pruning.delta, pr.pruning.eta, pr.pruning.max_stages) == (0.2, 2.0, 16)


def test_pruning_is_checked_whoever_builds_it() -> None:
    """The Python API gets the same checks as a preset file, under the switch's own name."""
    for kw, name in (({"delta": "x"}, "delta"), ({"max_vpp": 0}, "max_vpp"), ({"pareto_eps": math.nan}, "pareto_eps")):
        with pytest.raises(SettingsError) as ei:
            Pruning(**kw)
        assert ei.value.field == name
    with pytest.raises(SettingsError, match="threads"):
        check_solver_options({"threads": -1})
    assert check_solver_options({"threads": 4.0, "resolution_s": 1e-3}) == {"threads": 4, "resolution_s": 1e-3}


def test_scientific_notation_reads_as_a_number(tmp_path: Path) -> None:
    """YAML 1.1 reads ``1e-4`` as a string; every spec and preset reads it as the number people mean."""
    f = tmp_path / "p.yaml"
    f.write_text("relative_gap: 1e-4\ntime_limit: 3e1\npruning: {pareto_eps: 2E-3}\n")
    pr = load_preset(f, ROOT)
    assert (pr.options["relative_gap"], pr.time_limit, pr.pruning.pareto_eps) == (1e-4, 30.0, 2e-3)


# ---------------------------------------------------------------------- property-based
_ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([5e-324, 1e-300, 1e300, -0.0, 0, 1, 2, 64, 65, 1024, 1025]),
    st.text(max_size=8),
    st.lists(st.integers(-3, 3), max_size=2),
    st.dictionaries(st.sampled_from(["a", "delta"]), st.integers(-3, 3), max_size=2),
)
TOP = ["name", "solver", "time_limit", "threads", "relative_gap", "backend", "description", "pruning"]
SWITCHES = [f.name for f in fields(Pruning)]
H = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@H
@given(
    top=st.dictionaries(st.sampled_from(TOP), _ANY, max_size=3),
    switches=st.dictionaries(st.sampled_from(SWITCHES), _ANY, max_size=3),
)
def test_property_random_presets(top: dict[str, Any], switches: dict[str, Any], tmp_path_factory: Any) -> None:
    doc: dict[str, Any] = dict(top)
    if switches and not isinstance(doc.get("pruning"), dict | list | str | int | float | bool):
        doc["pruning"] = switches
    f = tmp_path_factory.mktemp("p") / "preset.yaml"
    f.write_text(yaml.safe_dump(doc))
    try:
        pr = load_preset(f, ROOT)
    except HapmoeError as exc:
        text = str(exc)
        assert text.startswith(f"{f}: ") and exc.field, text  # names the file and a field
        assert text.split(f"{exc.field}: ", 1)[-1].strip(), text  # and says what is wrong
        return
    # accepted: every value is in its documented range
    assert pr.time_limit is None or 0 < pr.time_limit <= MAX_TIME_LIMIT_S
    assert pr.options.get("threads") is None or 1 <= pr.options["threads"] <= MAX_THREADS
    gap = pr.options.get("relative_gap")
    assert gap is None or (math.isfinite(gap) and 0 <= gap <= 1)
    assert pr.options.get("backend") in (None, *SOLVER_BACKENDS)
    for name, (lo, hi) in PRUNING_RANGES.items():
        v = getattr(pr.pruning, name)
        assert isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi, name
    for fl in fields(Pruning):
        if fl.name not in PRUNING_RANGES:
            assert isinstance(getattr(pr.pruning, fl.name), bool), fl.name
