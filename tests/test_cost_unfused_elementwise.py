"""The vocabulary-parallel cross-entropy's HBM passes, and unfused gated activation and rotary embedding (MindSpeed-LLM without --use-fused-swiglu /
--use-fused-rotary-pos-emb): the extra HBM passes of the element-wise chains, in closed form, and the run
rows that carry them match their scripts (MindSpeed-LLM @104cd47479)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hapmoe_milp.calibration.runs import load_runs
from hapmoe_milp.config import ParallelConfig, Settings
from hapmoe_milp.cost.layer import UNFUSED_GLU_PASSES, UNFUSED_ROPE_PASSES
from hapmoe_milp.cost.model import CE_BYTES, CE_FUSED_BYTES, CostModel
from hapmoe_milp.cost.primitives import BF16, memory_time
from tests.helpers import EFF, PEAK, dense_mha, synthetic_cluster, synthetic_device

S = 4096
ROOT = Path(__file__).resolve().parents[1]


def layer(model, tp=1, **st):
    cm = CostModel(model, synthetic_cluster(synthetic_device(mem_GBps=1000.0)), Settings(seq_length=S, **st))
    return cm, cm.layer("syn", ParallelConfig(tp=tp, cp=1, dp=1, ep=1, etp=1), 1, "dense", "none")


@pytest.mark.parametrize("tp", [1, 4])
def test_unfused_swiglu_adds_its_passes_over_the_ffn_activation(tp):
    m = dense_mha(swiglu=True, ffn_hidden_size=2816)
    cm, fused = layer(m, tp)
    _, unfused = layer(m, tp, fused_swiglu=False)
    dev = cm.device("syn")
    elems = S * m.ffn / tp
    scale = dev.runtime.stack_compute_scale
    assert unfused.fwd - fused.fwd == pytest.approx(memory_time(dev, 2 * elems * BF16) / scale, rel=1e-9)
    assert unfused.bwd - fused.bwd == pytest.approx(memory_time(dev, 8 * elems * BF16) / scale, rel=1e-9)
    assert UNFUSED_GLU_PASSES == (2.0, 8.0)  # silu 2 + mul 3 = 5 vs 3; backward 3 + 3 + 3 + 4 = 13 vs 5
    # recompute of the MLP re-runs the unfused forward too
    assert unfused.compute - fused.compute == pytest.approx((10 * elems * BF16) / (dev.memory_bandwidth_GBps * 1e9)
                                                            / dev.runtime.memory_efficiency / scale, rel=1e-9)  # fmt: skip


def test_non_gated_mlp_has_no_swiglu_to_unfuse():
    m = dense_mha()  # swiglu False
    assert layer(m, fused_swiglu=False)[1].fwd == layer(m)[1].fwd


@pytest.mark.parametrize("groups", [8, 2])
def test_unfused_rope_adds_its_passes_over_q_and_k(groups):
    m = dense_mha(num_query_groups=groups, kv_channels=128)
    cm, fused = layer(m, 2)
    _, unfused = layer(m, 2, fused_rope=False)
    dev = cm.device("syn")
    qk = S * (m.q_dim + m.kv_dim) / 2
    scale = dev.runtime.stack_compute_scale
    assert unfused.fwd - fused.fwd == pytest.approx(memory_time(dev, 10 * qk * BF16) / scale, rel=1e-9)
    assert unfused.bwd - fused.bwd == pytest.approx(memory_time(dev, 8 * qk * BF16) / scale, rel=1e-9)
    assert UNFUSED_ROPE_PASSES == (10.0, 8.0)


def test_fused_defaults_leave_every_other_run_unpriced():
    s = Settings()
    assert s.fused_swiglu and s.fused_rope


# Scripts at MindSpeed-LLM 104cd47479 without --use-fused-swiglu (swiglu or --geglu) / --use-fused-rotary-pos-emb
# (rope, or the unfused --use-partial-rope branch); the others in runs.yaml pass the flags or use ALiBi.
UNFUSED_GLU_RUNS = {
    "llama-7b-pp8", "llama-13b-pp8", "llama-33b-tp4pp4", "llama-65b-tp8pp4", "yi-34b-tp8pp2", "qwen-14b-tp8",
    "internlm-7b-tp8", "aquila2-7b-tp8", "aquila2-34b-tp8pp2", "baichuan2-7b-tp8", "gemma-7b-tp8", "gemma-2b-pp2",
}  # fmt: skip
UNFUSED_ROPE_RUNS = {
    "llama-7b-pp8", "llama-13b-pp8", "llama-33b-tp4pp4", "llama-65b-tp8pp4", "qwen-14b-tp8", "aquila2-7b-tp8",
    "aquila2-34b-tp8pp2", "baichuan2-7b-tp8", "gemma-2b-pp2", "chatglm3-6b-8k-pp2",
}  # fmt: skip


def test_mindspeed_runs_record_the_unfused_kernels_of_their_scripts():
    runs = {r.id: r for r in load_runs(ROOT / "bench" / "calibration" / "runs.yaml")}
    for r in runs.values():
        kw = r.settings_kw()
        name = r.id.removeprefix("910b-").removesuffix("-mindspeed")
        assert kw.get("fused_swiglu", True) == (name not in UNFUSED_GLU_RUNS), r.id
        assert kw.get("fused_rope", True) == (name not in UNFUSED_ROPE_RUNS), r.id


def test_head_prices_the_fp32_cross_entropy_passes_over_the_vocabulary_shard():
    m = dense_mha()
    for tp in (1, 2):
        cm = CostModel(m, synthetic_cluster(synthetic_device(mem_GBps=1000.0)), Settings(seq_length=S))
        E = cm.last_edge("syn", ParallelConfig(tp=tp, cp=1, dp=1, ep=1, etp=1), 1)
        v = m.padded_vocab(tp) / tp
        gemm = 2 * S * v * 1024 / (EFF * PEAK)
        assert CE_BYTES == (38.0, 14.0)  # cast 6, max 4, subtract 8, exp 8, sum 4, normalise 8; scale 8, cast back 6
        assert E.compute == pytest.approx(3 * gemm + (38 + 14) * S * v / 1000e9, rel=1e-9)


def test_fused_cross_entropy_keeps_the_three_fp32_passes_each_way():
    m = dense_mha()
    dev = synthetic_device(mem_GBps=1000.0)
    c = ParallelConfig(tp=1, cp=1, dp=1, ep=1, etp=1)
    unf = CostModel(m, synthetic_cluster(dev), Settings(seq_length=S)).last_edge("syn", c, 1)
    fus = CostModel(m, synthetic_cluster(dev), Settings(seq_length=S, cross_entropy_fusion=True)).last_edge("syn", c, 1)
    n = S * m.padded_vocab(1)
    assert CE_FUSED_BYTES == (12.0, 12.0)
    assert unf.fwd - fus.fwd == pytest.approx((38 - 12) * n / 1000e9, rel=1e-9)
    assert unf.bwd - fus.bwd == pytest.approx((14 - 12) * n / 1000e9, rel=1e-9)


def test_runs_of_stacks_whose_model_providers_fuse_the_cross_entropy_say_so():
    """Megatron-Bridge's GPTModelProvider (gpt_provider.py@067f987df0) and NeMo 2's GPTConfig
    (llm/gpt/model/base.py@7192a2c944) default cross_entropy_loss_fusion to True; Megatron-LM, MindSpeed-LLM
    and FlagScale leave it off."""
    for r in load_runs(ROOT / "bench" / "calibration" / "runs.yaml"):
        fused = r.stack in ("nvidia-megatron-core-2025", "nemo-25.02")
        assert r.settings_kw().get("cross_entropy_fusion", False) == fused, r.id


def test_the_fusion_settings_are_estimate_and_solve_flags():
    """A runs file can carry the three fusion settings, so a user can ask for them too: unfused SwiGLU and
    rotary make the same plan slower by the extra passes, the fused cross-entropy faster; solve takes them and
    its plan JSON keeps them."""
    import io
    import json
    from contextlib import redirect_stderr, redirect_stdout

    from hapmoe_milp import cli

    def run(*argv: str) -> dict:
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = cli.run(list(argv))
        assert code == 0, err.getvalue()
        return json.loads(out.getvalue())

    base = ["estimate", "-m", "llama-3-8b", "-c", "8x910b", "--tp", "8", "--gbs", "64", "--json"]
    t = {
        name: run(*base, *extra)["iteration_time_s"]
        for name, extra in {
            "default": [],
            "unfused": ["--no-fused-swiglu", "--no-fused-rope"],
            "ce": ["--cross-entropy-fusion"],
        }.items()
    }
    assert t["unfused"] > t["default"] > t["ce"]
    sol = run("solve", "-m", "mixtral-s", "-c", "16-1", "--no-fused-rope", "--cross-entropy-fusion", "--json")
    text = json.dumps(sol)
    assert '"fused_rope": false' in text and '"cross_entropy_fusion": true' in text
