"""Measured runs, the fitter and calibrated tables.

The fitter is checked on synthetic runs whose "measured" times come from a device with known runtime
terms: it must recover them from a different starting table. Calibrated tables must load like any
other table and be preferred by the catalog unless a --devices-dir overrides them.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from hapmoe_milp.calibration import (
    Problem,
    calibrate,
    cross_validate,
    fit,
    identify,
    load_rows,
    load_runs,
    pooled_fit,
    predict,
    prepare,
    summarize,
)
from hapmoe_milp.calibration.fidelity import pairs, with_devices
from hapmoe_milp.calibration.microbench import term_interval, violations
from hapmoe_milp.calibration.runs import MeasuredRun
from hapmoe_milp.calibration.terms import Term
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.errors import HapmoeError, SpecError
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs._fields import load_document
from hapmoe_milp.specs.device import device_from_dict
from hapmoe_milp.specs.runtime import PARAM_INFO

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
        ({"untie_embeddings_and_output_weights": "sometimes"}, "untie_embeddings_and_output_weights", "true or false"),
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


def test_a_run_sets_the_model_flags_its_launch_left_at_megatrons_defaults(tmp_path):
    """FlagPerf's LLaMA-3-8B script passes no --untie-embeddings-and-output-weights (tied in Megatron) and no
    --disable-bias-linear: the run says so and is priced on that model, in YAML and CSV alike. At PP = 1 the
    tied model holds one vocabulary matrix fewer: (6 + 12/DP) bytes x V x h / TP less state."""
    row = {**BASE_RUN, "id": "tied", "model": "llama-3-8b", "cluster": "8xa800", "tp": 8, "ep": 1, "etp": 1,
           "untie_embeddings_and_output_weights": False, "add_bias_linear": True}  # fmt: skip
    (run,) = load_runs(write_runs(tmp_path, [row]))
    assert run.model_fields == {"untie_embeddings_and_output_weights": False, "add_bias_linear": True}
    csv = tmp_path / "runs.csv"
    csv.write_text(
        ",".join(row) + "\n" + ",".join(str(v).lower() if isinstance(v, bool) else str(v) for v in row.values()) + "\n"
    )
    assert replace(load_runs(csv)[0], origin="") == replace(run, origin="")
    tied = prepare(run, CAT)
    assert not tied.model.untie_embeddings_and_output_weights and tied.model.add_bias_linear
    untied = prepare(replace(run, model_fields={"add_bias_linear": True}), CAT)
    m = untied.model
    assert m.untie_embeddings_and_output_weights
    gap = estimate(m, untied.cluster, untied.plan, untied.settings).totals[0].weights
    gap -= estimate(tied.model, tied.cluster, tied.plan, tied.settings).totals[0].weights
    assert gap == pytest.approx((6 + 12 / 1) * m.padded_vocab(8) * m.hidden_size / 8, rel=1e-9)


def test_a_run_keeps_megatrons_learned_position_table_where_its_script_does(tmp_path):
    """FlagPerf's LLaMA-3 scripts pass no --position-embedding-type, so Megatron core_v0.6.0 keeps its
    learned absolute table (arguments.py L709 at cac60ce4c8): seq x h more weights on the first stage, on
    every TP rank, at 18 bytes each at DP = 1 (TP 8 on 8 GPUs)."""
    row = {**BASE_RUN, "id": "pos", "model": "llama-3-8b", "cluster": "8xa800", "tp": 8, "ep": 1, "etp": 1,
           "learned_absolute_position_embedding": True}  # fmt: skip
    (run,) = load_runs(write_runs(tmp_path, [row]))
    assert run.model_fields == {"learned_absolute_position_embedding": True}
    learned = prepare(run, CAT)
    rope = prepare(replace(run, model_fields={}), CAT)
    gap = estimate(learned.model, learned.cluster, learned.plan, learned.settings).totals[0].weights
    gap -= estimate(rope.model, rope.cluster, rope.plan, rope.settings).totals[0].weights
    assert gap == pytest.approx(18 * run.seq_length * 4096, rel=1e-9)


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


def physical_terms(names, device="h100", stack="user") -> tuple[Term, ...]:
    """Coordinates spanning each parameter's whole physical range (no micro-benchmark bound): the solver's
    own test, not the shipped policy."""
    base = CAT.device(device)
    out = []
    for n in names:
        info, v = PARAM_INFO[n], getattr(base.runtime, n)
        lo, hi = (math.log(info.lo / v), math.log(info.hi / v)) if info.lo > 0 else (info.lo - v, info.hi - v)
        out.append(Term(n, stack, (device,), lo, hi, 1.0, "physical range"))
    return tuple(out)


def test_fitter_recovers_known_runtime_terms_from_synthetic_runs():
    base = CAT.device("h100")
    truth = replace(base, runtime=base.runtime.with_values(TRUTH))
    runs = synthetic_runs(truth)
    start = [predict(r).error for r in runs]
    assert max(abs(e) for e in start) > 0.05  # the starting table is really off
    prob = Problem(tuple(runs), {"h100": base}, physical_terms(TRUTH))
    res = fit(prob, range(len(TRUTH)), prior_weight=0.0, max_iter=100)
    got = {p.name: p.value["h100"] for p in res.params}
    for k, v in TRUTH.items():
        assert got[k] == pytest.approx(v, rel=0.05), k
    assert max(abs(e) for e in res.errors) < 1e-3


def test_identifiability_keeps_terms_the_runs_do_not_see_at_their_prior():
    """Dense runs say nothing about token dispatch: those terms are not fitted, and the report says why."""
    base = CAT.device("h100")
    truth = replace(base, runtime=base.runtime.with_values({"launch_us": 20.0}))
    runs = [r for r in synthetic_runs(truth) if r.model.name == "llama-2-7b"] * 1
    runs = runs + [replace(r, run=replace(r.run, id=r.run.id + "b", global_batch_size=256)) for r in runs]
    prob = Problem(tuple(runs), {"h100": base}, physical_terms(["launch_us", "flex_inter_GBps", "a2a_intra_GBps"]))
    ident = identify(prob)
    keys = [prob.terms[i].name for i in ident.order]
    assert "flex_inter_GBps" not in keys and "a2a_intra_GBps" not in keys
    why = dict(zip(ident.keys, ident.reasons, strict=True))
    assert "barely see" in why["flex_inter_GBps@h100"]


@dataclass(frozen=True)
class LinearProblem(Problem):
    """Residuals linear in the coordinates with a chosen sensitivity matrix: identify()'s logic in isolation."""

    matrix: tuple[tuple[float, ...], ...] = ()

    def residuals(self, z):
        return np.array(self.matrix) @ np.array(z, dtype=float)


