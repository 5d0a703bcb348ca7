"""Pricing of the layer kinds of hybrid and linear-attention models (cost/mixers.py, CostModel).

Megatron's hybrid models cut an attention + MLP layer into two one-sub-layer layers, so a model priced
as ``attention`` + ``moe_mlp`` must cost what the same sub-layers cost as one ``moe`` layer: weights,
stored activations, compute, communication and kernels add up. Closed forms check the mixers' GEMM work.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from hapmoe_milp.config import ParallelConfig, Settings, parse_recompute
from hapmoe_milp.cost.kernels import layer_kernels
from hapmoe_milp.cost.memory import activation_terms, stored_bytes
from hapmoe_milp.cost.mixers import mixer_cost
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.specs import Catalog

CAT = Catalog()
H100 = CAT.cluster("64-h100")
MOE = CAT.model("qwen3-30b-a3b")
# the same layers as a Megatron hybrid stack: attention, then MoE, per decoder layer
HYB = replace(MOE, num_layers=96, hybrid_override_pattern="*E" * 48, moe_layer_freq=1)
NEMO = CAT.model("nemotron-3-nano-30b-a3b")
QNEXT = CAT.model("qwen3-next-80b-a3b")
CFGS = [ParallelConfig(dp=8, ep=8), ParallelConfig(tp=2, dp=4, ep=8), ParallelConfig(tp=4, dp=2, ep=4, etp=2)]


@pytest.mark.parametrize("cfg", CFGS, ids=lambda c: c.label())
@pytest.mark.parametrize("rec", ["none", "selective", "full"])
def test_hybrid_split_of_a_layer_costs_the_same(cfg: ParallelConfig, rec: str) -> None:
    st = Settings(seq_length=4096)
    whole = CostModel(MOE, H100, st).layer("h100", cfg, 1, "moe", rec)  # type: ignore[arg-type]
    cm = CostModel(HYB, H100, st)
    a, e = cm.layer("h100", cfg, 1, "attention", rec), cm.layer("h100", cfg, 1, "moe_mlp", rec)  # type: ignore[arg-type]
    for attr in ("compute", "tp", "ep", "weights", "params_dense", "params_expert"):
        assert getattr(a, attr) + getattr(e, attr) == pytest.approx(getattr(whole, attr), rel=1e-9), attr
    # full recompute keeps each layer's input: two layers keep two inputs where one layer keeps one
    inputs = 2 if rec == "full" else 1
    assert a.act + e.act == pytest.approx(inputs * whole.act, rel=1e-9)
    ka = layer_kernels(HYB, cfg, "attention", "alltoall", "bf16", rec)
    ke = layer_kernels(HYB, cfg, "moe_mlp", "alltoall", "bf16", rec)
    kw = layer_kernels(MOE, cfg, "moe", "alltoall", "bf16", rec)
    assert ka.fwd + ke.fwd == kw.fwd and ka.syncs_fwd + ke.syncs_fwd == kw.syncs_fwd


def test_hybrid_params_add_up() -> None:
    for k in ("tp", "replicated", "expert"):
        assert HYB.layer_params("attention")[k] + HYB.layer_params("moe_mlp")[k] == MOE.layer_params("moe")[k]
    assert HYB.total_params == MOE.total_params and HYB.active_params == MOE.active_params


def test_mamba2_gemm_work_by_hand() -> None:
    """With a compute-bound table and no memory limit the two projections are 2 x MACs FLOPs at the
    device's GEMM efficiency: Nemotron 3 Nano's Mamba-2, in_proj 2688 -> 2*4096 + 2*8*128 + 64, out 4096."""
    m = NEMO
    s = m.mamba_shape
    assert (s.inner, s.conv_dim, s.in_proj_out) == (4096, 4096 + 2048, 2 * 4096 + 2048 + 64)
    assert s.gemm_macs() == 2688 * (2 * 4096 + 2048 + 64) + 4096 * 2688
    dev = H100.device("h100")
    t = 65536
    one, two = mixer_cost(m, dev, "mamba", t, 1, 4096, "bf16"), mixer_cost(m, dev, "mamba", t, 2, 4096, "bf16")
    assert two.fwd < one.fwd  # TP shards the mixer's width
    # what the mixer keeps is priced once, in cost/memory.py: every term is per token of the TP x SP shard
    kept = [
        stored_bytes(activation_terms(m, Settings(seq_length=4096), ParallelConfig(tp=tp, dp=8 // tp), 1, "mamba"),
                     parse_recompute("none"))
        for tp in (1, 2)
    ]  # fmt: skip
    assert kept[1] == pytest.approx(kept[0] / 2, rel=1e-12)
    assert one.bwd > 1.9 * one.fwd  # backward: two GEMMs per forward GEMM, 2.5x scan


def test_gdn_layers_cheaper_than_attention_at_long_sequence() -> None:
    """Linear attention does not grow with the sequence; softmax attention's core does."""
    cfg = ParallelConfig(tp=2, dp=4, ep=8)
    short, long_ = (CostModel(QNEXT, H100, Settings(seq_length=s, global_batch_size=64)) for s in (4096, 32768))
    g4, a4 = short.layer("h100", cfg, 1, "gdn_moe", "none"), short.layer("h100", cfg, 1, "moe", "none")
    g32, a32 = long_.layer("h100", cfg, 1, "gdn_moe", "none"), long_.layer("h100", cfg, 1, "moe", "none")
    assert g32.compute / g4.compute < a32.compute / a4.compute


