"""Every device table -- shipped and calibrated -- against the published micro-benchmarks.

``bench/calibration/microbenchmarks.yaml``: anchor rows are the numbers a shipped table was derived from
(it must reproduce them); check rows were not used to build the tables, so they are an independent test
of the derivation (e.g. the GEMM efficiency curve's shape, the collective latency). A calibrated table
must still reproduce every applicable row within its tolerance: a fit may not buy a better end-to-end
match with a kernel the measurements contradict. The predictions are the library's own
(:func:`hapmoe_milp.calibration.microbench.predicted`), the same ones the fitter bounds itself with.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hapmoe_milp.calibration.microbench import load_rows, predicted, rows_for, term_interval
from hapmoe_milp.cost.primitives import gemm_time
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs._fields import load_document
from hapmoe_milp.specs.device import device_from_dict

ROOT = Path(__file__).resolve().parents[1]
ROWS = load_rows(ROOT)
CAT = Catalog(use_calibrated=False)
CALIBRATED = sorted((ROOT / "clusters" / "devices-calibrated").glob("*.yaml"))


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_shipped_table_reproduces_published_micro_benchmark(row):
    assert row.source.startswith("https://")
    got = predicted(CAT.device(row.device), row)
    print(f"{row.id}: measured {row.value:g} {row.unit}, table {got:.4g} ({got / row.value - 1:+.1%})")
    assert got == pytest.approx(row.value, rel=row.tolerance)


@pytest.mark.parametrize("path", CALIBRATED, ids=[p.stem for p in CALIBRATED])
def test_calibrated_table_stays_within_every_applicable_micro_benchmark(path):
    dev = device_from_dict(load_document(path), str(path))
    mine = rows_for(dev.id, ROWS)
    for row in mine:
        got = predicted(dev, row)
        assert got == pytest.approx(row.value, rel=row.tolerance), (row.id, got)
    # and the record it carries says the same
    rec = {r["id"]: r for r in dev.calibration.get("micro_benchmarks", [])}
    assert set(rec) == {r.id for r in mine}
    assert all(r["within"] for r in rec.values())


def test_every_row_says_whether_it_built_the_table():
    assert {r.role for r in ROWS} <= {"anchor", "check"}
    assert sum(r.role == "check" for r in ROWS) >= 5


def test_the_library_prediction_is_flops_over_gemm_time():
    """The row prediction for a GEMM is 2mnk / gemm_time (independent restatement of the definition)."""
    row = next(r for r in ROWS if r.kind == "gemm")
    dev = CAT.device(row.device)
    sh = row.shape
    t = gemm_time(dev, sh["m"], sh["n"], sh["k"], sh["precision"])
    assert predicted(dev, row) == pytest.approx(2 * sh["m"] * sh["n"] * sh["k"] / t / 1e12, rel=1e-12)


def test_a_term_without_a_row_has_no_measured_range():
    dev = CAT.device("910b")
    assert not rows_for("910b", ROWS)
    assert term_interval(dev, "attention_scale", ROWS) is None