def test_collinear_terms_are_not_both_fitted():
    """Two terms the runs see only together (one column twice the other) give one direction: one is fitted,
    the other is kept and the report says its effect is already explained; an unseen term is kept too."""
    base = CAT.device("h100")
    runs = tuple(synthetic_runs(base)[:6])
    cols = [[0.1, 0.2, 0.0, 0.05, 0.1, 0.3], [0.2, 0.4, 0.0, 0.1, 0.2, 0.6], [0.0, 0.1, 0.3, 0.0, 0.0, 0.1],
            [0.0] * 6]  # fmt: skip
    matrix = tuple(tuple(c[i] for c in cols) for i in range(6))
    terms = tuple(Term(n, "user", ("h100",), -1.0, 1.0, 1.0, "test") for n in ("a", "b", "c", "d"))
    prob = LinearProblem(runs, {"h100": base}, terms, weights=(1.0,) * 6, matrix=matrix)
    ident = identify(prob)
    chosen = {terms[i].name for i in ident.order}
    assert chosen == {"b", "c"}  # b (twice a) first, then c; a adds nothing independent
    why = dict(zip(ident.keys, ident.reasons, strict=True))
    assert "explained by terms already fitted" in why["a@h100"] and "barely see" in why["d@h100"]
    assert ident.rank == 2


