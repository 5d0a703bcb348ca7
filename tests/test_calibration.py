"""Measured runs, the fitter and calibrated tables.

The fitter is checked on synthetic runs whose "measured" times come from a device with known runtime
terms: it must recover them from a different starting table. Calibrated tables must load like any
other table and be preferred by the catalog unless a --devices-dir overrides them.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from hapmoe_milp.calibration import calibrate, fit_device, leave_one_out, load_runs, predict, prepare, summarize
from hapmoe_milp.calibration.fidelity import pairs, with_devices
from hapmoe_milp.calibration.runs import MeasuredRun
from hapmoe_milp.errors import HapmoeError, SpecError
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs._fields import load_document
from hapmoe_milp.specs.device import device_from_dict

ROOT = Path(__file__).resolve().parents[1]
CAT = Catalog(use_calibrated=False)

BASE_RUN = {
    "id": "r1",
    "source": "https://example.org/run",
    "model": "qwen3-30b-a3b",
    "cluster": "16xh100",
    "ep": 16,
    "etp": 1,
    "seq_length": 4096,
    "global_batch_size": 256,
    "micro_batch_size": 1,
    "step_time_s": 5.0,
}


def write_runs(tmp: Path, runs: list[dict], name: str = "runs.yaml") -> Path:
    p = tmp / name
    p.write_text(yaml.safe_dump({"runs": runs}))
    return p


# ------------------------------------------------------------------ loader
def test_yaml_and_csv_runs_load_the_same(tmp_path):
    y = load_runs(write_runs(tmp_path, [BASE_RUN]))
    cols = list(BASE_RUN)
    csv = tmp_path / "runs.csv"
    csv.write_text(",".join(cols) + "\n" + ",".join(str(BASE_RUN[c]) for c in cols) + "\n")
    c = load_runs(csv)
    assert [replace(r, origin="") for r in y] == [replace(r, origin="") for r in c]


@pytest.mark.parametrize(
    ("change", "field", "msg"),
    [
        ({"step_time_s": None}, "step_time_s", "exactly one measurement"),
        ({"tokens_per_s": 100.0}, "step_time_s", "exactly one measurement"),
        ({"source": "a blog"}, "source", "URL"),
        ({"ep": 0}, "ep", "positive"),
        ({"recompute": "most"}, "recompute", "none, selective, sel-mlp, sel-moe, full"),
        ({"dispatcher": "magic"}, "dispatcher", "allgather, alltoall, flex"),
        ({"step_time_s": -1.0}, "step_time_s", "positive"),
        ({"color": "red"}, "color", "unknown field"),
        ({"precision": "fp4"}, "precision", "bf16, fp8"),
    ],
)
def test_bad_runs_name_the_file_and_field(tmp_path, change, field, msg):
    run = {k: v for k, v in {**BASE_RUN, **change}.items() if v is not None}
    path = write_runs(tmp_path, [run])
    with pytest.raises(SpecError, match=msg) as ei:
        load_runs(path)
    assert str(path) in str(ei.value) and field in str(ei.value)


def test_duplicate_run_ids_are_refused(tmp_path):
    with pytest.raises(SpecError, match="duplicate run id"):
        load_runs(write_runs(tmp_path, [BASE_RUN, BASE_RUN]))


def test_throughput_measurements_convert_to_step_time():
    r = MeasuredRun(**{**_fields(), "measure": "tokens_per_s_per_device", "value": 1000.0})
    # 256 samples x 4096 tokens / (1000 tokens/s/device x 16 devices)
    assert r.step_time_s(16) == pytest.approx(256 * 4096 / 16000)
    r2 = replace(r, measure="tokens_per_s", value=16000.0)
    assert r2.step_time_s(16) == pytest.approx(r.step_time_s(16))


def _fields() -> dict:
    return dict(
        id="x", source="https://e.org", model="m", cluster="c", tp=1, pp=1, cp=1, ep=1, etp=None, vpp=1,
        layout=None, recompute="none", seq_length=4096, global_batch_size=256, micro_batch_size=1,
        precision="bf16", dispatcher=None, measure="step_time_s", value=1.0,
    )  # fmt: skip


def test_a_run_whose_layout_cannot_run_says_which_run(tmp_path):
    path = write_runs(tmp_path, [{**BASE_RUN, "ep": 3}])
    with pytest.raises(HapmoeError, match="run r1"):
        prepare(load_runs(path)[0], CAT)


# ------------------------------------------------------------------ fitter on synthetic truth
SYNTH = [
    ("qwen3-30b-a3b", "16xh100", dict(ep=16, etp=1), 1, 256, 4096, "alltoall"),
    ("qwen3-30b-a3b", "16xh100", dict(ep=8, etp=1), 2, 256, 4096, "alltoall"),
    ("qwen3-30b-a3b", "8xh100", dict(ep=8, etp=1), 1, 64, 2048, "alltoall"),
    ("qwen3-30b-a3b", "16xh100", dict(ep=16, etp=1), 1, 256, 4096, "flex"),
    ("olmoe-1b-7b", "8xh100", dict(ep=8, etp=1), 4, 256, 4096, "alltoall"),
    ("mixtral-8x7b", "16xh100", dict(tp=2, ep=8, etp=1), 1, 128, 4096, "alltoall"),
    ("llama-2-7b", "8xh100", dict(tp=1), 2, 128, 4096, "alltoall"),
    ("deepseek-v2-lite", "16xh100", dict(ep=16, etp=1), 1, 256, 8192, "flex"),
]
TRUTH = {"launch_us": 20.0, "grouped_rows_half": 300.0, "a2a_inter_GBps": 25.0, "gemm_scale": 0.85}


def synthetic_runs(truth_dev) -> list:
    out = []
    for i, (m, c, kn, mbs, gbs, seq, disp) in enumerate(SYNTH):
        run = {**BASE_RUN, "id": f"s{i}", "model": m, "cluster": c, "micro_batch_size": mbs, "ep": 1,
               "global_batch_size": gbs, "seq_length": seq, "dispatcher": disp, **kn}  # fmt: skip
        run = MeasuredRun(**{**_fields(), **{k: v for k, v in run.items() if k in _fields()}, "etp": run.get("etp")})
        pr = prepare(run, CAT)
        t = predict(pr, {"h100": truth_dev}).predicted_s
        out.append(replace(pr, run=replace(pr.run, value=t)))
    return out


def test_fitter_recovers_known_runtime_terms_from_synthetic_runs():
    base = CAT.device("h100")
    truth = replace(base, runtime=base.runtime.with_values(TRUTH))
    runs = synthetic_runs(truth)
    start = [predict(r).error for r in runs]
    assert max(abs(e) for e in start) > 0.05  # the starting table is really off
    res = fit_device(runs, base, list(TRUTH), prior_weight=0.0, max_iter=100)
    got = {p.name: p.value for p in res.params}
    for k, v in TRUTH.items():
        assert got[k] == pytest.approx(v, rel=0.05), k
    assert max(abs(e) for e in res.errors) < 1e-3
    assert all(not p.at_bound for p in res.params)


def test_prior_keeps_terms_the_runs_do_not_see_at_their_start():
    """Dense runs say nothing about token dispatch: its bandwidths stay where the table put them."""
    base = CAT.device("h100")
    truth = replace(base, runtime=base.runtime.with_values({"launch_us": 20.0}))
    runs = [r for r in synthetic_runs(truth) if r.model.name == "llama-2-7b"]
    res = fit_device(runs, base, ["launch_us", "flex_inter_GBps", "a2a_intra_GBps"])
    got = {p.name: p for p in res.params}
    assert got["flex_inter_GBps"].value == pytest.approx(base.runtime.flex_inter_GBps, rel=1e-6)
    assert got["a2a_intra_GBps"].value == pytest.approx(base.runtime.a2a_intra_GBps, rel=1e-6)


def test_fit_stays_inside_physical_bounds_and_reports_it():
    base = CAT.device("h100")
    truth = replace(base, runtime=base.runtime.with_values({"launch_us": 20.0}))
    runs = synthetic_runs(truth)[:3]
    # measured 20x slower than anything the terms can explain
    runs = [replace(r, run=replace(r.run, value=r.run.value * 20)) for r in runs]
    res = fit_device(runs, base, ["launch_us", "gemm_scale"], prior_weight=0.0)
    by = {p.name: p for p in res.params}
    assert by["launch_us"].value <= 50.0 and by["gemm_scale"].value >= 0.3
    assert by["launch_us"].at_bound == "upper" or by["gemm_scale"].at_bound == "lower"


def test_leave_one_out_on_consistent_runs_is_small():
    base = CAT.device("h100")
    truth = replace(base, runtime=base.runtime.with_values({"launch_us": 20.0, "gemm_scale": 0.85}))
    runs = synthetic_runs(truth)[:5]
    errs = leave_one_out(runs, base, ["launch_us", "gemm_scale"], prior_weight=0.0)
    assert max(abs(e) for e in errs) < 0.01


# ------------------------------------------------------------------ summary
def test_pairs_compare_throughput_of_same_model_same_hardware_runs():
    base = CAT.device("h100")
    runs = synthetic_runs(base)[:3]
    res = [predict(r) for r in runs]
    pc = pairs(res, tie=0.0)
    assert len(pc) == 3  # three qwen3 runs on h100
    assert all(p.agrees for p in pc)  # predictions are the measurements here
    flipped = [replace(r, predicted_s=r.measured_s * (2.0 if i == 0 else 0.5)) for i, r in enumerate(res)]
    s = summarize(flipped)
    assert s.mape == pytest.approx((1.0 + 0.5 + 0.5) / 3)
    assert s.worst_id == res[0].id


# ------------------------------------------------------------------ calibrated tables
@pytest.fixture()
def sandbox(tmp_path):
    """A catalog root with the shipped models/clusters/devices, so tests can write calibrated tables."""
    for d in ("models", "clusters"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("devices-calibrated"))
    return Catalog(root=tmp_path)


def test_calibrate_writes_a_calibrated_table_the_catalog_prefers(sandbox, tmp_path):
    base = sandbox.device("h100")
    truth = replace(base, runtime=base.runtime.with_values({"launch_us": 20.0}))
    runs = synthetic_runs(truth)[:4]
    docs = []
    for pr in runs:
        r = pr.run
        d = {k: getattr(r, k) for k in ("id", "source", "model", "cluster", "tp", "pp", "ep", "seq_length",
                                         "global_batch_size", "micro_batch_size")}  # fmt: skip
        d.update({"step_time_s": r.value, "dispatcher": r.dispatcher or "alltoall", "etp": 1})
        docs.append(d)
    path = write_runs(tmp_path, docs)
    res = calibrate(path, "h100", catalog=sandbox, params=["launch_us"], out=sandbox.calibrated_dir, version="t")
    assert res.path == sandbox.calibrated_dir / "h100.yaml"
    dev = sandbox.device("h100")
    assert dev.provenance == "calibrated" and dev.origin == str(res.path)
    assert dev.runtime.launch_us == pytest.approx(20.0, rel=0.05)
    doc = load_document(res.path)
    assert [r["id"] for r in doc["calibration"]["runs"]] == [d["id"] for d in docs]
    assert doc["calibration"]["leave_one_out"]["mape"] < 0.02
    # the written file is a valid table on its own, and --devices-dir still overrides it
    assert device_from_dict(doc, "x").runtime == dev.runtime
    prof = tmp_path / "profiled"
    prof.mkdir()
    shutil.copy(ROOT / "clusters" / "devices" / "h100.yaml", prof / "h100.yaml")
    assert replace(sandbox, devices_dirs=(prof,)).device("h100").provenance == "datasheet+public-benchmarks"
    # a second calibration starts again from the shipped table, not from the first fit
    res2 = calibrate(path, "h100", catalog=sandbox, params=["launch_us"], out=None, loo=False)
    assert res2.fit.params[0].start == base.runtime.launch_us


def test_a_calibrated_table_must_record_its_runs():
    doc = load_document(ROOT / "clusters" / "devices" / "h100.yaml")
    doc["provenance"] = "calibrated"
    with pytest.raises(SpecError, match="calibration"):
        device_from_dict(doc, "h100.yaml")


def test_with_devices_replaces_only_the_named_type():
    c = CAT.cluster("16-1")
    h = c.device("h800")
    c2 = with_devices(c, {"h800": replace(h, runtime=h.runtime.with_values({"launch_us": 30.0}))})
    assert c2.device("h800").runtime.launch_us == 30.0
    assert c2.device("910b") is c.device("910b")


def test_shipped_calibration_set_keeps_the_held_out_models_out():
    doc = load_document(ROOT / "bench" / "calibration" / "runs.yaml")
    rows = json.dumps([doc.get("runs", []), doc.get("excluded", [])]).lower()
    for name in ("gpt-oss", "gpt_oss", "qwen3-235b", "qwen3_235b", "8x22b"):
        assert name not in rows
    runs = load_runs(ROOT / "bench" / "calibration" / "runs.yaml")
    assert all(r.source.startswith("https://") for r in runs)
