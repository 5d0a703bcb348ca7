"""Every itemized memory term (hapmoe_milp/cost/memory.py) pinned by a closed form.

Expected values are written from the definitions (bytes per parameter of each precision and sharding;
bytes per token of each kept tensor), not read off the code's output.
"""

from __future__ import annotations

import pytest

from hapmoe_milp.config import ParallelConfig, Settings, parse_recompute
from hapmoe_milp.cost.memory import (
    MemoryModel,
    activation_terms,
    bytes_per_param,
    fsdp_buffer_bytes,
    head_bytes,
    stored_bytes,
)
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.cost.primitives import GIB
from hapmoe_milp.cost.stage import block_full_counts, stage_totals
from hapmoe_milp.errors import SettingsError
from hapmoe_milp.specs.catalog import Catalog
from tests.helpers import dense_mha, synthetic_cluster, synthetic_device, tiny_moe

S, H, F = 4096, 1024, 4096


def st(**kw) -> Settings:
    return Settings(seq_length=S, **kw)


# ------------------------------------------------------------------ model state per parameter
# (settings, shard d, expected bytes: params, fp8 copies, grads, main params, moments)
D = 8
STATE_CASES = [
    ({}, (2, 0, 4, 4 / D, 8 / D)),  # Megatron's 6 + 12/d
    ({"distributed_optimizer": False}, (2, 0, 4, 4, 8)),  # 18
    ({"grad_reduce_in_bf16": True}, (2, 0, 2, 4 / D, 8 / D)),
    ({"precision": "fp8"}, (2, 2, 4, 4 / D, 8 / D)),  # FP8 rowwise + columnwise weight cache
    ({"precision": "fp8", "fp8_param_gather": True}, (1, 1, 4, 4 / D, 8 / D)),
    ({"optimizer_state_dtype": "bf16"}, (2, 0, 4, 4 / D, 4 / D)),
    ({"main_params_dtype": "fp16"}, (2, 0, 4, 2 / D, 8 / D)),
    ({"optimizer_offload": True}, (2, 0, 4, 0, 0)),
    ({"fsdp": "optim"}, (2, 0, 4, 4 / D, 8 / D)),
    ({"fsdp": "optim_grads"}, (2, 0, 4 / D, 4 / D, 8 / D)),
    ({"fsdp": "optim_grads_params"}, (2 / D, 0, 4 / D, 4 / D, 8 / D)),
]


@pytest.mark.parametrize(("kw", "want"), STATE_CASES, ids=[str(c[0]) for c in STATE_CASES])
def test_bytes_per_parameter(kw, want):
    b = bytes_per_param(st(**kw), D)
    got = (b.params, b.fp8_weights, b.grads, b.main_params, b.optimizer)
    assert got == pytest.approx(want, rel=1e-12)


def test_bad_state_settings_are_refused_in_one_place():
    with pytest.raises(SettingsError, match="fp8_param_gather"):
        st(fp8_param_gather=True)
    with pytest.raises(SettingsError, match="fsdp"):
        st(fsdp="zero3")
    with pytest.raises(SettingsError, match="attn_proj"):
        st(offload_modules=("attn_proj",))
    with pytest.raises(SettingsError, match="distributed optimizer"):
        st(optimizer_state_dtype="bf16", distributed_optimizer=False)
    with pytest.raises(SettingsError, match="legacy_model"):
        st(legacy_model=True, precision="fp8")
    with pytest.raises(SettingsError, match="legacy_model"):
        st(legacy_model="yes")


# ------------------------------------------------------------------ activations by recompute module
def layer_act(model, recompute: str, cfg=None, **kw) -> float:
    cm = CostModel(model, synthetic_cluster(nodes=4), st(**kw))
    return cm.layer("syn", cfg or ParallelConfig(dp=8), 1, "moe" if model.is_moe else "dense", recompute).act


def test_dense_layer_tensors_without_dropout():
    """MHA non-gated, BF16, no dropout: attention 2h norm in + 2h QKV in + 2*3h Q,K,V + 2h output; MLP
    2h norm in + 2h fc1 in + 2F fc1 out + 2F fc2 in: 16h + 4F per token."""
    assert layer_act(dense_mha(), "none") == pytest.approx(S * (16 * H + 4 * F), rel=1e-12)