def test_at_most_one_term_per_two_runs():
    base = CAT.device("h100")
    truth = replace(base, runtime=base.runtime.with_values(TRUTH))
    runs = synthetic_runs(truth)[:4]
    prob = Problem(tuple(runs), {"h100": base}, physical_terms(TRUTH))
    ident = identify(prob)
    assert ident.cap == 2 and len(ident.order) <= 2


def test_a_fit_never_leaves_its_micro_benchmark_tolerance():
    """Runs 40% slower than the table predicts would pull the GEMM terms down; the H100 rows stop them."""
    rows = load_rows(ROOT)
    runs = [prepare(r, CAT) for r in load_runs(ROOT / "bench" / "calibration" / "runs.yaml")]
    h100 = [r for r in runs if r.devices == ("h100",) and not r.model.is_moe]
    slow = [replace(r, run=replace(r.run, value=r.run.value / 1.4)) for r in h100]  # throughput: 1.4x slower
    pf = pooled_fit(slow, {"h100": CAT.device("h100")}, rows, names=["gemm_scale", "fp8_gemm_scale", "launch_us"])
    assert pf.result.params, "something is fitted"
    table = pf.tables(slow[0].run.stack)["h100"]
    assert not violations(table, rows)
    lo, hi, ids = term_interval(CAT.device("h100"), "gemm_scale", rows)
    assert "h100-mamf-bf16" in ids and lo <= table.runtime.gemm_scale <= hi


def test_term_interval_edges_sit_at_the_rows_tolerance():
    rows = load_rows(ROOT)
    dev = CAT.device("h100")
    lo, hi, ids = term_interval(dev, "gemm_scale", rows)
    assert lo < dev.runtime.gemm_scale < hi
    edge = [r for r in rows if r.id in ids]
    # at an edge some row is at (just inside) its tolerance; a bit beyond, one is outside
    for v, beyond in ((lo, lo * 0.99), (hi, hi * 1.01)):
        at = replace(dev, runtime=dev.runtime.with_values({"gemm_scale": v}))
        out = replace(dev, runtime=dev.runtime.with_values({"gemm_scale": beyond}))
        assert not violations(at, edge) and violations(out, edge)


def test_leave_one_model_out_never_looks_at_the_held_out_models_measurements():
    """Changing a model's measured times leaves its cross-validated *predictions* unchanged."""
    runs = [prepare(r, CAT) for r in load_runs(ROOT / "bench" / "calibration" / "runs.yaml")]
    runs = [r for r in runs if r.devices == ("a800",) or r.model.name == "llama-2-70b"]
    bases = {d: CAT.device(d) for r in runs for d in r.devices}
    rows = load_rows(ROOT)
    e1 = cross_validate(runs, bases, rows, "model")
    moved = [replace(r, run=replace(r.run, value=r.run.value * 2)) if r.model.name == "llama-3-8b" else r for r in runs]
    e2 = cross_validate(moved, bases, rows, "model")
    for r, a, b in zip(runs, e1, e2, strict=True):
        if r.model.name == "llama-3-8b":  # prediction unchanged: (1 + e) * measured is the same
            assert (1 + a) * r.measured_s == pytest.approx((1 + b) * r.measured_s / 2, rel=1e-9)


def test_pairs_rank_throughput_of_same_model_same_hardware_runs():
    base = CAT.device("h100")
    runs = synthetic_runs(base)[:3]
    res = [predict(r) for r in runs]
    pc = pairs(res, tie=0.0)
    assert len(pc) == 3  # three qwen3 runs on h100
    assert all(p.agrees for p in pc)  # predictions are the measurements here


