"""The shipped tables against the published micro-benchmarks in bench/calibration/microbenchmarks.yaml.

Anchor rows are the numbers a table was derived from (it must reproduce them); check rows were not used to
build the tables, so they are an independent test of the derivation (e.g. the GEMM efficiency curve's shape,
the collective latency) within each row's stated tolerance.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hapmoe_milp.cost.primitives import collective_time, gemm_time
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs._fields import load_document

ROOT = Path(__file__).resolve().parents[1]
ROWS = load_document(ROOT / "bench" / "calibration" / "microbenchmarks.yaml")["rows"]
CAT = Catalog(use_calibrated=False)


def predicted(row: dict) -> float:
    dev = CAT.device(row["device"])
    kind, sh = row["kind"], row.get("shape", {})
    if kind == "gemm":
        t = gemm_time(dev, sh["m"], sh["n"], sh["k"], sh["precision"])
        return 2 * sh["m"] * sh["n"] * sh["k"] / t / 1e12
    if kind == "memory":
        return dev.runtime.memory_efficiency * dev.memory_bandwidth_GBps
    if kind == "all_reduce":
        n, size = sh["ranks"], sh["bytes"]
        t = collective_time(dev, "all_reduce", "intra", size, n)
        return 2 * (n - 1) / n * size / t / 1e9
    return float(getattr(dev.runtime, kind))


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_shipped_table_reproduces_published_micro_benchmark(row):
    assert row["source"].startswith("https://")
    got = predicted(row)
    print(f"{row['id']}: measured {row['value']:g} {row['unit']}, table {got:.4g} ({got / row['value'] - 1:+.1%})")
    assert got == pytest.approx(row["value"], rel=row["tolerance"])


def test_every_row_says_whether_it_built_the_table():
    assert {r["role"] for r in ROWS} <= {"anchor", "check"}
    assert sum(r["role"] == "check" for r in ROWS) >= 5