@pytest.mark.parametrize(
    ("recompute", "dropped"),
    [
        ("layernorm", 2 * H + 2 * H),  # QKV input and fc1 input
        ("mlp", 2 * H + 2 * F + 2 * F),  # fc1 input, fc1 output, fc2 input
        ("core_attn", 0.0),  # BF16 + flash: the core's output is the projection's input anyway
        ("core_attn,mlp", 2 * H + 4 * F),
        ("selective", 4 * H),  # layernorm + moe_act (a no-op on dense layers)
    ],
)
def test_dense_recompute_modules_drop_their_tensors(recompute, dropped):
    none = layer_act(dense_mha(), "none")
    assert none - layer_act(dense_mha(), recompute) == pytest.approx(S * dropped, rel=1e-12)


def test_fp8_keeps_gemm_inputs_in_one_byte_and_core_attn_then_frees_the_bf16_output():
    """FP8: QKV/fc1 inputs h and fc2 input F bytes (not 2h, 2F); the projection keeps its own FP8 copy of
    the core's output (q bytes) beside the core's BF16 output (2q), which core_attn recompute drops."""
    bf16 = layer_act(dense_mha(), "none")
    fp8 = layer_act(dense_mha(), "none", precision="fp8")
    assert bf16 - fp8 == pytest.approx(S * (H + H + F - H), rel=1e-12)
    assert fp8 - layer_act(dense_mha(), "core_attn", precision="fp8") == pytest.approx(S * 2 * H, rel=1e-12)


def test_moe_recompute_keeps_only_attention_and_the_norm_input():
    """`moe` regenerates the whole MoE block: only the attention tensors and the MoE norm's input stay."""
    m = tiny_moe()
    c = ParallelConfig(dp=8, ep=4)
    q, kv = 1024, 256
    attn = 2 * H + 2 * H + 2 * (q + 2 * kv) + 2 * q
    assert layer_act(m, "moe", c) == pytest.approx(S * (attn + 2 * H), rel=1e-12)
    # the sel-moe rung adds layernorm: the QKV input goes too
    assert layer_act(m, "sel-moe", c) == pytest.approx(S * (attn + 2 * H - 2 * H), rel=1e-12)


def test_mla_up_proj_drops_the_up_projected_heads():
    m = Catalog().model("deepseek-v2-lite")  # MLA without q LoRA
    c = ParallelConfig(dp=8, ep=8)
    n, qk, pe, v, kvr = 16, 128, 64, 128, 512
    want = 2 * (2 * n * (qk + pe) + n * v) + 2 * kvr  # Q, K, V and the kv up-projection's input
    got = layer_act(m, "none", c) - layer_act(m, "mla_up_proj", c)
    ts = S * 1.0
    assert got == pytest.approx(ts * want, rel=1e-12)


def test_uniform_recompute_keeps_one_input_per_group_and_regenerates_a_group():
    cm = CostModel(dense_mha(), synthetic_cluster(nodes=4), st())
    c = ParallelConfig(dp=8)
    full = cm.layer("syn", c, 1, "dense", "full")
    uni = cm.layer("syn", c, 1, "dense", "uniform:4")
    assert full.act == pytest.approx(2 * H * S, rel=1e-12)
    assert uni.act == pytest.approx(2 * H * S / 4, rel=1e-12)
    assert uni.work == pytest.approx(4 * full.work, rel=1e-12)


def test_block_recompute_prices_the_first_k_layers_per_chunk_as_full():
    kinds = ("dense",) * 8
    assert block_full_counts(kinds, 0, 8, 1, 3) == {"dense": 3}
    assert block_full_counts(kinds, 0, 8, 2, 3) == {"dense": 6}  # two chunks of 4, first 3 of each
    assert block_full_counts(kinds, 0, 8, 4, 3) == {"dense": 8}  # chunks of 2: all covered
    cm = CostModel(dense_mha(), synthetic_cluster(nodes=4), st())
    c = ParallelConfig(dp=8)
    none, full = cm.layer("syn", c, 1, "dense", "none"), cm.layer("syn", c, 1, "dense", "full")
    t = stage_totals(cm, "syn", c, 1, "full:3", {"dense": 8}, index=1, pp=3, num_microbatches=8,
                     full_counts={"dense": 3})  # fmt: skip
    assert t.activations == pytest.approx(2 * (3 * full.act + 5 * none.act), rel=1e-12)


def test_activation_offload_moves_its_modules_tensors_to_the_host():
    m = tiny_moe()
    c = ParallelConfig(dp=8, ep=4)
    base = layer_act(m, "none", c)
    off = layer_act(m, "none", c, offload_modules=("expert_fc1", "moe_act"))
    rows, fe = 2 * S, 2048
    assert base - off == pytest.approx(rows * (2 * H + 2 * 2 * fe), rel=1e-12)  # fc1 input and fc1 output
    terms = activation_terms(m, st(), c, 1, "moe", 2 * S)
    assert stored_bytes(terms, parse_recompute("none")) == pytest.approx(base, rel=1e-12)


