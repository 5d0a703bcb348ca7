"""Profile this CPU for real, write the table, and run the cost model on it; gloo collectives via the launcher.

Needs torch (the `profile` extra); skipped without it. The quick profile and each launcher run are done once
per module (fixtures) to keep the file well under two minutes on two cores.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

torch = pytest.importorskip("torch")

from hapmoe_milp.config import ParallelConfig, Settings  # noqa: E402
from hapmoe_milp.cost import attention as cost_attention_mod  # noqa: E402
from hapmoe_milp.cost.estimate import estimate  # noqa: E402
from hapmoe_milp.cost.model import CostModel  # noqa: E402
from hapmoe_milp.cost.primitives import BUS_FACTOR  # noqa: E402
from hapmoe_milp.plan import Plan, Stage  # noqa: E402
from hapmoe_milp.profiler import ProfilerError  # noqa: E402
from hapmoe_milp.profiler.collectives import launch_local_collectives, load_collectives, run_collectives  # noqa: E402
from hapmoe_milp.profiler.compare import compare_tables, summarize_rows  # noqa: E402
from hapmoe_milp.profiler.kernels import SweepConfig, attention_flops, profile_device  # noqa: E402
from hapmoe_milp.profiler.table_writer import write_device_table  # noqa: E402
from hapmoe_milp.specs import Catalog, ModelSpec  # noqa: E402
from hapmoe_milp.specs._fields import load_document  # noqa: E402
from hapmoe_milp.specs.device import PRIMITIVES, device_from_dict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = ModelSpec(
    name="tiny", num_layers=2, hidden_size=256, num_attention_heads=4, vocab_size=1024, ffn_hidden_size=512
)
TINY_MOE = ModelSpec(
    name="tiny-moe",
    num_layers=2,
    hidden_size=256,
    num_attention_heads=4,
    vocab_size=1024,
    ffn_hidden_size=512,
    num_experts=4,
    moe_router_topk=2,
    moe_ffn_hidden_size=256,
)
TINY_CFG = SweepConfig(
    gemm_sides=(64, 128),
    gemm_aspects=((1.0, 1.0, 1.0),),
    attn_seqs=(128,),
    attn_heads=2,
    attn_head_dim=64,
    grouped_tokens=(16,),
    grouped_shape=(4, 128, 128),
    copy_bytes=4 * 2**20,
    warmup=2,
    repeats=2,
    target_sample_s=0.001,
    max_call_s=1.0,
    sweep_budget_s=5.0,
)


def _launch(out: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "hapmoe_milp.profiler.collectives", "--quick", "--out", str(out), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False)
    return r, time.perf_counter() - t0


@pytest.fixture(scope="module")
def measured() -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    m = profile_device("cpu-test", quick=True)
    return m, time.perf_counter() - t0


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str], float]:
    out = tmp_path_factory.mktemp("coll") / "intra.json"
    r, wall = _launch(out)
    return out, r, wall


@pytest.fixture(scope="module")
def devices_dir(
    tmp_path_factory: pytest.TempPathFactory, measured: tuple[dict[str, Any], float], gloo_run: Any
) -> Path:
    d = tmp_path_factory.mktemp("devices")
    write_device_table(measured[0], d, device_name="cpu-test", collectives=[gloo_run[0]])
    return d


# --------------------------------------------------------------------------------------------- kernels
def test_quick_cpu_profile(measured: tuple[dict[str, Any], float]) -> None:
    m, wall = measured
    assert wall < 60, f"quick profile took {wall:.1f} s"
    assert m["backend"] == "cpu" and m["mode"] == "quick" and m["device_name"] == "cpu-test"
    assert m["peak_basis"] == "measured-best"
    assert any("best bf16 GEMM throughput measured here" in a for a in m["assumptions"])
    gemm = m["gemm"]
    assert len(gemm) >= 3
    assert all(p["tflops"] > 0 and p["median_s"] > 0 for p in gemm)
    assert max(p["efficiency"] for p in gemm) == pytest.approx(1.0)  # the peak is the best measurement
    for p in gemm:
        assert p["flops"] == 2.0 * p["m"] * p["n"] * p["k"]
    attn = m["attention"]
    assert len(attn) >= 3
    for p in attn:
        fwd, bwd = attention_flops(p["batch"], p["seq"], p["heads"], p["head_dim"])
        assert p["fwd_flops"] == fwd and p["bwd_flops"] == bwd
        assert p["fwd"]["median_s"] > 0 and p["bwd"]["median_s"] > 0
    assert m["grouped_gemm"] and all(p["tflops"] > 0 for p in m["grouped_gemm"])
    mem = m["memory"]
    assert mem["memory_bandwidth_GBps"] > 0
    assert 0 < mem["memory_bound_efficiency"] <= 1.0
    assert {o["op"].split()[0] for o in mem["elementwise"]} == {"add", "swiglu", "router"}
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < m["usable_memory"]["usable_bytes"] <= total
    for key in ("host", "date", "torch", "tool", "mode"):
        assert m["profiled"][key]
    json.dumps(m)  # JSON-serialisable: the CLI may save raw measurements


def test_attention_flops_are_counted_as_the_cost_model_counts_them(
    monkeypatch: pytest.MonkeyPatch, devices_dir: Path
) -> None:
    calls: list[tuple[float, int, bool]] = []
    real = cost_attention_mod.attention_time

    def spy(dev: Any, flops: float, seq: int, backward: bool) -> float:
        calls.append((flops, seq, backward))
        return real(dev, flops, seq, backward)

    monkeypatch.setattr(cost_attention_mod, "attention_time", spy)  # the attention core is priced there
    cluster = Catalog(devices_dirs=(devices_dir,)).cluster("4xcpu-test")
    S, b = 512, 2
    cm = CostModel(TINY, cluster, Settings(seq_length=S))
    cm.layer("cpu-test", ParallelConfig(dp=2), b, "dense", "none")
    fwd, bwd = attention_flops(b, S, TINY.num_attention_heads, TINY.head_dim)
    assert (fwd, S, False) in calls
    assert any(c[0] == pytest.approx(bwd) and c[2] for c in calls)


def test_tiny_config_and_user_peak() -> None:
    m = profile_device("tiny", config=TINY_CFG, peak_tflops=10.0)
    assert m["peak_basis"] == "user" and m["peak_tflops"]["bf16"] == 10.0
    for p in m["gemm"]:
        assert p["efficiency"] == pytest.approx(p["tflops"] / 10.0)
    assert [p["m"] for p in m["gemm"]] == [64, 128]


def test_bad_arguments_are_profiler_errors() -> None:
    with pytest.raises(ProfilerError, match="invalid device name"):
        profile_device("has space", config=TINY_CFG)
    for bad in (-1.0, 5e-324, 1e300):  # a peak becomes the table's peak_tflops: its physical range applies
        with pytest.raises(ProfilerError, match="must lie in"):
            profile_device("x", config=TINY_CFG, peak_tflops=bad)
    with pytest.raises(ProfilerError, match="unknown backend"):
        profile_device("x", config=TINY_CFG, backend="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ProfilerError, match="no CUDA device"):
            profile_device("x", config=TINY_CFG, backend="cuda")


# --------------------------------------------------------------------------------------------- collectives
def test_gloo_collectives_under_the_launcher(gloo_run: tuple[Path, Any, float]) -> None:
    out, r, wall = gloo_run
    assert r.returncode == 0, r.stderr[-3000:]
    assert wall < 60, f"gloo quick run took {wall:.1f} s"
    doc = load_collectives(out)
    assert doc["link"] == "intra" and doc["world_size"] == 2 and doc["local_world_size"] == 2
    assert doc["backend"] == "gloo" and len(doc["hosts"]) == 1
    for prim in PRIMITIVES:
        t = doc["tables"][prim]
        assert len(t["x"]) >= 3
        assert all(a < b for a, b in zip(t["x"], t["x"][1:]))
        assert all(y > 0 and math.isfinite(y) for y in t["y"])
        # busbw = factor * size / time (nccl-tests): 2(n-1)/n = 1 for all-reduce, (n-1)/n = 0.5 for
        # all-gather / reduce-scatter / all-to-all, 1 for send/recv at n = 2 -- the cost model's factors
        expected = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "all_to_all": 0.5, "p2p": 1.0}
        assert t["bus_factor"] == expected[prim] == BUS_FACTOR[prim](2)
        for x, y, s in zip(t["x"], t["y"], t["time_s"]):
            assert y == pytest.approx(expected[prim] * x / s / 1e9)
        assert t["method"], f"{prim}: the implementation used must be recorded"


def test_gloo_emulated_paths_are_marked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    doc = launch_local_collectives(
        2,
        tmp_path / "emu.json",
        quick=True,
        backend="gloo",
        max_bytes=65536,
        emulate=("all_gather", "reduce_scatter", "all_to_all"),
        timeout_s=120,
    )
    assert "all_reduce" in doc["tables"]["reduce_scatter"]["method"]
    assert "all_reduce" in doc["tables"]["all_gather"]["method"]
    assert "isend/irecv" in doc["tables"]["all_to_all"]["method"]
    assert doc["tables"]["all_reduce"]["method"] == "all_reduce"
    emulated = [n for n in doc["notes"] if "EMULATED" in n]
    assert len(emulated) == 3
    assert max(doc["tables"]["p2p"]["x"]) <= 65536


def test_collectives_outside_a_launcher_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ProfilerError, match=r"torch\.distributed\.run"):
        run_collectives(quick=True)


# --------------------------------------------------------------------------------------------- table -> cost model
def _plan(model: ModelSpec, cfg: ParallelConfig, pp: int = 2) -> Plan:
    n = model.num_layers
    stages = tuple(Stage("cpu-test", cfg, i * n // pp, (i + 1) * n // pp) for i in range(pp))
    return Plan(
        model=model.name,
        cluster="4xcpu-test",
        family="megatron",
        stages=stages,
        global_batch_size=8,
        seq_length=256,
        micro_batch_size=1,
    )


def test_profiled_table_loads_and_drives_the_estimate(devices_dir: Path, gloo_run: Any) -> None:
    path = devices_dir / "cpu-test.yaml"
    dev = device_from_dict(load_document(path), str(path))
    assert dev.provenance == "profiled" and dev.profiled["mode"] == "quick"
    cat = Catalog(devices_dirs=(devices_dir,))
    cluster = cat.cluster("4xcpu-test")
    assert cluster.groups[0].devices_per_node == 2 and cluster.groups[0].nodes == 2
    # pipeline of two 2-device stages (intra), and one 4-device stage spanning both "nodes" (inter DP sync)
    for model, cfg, pp in (
        (TINY, ParallelConfig(dp=2), 2),
        (TINY_MOE, ParallelConfig(dp=2, ep=2), 2),
        (TINY, ParallelConfig(dp=4), 1),
    ):
        est = estimate(model, cluster, _plan(model, cfg, pp))
        assert math.isfinite(est.iteration_time_s) and est.iteration_time_s > 0
        assert est.breakdown["compute"] > 0
        assert est.stages[0]["capacity_gib"] == pytest.approx(dev.memory_gib * (1 - Settings().memory_headroom))
        if model is TINY_MOE:
            assert est.breakdown["ep"] > 0  # priced with the measured all-to-all table
        if cfg.dp == 4:
            assert est.sync_s > 0


def test_the_estimate_reads_the_profiled_numbers(devices_dir: Path, tmp_path: Path) -> None:
    doc = yaml.safe_load((devices_dir / "cpu-test.yaml").read_text())
    base = estimate(TINY, Catalog(devices_dirs=(devices_dir,)).cluster("4xcpu-test"), _plan(TINY, ParallelConfig(dp=2)))
    slow = dict(doc)
    slow["tables"] = dict(doc["tables"])
    g = dict(doc["tables"]["gemm_efficiency"])
    g["y"] = [v / 4 for v in g["y"]]
    slow["tables"]["gemm_efficiency"] = g
    slow["memory_bandwidth_GBps"] = doc["memory_bandwidth_GBps"] / 4
    (tmp_path / "cpu-test.yaml").write_text(yaml.safe_dump(slow))
    est = estimate(TINY, Catalog(devices_dirs=(tmp_path,)).cluster("4xcpu-test"), _plan(TINY, ParallelConfig(dp=2)))
    assert est.breakdown["compute"] > 1.5 * base.breakdown["compute"]


def test_compare_profiled_cpu_with_a_shipped_device(devices_dir: Path) -> None:
    cat = Catalog(devices_dirs=(devices_dir,))
    prof, h100 = cat.device("cpu-test"), cat.device("h100")
    rows = compare_tables(prof, h100)
    quantities = {r.quantity for r in rows}
    assert {"gemm_efficiency", "attention_efficiency", "attention_bwd_efficiency", "gemm_tflops"} <= quantities
    assert {f"collectives.{link}.{p}" for link in ("intra", "inter") for p in PRIMITIVES} <= quantities
    peak = next(r for r in rows if r.quantity == "peak_tflops.bf16")
    assert peak.ratio == pytest.approx(prof.peak("bf16") / 989.4)
    s = summarize_rows(rows)
    assert s["gemm_tflops"] < 1.0  # a CPU is slower than an H100 at every GEMM size
