"""Measured peaks against the memory model: which rank a figure is, and what it can be compared with.

FlagPerf's ``mem`` cells are hand-entered from per-host nvidia-smi samples; no FlagPerf code says which GPU
or which summary over GPUs a cell is (bench/calibration/memory_runs.yaml header). The floor test below is
the evidence that, for the A800 Llama-3-8B pipelines, the cell cannot be stage 0's use under the script's
own settings, so such a row is compared only where every rank holds the same.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from hapmoe_milp.calibration import load_runs, prepare
from hapmoe_milp.calibration.memory_fidelity import MemoryResult, predict_memory, summarize_memory
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.errors import SpecError
from hapmoe_milp.specs import Catalog

ROOT = Path(__file__).resolve().parents[1]
MEMORY_RUNS = ROOT / "bench" / "calibration" / "memory_runs.yaml"
GIB = 2**30


def _runs() -> dict:
    return {r.id: r for r in load_runs(MEMORY_RUNS)}


def _llama3_8b_stage0_floor(pp: int, dp: int) -> tuple[float, float]:
    """(model state, stored activations) in bytes that stage 0 of FlagPerf's A800 Llama-3-8B run must hold
    at its 1F1B peak, in closed form from the published shapes and the launch script alone
    (training/benchmarks/llama3_8B/megatron/pretrain_llama3.sh at FlagPerf 93730d18: 32 layers, h 4096,
    FFN 14336 SwiGLU, 32 heads in 8 query groups, seq 8192, MBS 1, GBS 512, TP 1, --bf16,
    --use-distributed-optimizer, no recompute; Megatron core_v0.6.0 defaults: linear biases, tied
    embeddings, learned absolute positions 8192 x h, vocabulary 128256).

    State: 2 (BF16 weight) + 4 (FP32 main gradient) + 12/DP (FP32 main weight and two Adam moments) bytes a
    parameter (Megatron's theoretical_memory_usage rule). Activations: only what backward cannot do
    without, per token and layer in BF16 -- the two RMSNorm inputs, the QKV / proj / fc1 / fc2 GEMM inputs
    (the proj input is flash attention's output), flash attention's K and V (Q is not the QKV GEMM's
    input), the SwiGLU input (2F) -- i.e. 2 x (h + h + h + h/4 + h/4 + h + h + h + 2F + F) = 13h + 6F;
    no dropout masks, no working buffers. Stage 0 holds PP micro-batches of L/PP layers (1F1B warm-up
    PP - 1 plus the one in steady state; M = 512/DP >= PP)."""
    h, f, n_layers, v, s, g, d = 4096, 14336, 32, 128256, 8192, 8, 128
    per_layer = (h * (h + 2 * g * d) + (h + 2 * g * d)) + (h * h + h) + (h * 2 * f + 2 * f) + (f * h + h) + 2 * h
    params = n_layers // pp * per_layer + v * h + s * h
    state = params * (2 + 4 + 12 / dp)
    per_token_layer = 2 * (h + h + h + h // 4 + h // 4 + h + h + h + 2 * f + f)
    acts = pp * (n_layers // pp) * s * per_token_layer
    return state, acts


@pytest.mark.parametrize(
    ("rid", "pp", "dp"),
    [("mem-a800-llama3-8b-pp8-flagperf-bf16", 8, 1), ("mem-a800-llama3-8b-pp4dp2-flagperf-bf16", 4, 2)],
)
def test_flagperf_a800_pipeline_cells_are_below_what_stage_0_must_hold(rid, pp, dp):
    """The 55 and 59 GiB cells (nvidia-smi, device level) are below what stage 0 provably allocates, so
    they are some other GPU's, or a summary over GPUs; our stage 0 is not below that floor either."""
    state, acts = _llama3_8b_stage0_floor(pp, dp)
    run = _runs()[rid]
    assert (state + acts) / GIB > run.peak_memory_gib
    pr = prepare(run, Catalog(root=ROOT, use_calibrated=False))
    stage0 = estimate(pr.model, pr.cluster, pr.plan, pr.settings).stages[0]
    assert stage0["allocated_gib"] * GIB >= state + acts
    assert run.peak_memory_rank == "any"


def test_flagperf_baseline_pipeline_cell_is_above_the_stage_0_floor():
    """The floor does not rule out stage 0 everywhere: PP2 DP4's 76 GiB cell is above it."""
    state, acts = _llama3_8b_stage0_floor(2, 4)
    assert (state + acts) / GIB < _runs()["mem-a800-llama3-8b-pp2dp4-flagperf-bf16"].peak_memory_gib


def test_every_flagperf_cell_says_its_gpu_is_not_stated():
    """One property, every row that shares it: all FlagPerf mem cells, whatever they predict."""
    runs = list(_runs().values())
    flagperf = [r for r in runs if "github.com/FlagOpen/FlagPerf" in r.source]
    assert len(flagperf) == 15
    assert {r.peak_memory_rank for r in flagperf} == {"any"}
    assert {r.peak_memory_rank for r in runs if r not in flagperf} == {"hottest"}


def test_a_gpu_not_stated_is_compared_only_where_every_rank_holds_the_same():
    cat = Catalog(root=ROOT, use_calibrated=False)
    runs = _runs()
    pp8 = predict_memory(prepare(runs["mem-a800-llama3-8b-pp8-flagperf-bf16"], cat))
    tp8 = predict_memory(prepare(runs["mem-a800-llama3-8b-tp8-flagperf-bf16"], cat))
    assert pp8.stages == 8 and not pp8.comparable
    assert tp8.stages == 1 and tp8.comparable and tp8.lowest_gib == tp8.predicted_gib
    # stage 0 holds 8 micro-batches, stage 7 one: the stage range is wide and the cell inside it
    assert pp8.lowest_gib < pp8.measured_gib < pp8.predicted_gib and pp8.in_stage_range
    # the same PP 8 row with a named rank is compared with its hottest stage
    named = predict_memory(
        prepare(replace(runs["mem-a800-llama3-8b-pp8-flagperf-bf16"], peak_memory_rank="hottest"), cat)
    )
    assert named.comparable and named.predicted_gib == pp8.predicted_gib


def test_summary_of_two_rows_by_hand():
    def row(rid: str, measured: float, predicted: float) -> MemoryResult:
        return MemoryResult(rid, "m", "device", measured, predicted, True, 0, {})

    s = summarize_memory([row("a", 50.0, 55.0), row("b", 40.0, 38.0)])
    assert s.runs == 2 and s.mape == pytest.approx((0.10 + 0.05) / 2)
    assert s.worst == pytest.approx(0.10) and s.worst_id == "a" and s.bias == pytest.approx((0.10 - 0.05) / 2)


def test_peak_memory_rank_is_checked_by_the_loader(tmp_path):
    doc = {
        "runs": [
            {"id": "r", "source": "https://example.org/r", "model": "llama-3-8b", "cluster": "8xa800", "pp": 2,
             "seq_length": 4096, "global_batch_size": 8, "peak_memory_gib": 40.0, "peak_memory_kind": "device",
             "peak_memory_rank": "mean"}
        ]
    }  # fmt: skip
    p = tmp_path / "runs.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match="peak_memory_rank"):
        load_runs(p)
    doc["runs"][0]["peak_memory_rank"] = "any"
    p.write_text(yaml.safe_dump(doc))
    assert load_runs(p)[0].peak_memory_rank == "any"
    del doc["runs"][0]["peak_memory_rank"]
    p.write_text(yaml.safe_dump(doc))
    assert load_runs(p)[0].peak_memory_rank == "hottest"