@pytest.mark.parametrize(("precision", "q8"), [("bf16", 2), ("fp8", 1)])
def test_mamba2_keeps_zxbcdt_scan_output_norm_and_out_proj_inputs_not_the_conv(precision, q8):
    """Megatron-Core's Mamba-2 training path (mamba_split_conv1d_scan_combined) saves the in-projection
    output zxBCdt and the pre-gate scan output and recomputes the convolution in backward; the gated
    RMSNorm keeps its input and the out-projection its input. Nemotron 3 Nano: 64 heads x 64, 8 groups of
    state 128, hidden 2688: zxBCdt = 2*4096 + 2*8*128 + 64 = 10304 wide, inner 4096."""
    m = Catalog().model("nemotron-3-nano-30b-a3b")
    c = ParallelConfig(tp=2, dp=4)
    ts = S / 2
    terms = {t.name: t.nbytes for t in activation_terms(m, st(precision=precision), c, 1, "mamba")}
    want = {
        "mixer_norm_input": 2 * 2688,
        "mixer_in_proj_input": q8 * 2688,
        "mamba_in_proj_output": 2 * 10304,
        "mamba_scan_output": 2 * 4096,
        "mamba_norm_input": 2 * 4096,
        "mamba_out_proj_input": q8 * 4096,
    }
    assert terms == pytest.approx({k: v * ts for k, v in want.items()}, rel=1e-12)


# ------------------------------------------------------------------ edges and buffers
def test_head_keeps_norm_and_gemm_inputs_and_transient_logits():
    m = dense_mha()
    kept, logits = head_bytes(m, st(), ParallelConfig(tp=2, dp=4), 1)
    assert kept == pytest.approx(2 * 2 * H * S / 2, rel=1e-12)
    assert logits == pytest.approx(10 * S * 32000 / 2, rel=1e-12)  # bf16 + fp32 + fp32 gradient per logit


def test_fsdp_buffers_hold_two_layers_of_params_and_one_of_grads():
    assert fsdp_buffer_bytes(st(fsdp="optim_grads_params"), 1e9) == pytest.approx(1e9 * (2 * 2 + 4))
    assert fsdp_buffer_bytes(st(fsdp="optim_grads"), 1e9) == 0.0


# ------------------------------------------------------------------ device terms and the capacity rule
@pytest.mark.parametrize("dispatcher", ["alltoall", "flex"])
def test_device_total_and_budget_are_one_inequality(dispatcher):
    dev = synthetic_device()
    mm = MemoryModel(dev, st(dispatcher=dispatcher, memory_headroom=0.02))
    c = ParallelConfig(dp=8, ep=8)
    t = dev.memory
    outside = (t.context_gib + (t.flex_buffer_gib if dispatcher == "flex" else 0.0)) * GIB
    assert mm.outside_bytes(c) == pytest.approx(outside)
    assert mm.usable() == pytest.approx(dev.memory_gib * GIB * 0.98)
    budget = mm.budget(c)
    assert budget == pytest.approx((dev.memory_gib * GIB * 0.98 - outside) / (1 + t.fragmentation))
    assert mm.device_total(budget, c) == pytest.approx(mm.usable(), rel=1e-12)
    items = mm.items({"params": 10 * GIB, "activations": 5 * GIB}, c)
    assert sum(items.values()) == pytest.approx(mm.device_total(15 * GIB, c), rel=1e-12)


def test_estimate_fits_exactly_when_allocated_is_within_the_budget():
    cat = Catalog()
    from hapmoe_milp.cost.estimate import estimate
    from hapmoe_milp.knobs import plan_from_knobs

    m, c = cat.model("mixtral-8x7b"), cat.cluster("16-1-h")
    for rec in ("none", "full"):
        plan = plan_from_knobs(m, c, Settings(global_batch_size=64), tp=2, pp=2, ep=4, recompute=rec)
        est = estimate(m, c, plan)
        for s, t in zip(est.stages, est.totals, strict=True):
            assert s["fits"] == (t.allocated <= t.budget)
            assert sum(s["memory_items_gib"].values()) == pytest.approx(s["memory_gib"], rel=1e-9)
        assert est.fits == all(s["fits"] for s in est.stages)