# ------------------------------------------------------------------ summary
def test_summary_counts_mape_worst_and_pairs():
    base = CAT.device("h100")
    runs = synthetic_runs(base)[:3]
    res = [predict(r) for r in runs]
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
    (tmp_path / "bench" / "calibration").mkdir(parents=True)
    shutil.copy(ROOT / "bench" / "calibration" / "microbenchmarks.yaml", tmp_path / "bench" / "calibration")
    return Catalog(root=tmp_path)


def test_calibrate_writes_a_calibrated_table_the_catalog_prefers(sandbox, tmp_path):
    # the host-CPU bound off in the sandbox's table (and so in the truth), so every run sees the launch term
    table = tmp_path / "clusters" / "devices" / "h100.yaml"
    text = table.read_text()
    assert "  call_us: 80.0\n" in text
    table.write_text(text.replace("  call_us: 80.0\n", "  call_us: 1.0\n"))
    base = sandbox.device("h100")
    # inside H100's measured idle-per-kernel range (11.2 us +-10%, microbenchmarks.yaml h100-kernel-gap)
    truth = replace(base, runtime=base.runtime.with_values({"launch_us": 12.2}))
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
    assert res.chosen == 1 and res.path == sandbox.calibrated_dir / "h100.yaml"
    dev = sandbox.device("h100")
    assert dev.provenance == "calibrated" and dev.origin == str(res.path)
    assert dev.runtime.launch_us == pytest.approx(12.2, rel=0.01)
    doc = load_document(res.path)
    rec = doc["calibration"]
    assert rec["scope"] == "user" and [r["id"] for r in rec["runs"]] == [d["id"] for d in docs]
    cv = rec["cross_validation"]["leave_one_run_out"]
    assert cv["1"] < 0.5 * cv["0"]
    assert rec["identifiability"]["fitted"] == ["launch_us@user"]
    # the written file is a valid table on its own, and --devices-dir still overrides it
    assert device_from_dict(doc, "x").runtime == dev.runtime
    prof = tmp_path / "profiled"
    prof.mkdir()
    shutil.copy(ROOT / "clusters" / "devices" / "h100.yaml", prof / "h100.yaml")
    assert replace(sandbox, devices_dirs=(prof,)).device("h100").provenance == "datasheet+public-benchmarks"
    # a second calibration starts again from the uncalibrated table, not from the first (user) fit
    res2 = calibrate(path, "h100", catalog=sandbox, params=["launch_us"], out=None)
    assert res2.fit.params[0].start["h100"] == base.runtime.launch_us


def _public_runs_of(model: str, device: str) -> list[dict]:
    doc = yaml.safe_load((ROOT / "bench" / "calibration" / "runs.yaml").read_text())
    return [r for r in doc["runs"] if r["model"] == model and r["cluster"].endswith("x" + device)]