def test_context_parallel_prices_the_mixers_all_to_all() -> None:
    st = Settings(seq_length=8192)
    cm = CostModel(NEMO, H100, st)
    cp2 = ParallelConfig(tp=1, cp=2, dp=4, ep=8)
    assert cm.layer("h100", cp2, 1, "mamba", "none").cp > 0
    assert cm.layer("h100", cp2, 1, "moe_mlp", "none").cp == 0  # an MLP has no sequence exchange
    assert cm.layer("h100", cp2, 1, "attention", "none").cp >= 0


def test_full_recompute_keeps_only_the_layer_input() -> None:
    cfg = ParallelConfig(tp=2, dp=4, ep=8)
    for model, kind in ((NEMO, "mamba"), (NEMO, "moe_mlp"), (QNEXT, "gdn_moe")):
        cm = CostModel(model, H100, Settings(seq_length=4096))
        full = cm.layer("h100", cfg, 1, kind, "full").act  # type: ignore[arg-type]
        assert full == pytest.approx(4096 / 2 * model.hidden_size * 2)
        assert cm.layer("h100", cfg, 1, kind, "none").act > cm.layer("h100", cfg, 1, kind, "selective").act > full  # type: ignore[arg-type]


def _with_ssd(dev, eff: float):
    return replace(dev, runtime=dev.runtime.with_values({"ssd_efficiency": eff}))


def test_mamba2_scan_reproduces_the_published_b200_ssd_timing() -> None:
    """Nemotron 3 Nano's SSD forward on B200, batch 2 x 8192 (one mixer, TP1): TensorRT-LLM's copy of the
    Triton kernels took 0.7209 ms (aiconfigurator's B200 table, microbenchmarks.yaml row b200-ssd-fwd-2x8k);
    the mixer's scan part -- its forward minus the same forward with a free scan -- must land on it, and the
    backward's scan part is the stated 2.5x."""
    b200 = Catalog(use_calibrated=False).device("b200")
    t = 2 * 8192
    real = mixer_cost(NEMO, b200, "mamba", t, 1, 8192, "bf16")
    free = mixer_cost(NEMO, _with_ssd(b200, 0.9), "mamba", t, 1, 8192, "bf16")
    # at 0.9 of peak the scan is ~0.03 ms: subtract what remains by pricing it at a second efficiency
    free2 = mixer_cost(NEMO, _with_ssd(b200, 0.45), "mamba", t, 1, 8192, "bf16")
    scan_at_09 = free2.fwd - free.fwd  # t(0.45) - t(0.9) = t(0.9)
    scan_f = real.fwd - free.fwd + scan_at_09
    assert scan_f == pytest.approx(0.7209e-3, rel=0.15)
    scan_b = real.bwd - free.bwd + (free2.bwd - free.bwd)
    assert scan_b == pytest.approx(2.5 * scan_f, rel=1e-9)


def test_each_scan_kernel_reads_only_its_own_measured_efficiency() -> None:
    """Mamba-2's SSD reads ssd_efficiency, gated DeltaNet's delta rule gdn_efficiency, and neither the other's."""
    h100 = CAT.device("h100")
    slow_ssd = _with_ssd(h100, 0.01)
    slow_gdn = replace(h100, runtime=h100.runtime.with_values({"gdn_efficiency": 0.01}))

    def cost(model, dev, mixer):
        return mixer_cost(model, dev, mixer, 8192, 1, 8192, "bf16")

    assert cost(QNEXT, slow_ssd, "gdn") == cost(QNEXT, h100, "gdn")
    assert cost(NEMO, slow_gdn, "mamba") == cost(NEMO, h100, "mamba")
    assert cost(NEMO, slow_ssd, "mamba").fwd > cost(NEMO, h100, "mamba").fwd
    assert cost(QNEXT, slow_gdn, "gdn").fwd > cost(QNEXT, h100, "gdn").fwd


def test_gdn_scan_reproduces_the_published_h100_delta_rule_timing() -> None:
    """Qwen3-Next's delta rule on H100, batch 2 x 8192, TP1: TensorRT-LLM's copy of flash-linear-attention's
    Triton kernel took 1.0446 ms (row h100-gdn-fwd-2x8k); backward is the measured 3.1x (H200/GB200 FLA rows)."""
    h100 = Catalog(use_calibrated=False).device("h100")
    t = 2 * 8192

    def scan(eff: float):
        dev = replace(h100, runtime=h100.runtime.with_values({"gdn_efficiency": eff}))
        return mixer_cost(QNEXT, dev, "gdn", t, 1, 8192, "bf16")

    real, free, free2 = mixer_cost(QNEXT, h100, "gdn", t, 1, 8192, "bf16"), scan(0.9), scan(0.45)
    scan_f = real.fwd - free.fwd + (free2.fwd - free.fwd)
    assert scan_f == pytest.approx(1.0446e-3, rel=0.15)
    assert real.bwd - free.bwd + (free2.bwd - free.bwd) == pytest.approx(3.1 * scan_f, rel=1e-9)
