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


def _assert_honours(row, got: float) -> None:
    """A point row: within +-tolerance; a lower-bound row: not below value x (1 - tolerance)."""
    if row.bound == "lower":
        assert got >= row.value * (1 - row.tolerance) - 1e-9, (row.id, got)
    else:
        assert got == pytest.approx(row.value, rel=row.tolerance), (row.id, got)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_shipped_table_reproduces_published_micro_benchmark(row):
    assert row.source.startswith("https://")
    got = predicted(CAT.device(row.device), row)
    print(f"{row.id}: measured {row.value:g} {row.unit}, table {got:.4g} ({got / row.value - 1:+.1%})")
    _assert_honours(row, got)


@pytest.mark.parametrize("path", CALIBRATED, ids=[p.stem for p in CALIBRATED])
def test_calibrated_table_stays_within_every_applicable_micro_benchmark(path):
    dev = device_from_dict(load_document(path), str(path))
    mine = rows_for(dev.id, ROWS)
    for row in mine:
        _assert_honours(row, predicted(dev, row))
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
    dev = CAT.device("h100")
    assert not [r for r in rows_for("h100", ROWS) if "attention_scale" in r.terms]
    assert term_interval(dev, "attention_scale", ROWS) is None


def test_every_row_is_a_point_or_a_lower_bound():
    assert {r.bound for r in ROWS} <= {"point", "lower"}


# hw-native-sys/pto-isa @ 9e050352, kernels/manual/common/flash_atten/README.md, "910B2 Multi-Core Comparison":
# torch_npu fused attention, forward, non-causal, batch 1, one head, head dim 128, FP16, S0 = S1 = seq.
# seq: (time us, TFLOP/s, utilization % of ~354 TFLOP/s), as printed there.
PTO_910B2_TORCH_NPU = {
    1024: (58.5, 9.2, 2.6),
    2048: (70.8, 30.3, 8.6),
    4096: (118.3, 72.6, 20.5),
    8192: (353.1, 97.3, 27.5),
    16384: (1118.5, 122.9, 34.7),
    32768: (3646.2, 150.8, 42.6),
}


def _fa_rows() -> dict[int, object]:
    return {r.shape["seq"]: r for r in rows_for("910b", ROWS) if r.kind == "attention"}


def test_910b_attention_rows_are_the_cited_measurements():
    """Each row is the source's number at its stated shape; the source's own columns agree with each other
    (FLOPs counted as 4*S^2*D, non-causal: TFLOP/s = 4*S^2*128 / time, utilization = TFLOP/s / ~354)."""
    rows = _fa_rows()
    assert sorted(rows) == sorted(PTO_910B2_TORCH_NPU)
    for seq, (us, tflops, util) in PTO_910B2_TORCH_NPU.items():
        r = rows[seq]
        assert "pto-isa/blob/9e050352009a4529c3749faa02cbd698d2c26691" in r.source
        assert r.shape == {
            "batch": 1,
            "heads": 1,
            "seq": seq,
            "head_dim": 128,
            "causal": False,
            "direction": "fwd",
            "precision": "fp16",
        }
        assert r.value == tflops
        assert 4 * seq * seq * 128 / (us * 1e-6) / 1e12 == pytest.approx(tflops, rel=0.01)
        assert tflops / 354.0 == pytest.approx(util / 100, abs=0.0015)
        # one head under-fills the 24 cube cores below 8K: there the number is only a lower bound
        assert r.bound == ("lower" if seq < 8192 else "point")
        assert r.role == ("check" if seq < 8192 else "anchor")


def test_910b_peak_is_the_one_the_source_divides_by():
    assert CAT.device("910b").peak("bf16") == pytest.approx(354.0, abs=0.5)
    assert CAT.device("910b").peak("fp16") == CAT.device("910b").peak("bf16")


def test_910b_forward_attention_curve_is_the_measured_utilization_from_8k():
    dev = CAT.device("910b")
    for seq in (8192, 16384, 32768):
        assert dev.attention_efficiency(seq) == pytest.approx(PTO_910B2_TORCH_NPU[seq][2] / 100, abs=1e-6)
    # not measured above 32K: held flat (the curve clamps), never extrapolated upward
    assert dev.attention_efficiency(131072) == dev.attention_efficiency(32768)


def test_910b_curve_below_8k_respects_the_single_head_lower_bounds():
    dev = CAT.device("910b")
    for seq in (1024, 2048, 4096):
        assert dev.attention_efficiency(seq) * dev.peak("bf16") >= PTO_910B2_TORCH_NPU[seq][1]
    # and rises no faster than the measured 8K value allows: monotone up to it
    ys = [dev.attention_efficiency(512 * 2**i) for i in range(5)]
    assert ys == sorted(ys) and ys[-1] == pytest.approx(0.275)


def test_910b_backward_keeps_the_assumed_ratio():
    dev = CAT.device("910b")
    for f, b in zip(dev.attention_efficiency.y, dev.attention_bwd_efficiency.y, strict=True):
        assert b == pytest.approx(0.8 * f, rel=1e-3)
    assert any(
        "attention_bwd_efficiency is assumed" in a
        for a in load_document(ROOT / "clusters/devices/910b.yaml")["assumptions"]
    )


def test_910b_attention_scale_range_is_set_by_the_8k_to_32k_rows():
    """Closed form: the table reproduces each anchor, so attention_scale may move by the anchors' 15%
    tolerance (the tightest one, from the table-vs-measured ratios), and the lower-bound rows only cut
    from below (they do not bind here)."""
    dev = CAT.device("910b")
    lo, hi, ids = term_interval(dev, "attention_scale", ROWS)
    assert set(ids) == {f"910b-fa-fwd-{k}k" for k in (1, 2, 4, 8, 16, 32)}
    table = {s: dev.attention_efficiency(s) * dev.peak("bf16") for s in (8192, 16384, 32768)}
    want_hi = min(PTO_910B2_TORCH_NPU[s][1] * 1.15 / table[s] for s in table)
    want_lo = max(PTO_910B2_TORCH_NPU[s][1] * 0.85 / table[s] for s in table)
    assert hi == pytest.approx(want_hi, rel=1e-6)
    assert lo == pytest.approx(want_lo, rel=1e-6)


def test_a_lower_bound_row_accepts_anything_above_it():
    row = next(r for r in ROWS if r.bound == "lower")
    assert row.within(row.value * 10)
    assert row.within(row.value * (1 - row.tolerance))
    assert not row.within(row.value * (1 - row.tolerance) * 0.99)
    point = next(r for r in ROWS if r.bound == "point")
    assert not point.within(point.value * (1 + point.tolerance) * 1.01)


def test_a_row_bound_must_be_point_or_lower():
    """A misspelt bound would silently score a floor as a point (or the reverse): the row refuses it."""
    from hapmoe_milp.calibration.microbench import Row
    from hapmoe_milp.errors import SpecError

    kw = dict(id="r", source="s", device="h100", kind="memory", shape={}, value=1.0, unit="", role="r", tolerance=0.1)
    assert Row(**kw, bound="lower").within(0.95) and not Row(**kw).within(1.2)
    with pytest.raises(SpecError, match=r"r\.bound"):
        Row(**kw, bound="lowr")