# Calibrating H100 on the first four (BF16) Qwen3-30B runs: the cross-validated check holds (8.0% vs 13.4%
# uncalibrated on those four), but the stack compute scale it fits (0.76) moves the six other runs, FP8 and graphed,
# from 9.5% to 10.0% MAPE (FP8 blockwise graphed +4% -> +24%): the scale absorbs host time per framework call that
# the model does not price (issue 17). Known, so reported as xfail; once it carries over the test says so.
OTHER_RUNS_KNOWN_WORSE = {4}


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2, 4])
def test_calibrating_on_a_few_runs_of_an_unseen_model_never_ends_worse(sandbox, tmp_path, n, capsys):
    """A user's model the tables never saw (the sandbox has no calibrated tables): calibrate on n of its runs,
    then predict its other runs. Cross-validated on the n runs and on the runs it did not use, the result is
    never worse than not calibrating, and the report names the terms fitted and why."""
    mine = _public_runs_of("qwen3-30b-a3b", "h100")
    assert len(mine) >= n + 3
    for r in mine:
        r.pop("stack", None)  # a user's own runs: one stack
    path = write_runs(tmp_path, mine[:n])
    res = calibrate(path, "h100", catalog=sandbox, out=tmp_path / "cal")
    if n >= 2:
        assert res.summary_cv().mape <= res.summary_cv_uncalibrated().mape + 1e-12
    else:
        assert res.chosen <= 1 and any("one run" in x for x in res.notes)
    reasons = res.pooled.identification.reasons
    assert all(why.startswith(("fitted", "kept")) for why in reasons)
    rest = [prepare(r, sandbox) for r in load_runs(write_runs(tmp_path, mine[n:], "rest.yaml"))]
    base = {"h100": res.base}
    tuned = {"h100": res.table}
    before = sum(abs(predict(r, base).error) for r in rest) / len(rest)
    after = sum(abs(predict(r, tuned).error) for r in rest) / len(rest)
    print(f"n={n}: fitted {[p.key for p in res.fit.params]}, other runs MAPE {before:.1%} -> {after:.1%}")
    if n in OTHER_RUNS_KNOWN_WORSE:
        assert after > before + 1e-9, "now carries over to the other runs: drop n from OTHER_RUNS_KNOWN_WORSE"
        pytest.xfail(f"other runs {before:.1%} -> {after:.1%} (known limit, see OTHER_RUNS_KNOWN_WORSE)")
    assert after <= before + 1e-9


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


def test_a_stack_term_reaches_held_out_devices_of_its_stack():
    """Leave-one-model-out on FlagPerf's legacy FlagScale stack: with A800's only model of it (Aquila2-7B) held
    out, the stack's compute share fitted on H800's runs still applies to A800 (same software), so A800's
    predictions move."""
    runs = [prepare(r, CAT) for r in load_runs(ROOT / "bench" / "calibration" / "runs.yaml")]
    runs = [r for r in runs if r.run.stack == "flagperf-flagscale-legacy"]
    assert {r.model.name for r in runs if r.devices == ("a800",)} == {"aquila2-7b"}
    bases = {d: CAT.device(d) for r in runs for d in r.devices}
    rows = load_rows(ROOT)
    cv = cross_validate(runs, bases, rows, "model", names=["stack_compute_scale"])
    before = [predict(r, bases).error for r in runs]
    moved = [abs(a - b) > 1e-6 for r, a, b in zip(runs, cv, before, strict=True) if r.devices == ("a800",)]
    assert moved and all(moved)


def test_no_exclusion_reason_rests_on_how_well_the_model_predicts_the_run():
    """Exclusion reasons are about the run (stack, missing layout, superseded), never about the cost model's
    error on it (bench/calibration/README.md, Policies): no reason cites a prediction or a model error."""
    doc = load_document(ROOT / "bench" / "calibration" / "runs.yaml")
    for r in doc["excluded"]:
        why = r["excluded_because"].lower()
        assert "predict" not in why and "mape" not in why, r["id"]


def test_flagperf_rows_carry_the_stack_of_the_image_they_ran():
    """FlagPerf's A800/H800 cases ran two different software stacks (training/nvidia/docker_image/*/ and
    test_conf.py at FlagPerf 1b5a030398): the megatron_core060 image (NGC PyTorch 24.02, Megatron-LM
    core_v0.6.0, Megatron-Core GPT with Transformer Engine) and the flagscale / megatron images (NGC PyTorch
    23.09, FlagScale's pre-Core megatron/model GPT). A row's legacy_model flag says which code built its model,
    so every used FlagPerf row's stack must agree with it, and the file's description must name both images."""
    doc = load_document(ROOT / "bench" / "calibration" / "runs.yaml")
    flagperf = [r for r in doc["runs"] if "github.com/FlagOpen/FlagPerf" in r["source"]]
    assert {r["stack"] for r in flagperf} == {"flagperf-megatron-2024", "flagperf-flagscale-legacy"}
    for r in flagperf:
        assert (r["stack"] == "flagperf-flagscale-legacy") == bool(r.get("legacy_model")), r["id"]
    for image in ("megatron_core060", "flagscale / megatron images", "pytorch 24.02", "pytorch 23.09"):
        assert image in doc["description"].lower(), image


def test_a_device_table_carries_the_stack_most_of_its_runs_use():
    """Counted by hand: B200 with two runs of an old container listed first and three of the current one ships
    the current one's terms; a tie goes to the name sorting first; a device without runs is an error."""
    from types import SimpleNamespace

    from hapmoe_milp.calibration.crossval import table_stack

    def run(stack, *devices):
        return SimpleNamespace(run=SimpleNamespace(stack=stack), devices=devices)

    runs = [run("old", "b200"), run("old", "b200"), run("new", "b200"), run("new", "b200", "h100"), run("new", "b200")]
    assert table_stack(runs, "b200") == "new"
    assert table_stack(runs, "h100") == "new"
    assert table_stack([run("zeta", "a800"), run("alpha", "a800")], "a800") == "alpha"
    with pytest.raises(ValueError):
        table_stack(runs, "910b")


def test_nemo_2502_rows_are_a_stack_of_their_own_backed_by_the_re_measurements():
    """The NeMo 25.02 B200 rows carry stack nemo-25.02 (and only they do), because the public re-measurements
    of the same configurations in the 25.11 container are faster (the file's description cites them): each
    superseded 25.02 row has a current-stack twin of identical layout and batch with more tokens/s/GPU. The
    shipped B200 table carries the current stack, which has more B200 runs."""
    from hapmoe_milp.calibration.crossval import table_stack

    doc = load_document(ROOT / "bench" / "calibration" / "runs.yaml")
    rows = [*doc["runs"], *doc["excluded"]]
    for r in rows:
        assert (r["stack"] == "nemo-25.02") == ("nemo2502" in r["id"]), r["id"]
    shape = ("model", "cluster", "tp", "pp", "cp", "vpp", "seq_length", "global_batch_size", "micro_batch_size")
    old = [r for r in doc["excluded"] if r["stack"] == "nemo-25.02" and "superseded" in r["excluded_because"]]
    assert len(old) >= 2
    for r in old:
        twins = [t for t in doc["runs"] if t["stack"] != "nemo-25.02" and all(t.get(k) == r.get(k) for k in shape)]
        assert twins, r["id"]
        assert all(t["tokens_per_s_per_device"] > 1.05 * r["tokens_per_s_per_device"] for t in twins), r["id"]
    runs = [prepare(r, CAT) for r in load_runs(ROOT / "bench" / "calibration" / "runs.yaml")]
    assert table_stack(runs, "b200") == "nvidia-megatron-core-2025"


def test_a_table_lists_only_the_stack_terms_it_carries():
    """A B200 table for the current stack lists that stack's fitted dp_overlap and the kernel terms, never the
    dp_overlap fitted to an older container's runs on the same device (its values are not in the table)."""
    from hapmoe_milp.calibration import calibrated_document
    from hapmoe_milp.calibration.fit import FittedTerm

    def term(key, value):
        name = key.split("@")[0]
        return FittedTerm(key, name, ("b200",), {"b200": 1.0}, {"b200": value}, 0.0, -1.0, 1.0, "physical range")

    params = [term("dp_overlap@old-stack", 0.2), term("dp_overlap@new-stack", 0.9), term("gemm_scale@b200", 0.95)]
    base = CAT.device("b200")
    doc = calibrated_document(base, base, params, [], [], [], scope="public", method="m", stack="new-stack")
    cal = doc["calibration"]
    assert [(p["term"], p["value"]) for p in cal["parameters"]] == [
        ("dp_overlap@new-stack", 0.9),
        ("gemm_scale@b200", 0.95),
    ]
    assert cal["stack"] == "new-stack"
    every = calibrated_document(base, base, params, [], [], [], scope="public", method="m")
    assert len(every["calibration"]["parameters"]) == 3
