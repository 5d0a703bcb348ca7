"""The named runtime terms: each moves the prediction the way its physics says, and only through its
own parameter (closed forms where there is one, directions where the term is a behaviour).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from hapmoe_milp.config import ParallelConfig, Settings
from hapmoe_milp.cost.kernels import layer_kernels
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.cost.primitives import distinct_groups, gemm_time
from hapmoe_milp.errors import SpecError
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs._fields import Fields
from hapmoe_milp.specs.runtime import PARAMS, RuntimeParams, runtime_from_fields

CAT = Catalog(use_calibrated=False)
H100 = CAT.device("h100")


def with_rt(dev, **kw):
    return replace(dev, runtime=replace(dev.runtime, **kw))


# ------------------------------------------------------------------ grouped GEMM
@pytest.mark.parametrize("rows", [64, 256, 1024, 4096])
def test_halving_rows_per_expert_lowers_grouped_gemm_efficiency(rows):
    """Same total work split over twice as many experts of half the rows: slower per FLOP."""
    dev = with_rt(H100, grouped_rows_half=512.0)
    n, k = 1536, 2048

    def tflops(m: float, groups: int) -> float:
        return 2 * m * n * k * groups / gemm_time(dev, m, n, k, "bf16", groups=groups) / 1e12

    assert tflops(rows / 2, 64) < tflops(rows, 32)


def test_grouped_gemm_factor_is_rows_over_rows_plus_half_when_compute_bound():
    """Compute-bound (huge bandwidth): the grouped kernel runs at the dense efficiency of its total work
    times m / (m + rows_half), so with rows_half = m it takes exactly twice the time."""
    dev = replace(H100, memory_bandwidth_GBps=1e9)
    m, n, k, g = 1024, 4096, 4096, 16
    base = gemm_time(with_rt(dev, grouped_rows_half=0.0), m, n, k, "bf16", groups=g)
    half = gemm_time(with_rt(dev, grouped_rows_half=float(m)), m, n, k, "bf16", groups=g)
    assert half == pytest.approx(2 * base, rel=1e-12)
    # a single dense GEMM ignores the grouped term
    assert gemm_time(with_rt(dev, grouped_rows_half=float(m)), m, n, k) == gemm_time(dev, m, n, k)


# ------------------------------------------------------------------ host and sync
@pytest.mark.parametrize("kind", ["moe", "dense"])
def test_host_overhead_is_launches_times_gap_plus_syncs(kind):
    """A layer's time is its device work plus launch_us per kernel it issues and sync_us per sync."""
    m = CAT.model("qwen3-30b-a3b" if kind == "moe" else "llama-2-7b")
    c = CAT.cluster("8xh100")
    cfg = ParallelConfig(tp=2, dp=4, ep=4 if kind == "moe" else 1)
    from hapmoe_milp.calibration.fidelity import with_devices

    def layer(launch: float, sync: float):
        dev = with_rt(c.device("h100"), launch_us=launch, sync_us=sync, call_us=0.0)  # the launch terms alone
        cc = with_devices(c, {"h100": dev})
        return CostModel(m, cc, Settings()).layer("h100", cfg, 1, kind, "none")

    k = layer_kernels(m, cfg, kind, "alltoall", "bf16", "none")
    base, more = layer(0.0, 0.0), layer(10.0, 40.0)
    assert more.fwd - base.fwd == pytest.approx((10 * k.fwd + 40 * k.syncs_fwd) * 1e-6, rel=1e-9)
    assert more.bwd - base.bwd == pytest.approx((10 * k.bwd + 40 * k.syncs_bwd) * 1e-6, rel=1e-9)
    assert more.host == pytest.approx(more.fwd + more.bwd - base.fwd - base.bwd, rel=1e-9)


def test_moe_layers_launch_more_kernels_than_dense_and_backward_more_than_forward():
    m = CAT.model("qwen3-30b-a3b")
    cfg = ParallelConfig(dp=8, ep=8)
    moe = layer_kernels(m, cfg, "moe", "alltoall", "bf16", "none")
    dense = layer_kernels(CAT.model("llama-2-7b"), ParallelConfig(dp=8), "dense", "alltoall", "bf16", "none")
    assert moe.fwd > 2 * dense.fwd
    assert moe.bwd > moe.fwd and dense.bwd > dense.fwd
    assert moe.syncs_fwd == 1 and dense.syncs_fwd == 0 and moe.syncs_bwd == 0
    # fewer local experts (more EP) -> fewer per-expert GEMM launches; full recompute re-runs the forward
    assert (
        layer_kernels(m, ParallelConfig(dp=8, ep=8), "moe", "alltoall", "bf16", "none").fwd
        > layer_kernels(m, ParallelConfig(dp=16, ep=16), "moe", "alltoall", "bf16", "none").fwd
    )
    full = layer_kernels(m, cfg, "moe", "alltoall", "bf16", "full")
    assert full.bwd == moe.bwd + moe.fwd and full.syncs_bwd == 1


def per_token(model: str, cluster: str, seq: int, mbs: int, gbs: int, dev_rt: dict | None = None, **kn) -> float:
    m, c = CAT.model(model), CAT.cluster(cluster)
    if dev_rt is not None:
        from hapmoe_milp.calibration.fidelity import with_devices

        (did,) = c.device_types
        c = with_devices(c, {did: with_rt(c.device(did), **dev_rt)})
    from hapmoe_milp.cost.estimate import estimate
    from hapmoe_milp.knobs import plan_from_knobs

    st = Settings(
        seq_length=seq, global_batch_size=gbs, micro_batch_size=mbs, dispatcher=kn.pop("dispatcher", "alltoall")
    )
    plan = plan_from_knobs(m, c, st, tp=kn.get("tp", 1), pp=kn.get("pp", 1), ep=kn.get("ep", 8), etp=1)
    return estimate(m, c, plan, st).iteration_time_s / (gbs * seq)


def test_more_micro_batches_of_fewer_tokens_cost_more_per_token():
    """The same tokens in micro-batches of 1 sample instead of 4: every layer pays its launches, syncs
    and dispatch latencies four times as often and its GEMMs run smaller."""
    a = per_token("qwen3-30b-a3b", "16xh100", 4096, 1, 256, ep=16)
    b = per_token("qwen3-30b-a3b", "16xh100", 4096, 4, 256, ep=16)
    assert a > b
    # and the gap is the runtime terms' doing: with them set to nothing it mostly closes
    zero = {"launch_us": 0.0, "sync_us": 0.0, "ep_latency_us": 0.0, "grouped_rows_half": 0.0}
    a0 = per_token("qwen3-30b-a3b", "16xh100", 4096, 1, 256, zero, ep=16)
    b0 = per_token("qwen3-30b-a3b", "16xh100", 4096, 4, 256, zero, ep=16)
    assert (a0 / b0) < (a / b)


def test_longer_sequences_amortise_per_micro_batch_costs_for_fine_grained_moe():
    """Qwen3-30B-A3B (128 experts of width 768) on 256 H100, same tokens per iteration: 16K-token
    micro-batches pay the per-micro-batch, per-layer host costs (launches, the router sync) a quarter as often
    as 4K ones, while their attention costs more per token. Which wins depends on that balance, so only the two
    effects are asserted (the total ordering once held only because the dense DP256 gradient sync was priced at
    one NIC and hid behind the longer last backward)."""
    from hapmoe_milp.calibration.fidelity import with_devices
    from hapmoe_milp.cost.estimate import estimate
    from hapmoe_milp.knobs import plan_from_knobs

    m, c = CAT.model("qwen3-30b-a3b"), CAT.cluster("256xh100")
    out: dict[tuple[int, float], dict[str, float]] = {}
    for call_us in (0.0, 300.0):
        cc = with_devices(c, {"h100": with_rt(c.device("h100"), call_us=call_us)})
        for seq, gbs in ((4096, 1024), (16384, 256)):
            st = Settings(seq_length=seq, global_batch_size=gbs, micro_batch_size=1, dispatcher="alltoall")
            plan = plan_from_knobs(m, cc, st, tp=1, pp=1, ep=8, etp=1)
            out[seq, call_us] = estimate(m, cc, plan, st).breakdown
    # launches and syncs: same kernels, 4x the passes
    assert out[4096, 0.0]["host"] / out[16384, 0.0]["host"] == pytest.approx(4.0, rel=0.02)
    # a host-CPU bound that binds on the short micro-batches and less (or not) on the long ones amortises more
    assert out[4096, 300.0]["host"] / out[16384, 300.0]["host"] > 4.0 * 1.02
    assert out[16384, 0.0]["compute"] > out[4096, 0.0]["compute"]  # attention grows with the key length


# ------------------------------------------------------------------ dispatch
def test_distinct_groups_matches_exact_enumeration():
    """E[distinct groups hit by k uniformly chosen experts], by enumerating every expert set."""
    for e, k, g in [(8, 2, 4), (16, 4, 4), (12, 3, 2), (6, 6, 3), (16, 2, 16)]:
        per = e // g
        sets = list(itertools.combinations(range(e), k))
        exact = sum(len({x // per for x in s}) for s in sets) / len(sets)
        assert distinct_groups(e, k, g) == pytest.approx(exact, rel=1e-12)


def test_flex_dispatch_moves_fewer_bytes_than_alltoall_across_nodes():
    m = CAT.model("qwen3-30b-a3b")
    c = CAT.cluster("16xh100")
    same = with_rt(
        c.device("h100"),
        flex_intra_GBps=c.device("h100").runtime.a2a_intra_GBps,
        flex_inter_GBps=c.device("h100").runtime.a2a_inter_GBps,
    )
    from hapmoe_milp.calibration.fidelity import with_devices

    c = with_devices(c, {"h100": same})
    cfg = ParallelConfig(dp=16, ep=16)
    a2a = CostModel(m, c, Settings(dispatcher="alltoall")).layer("h100", cfg, 1, "moe", "none").ep
    flex = CostModel(m, c, Settings(dispatcher="flex")).layer("h100", cfg, 1, "moe", "none").ep
    assert flex < a2a


# ------------------------------------------------------------------ overlap and sync
def test_dp_overlap_share_scales_what_the_gradient_sync_can_hide_behind():
    m, c = CAT.model("mixtral-8x7b"), CAT.cluster("64xh100")
    cfg = ParallelConfig(tp=2, dp=32, ep=8)
    for k in (0.0, 0.5, 1.0):
        from hapmoe_milp.calibration.fidelity import with_devices

        cc = with_devices(c, {"h100": with_rt(c.device("h100"), dp_overlap=k)})
        cm = CostModel(m, cc, Settings())
        lc = cm.layer("h100", cfg, 1, "moe", "none")
        got = cm.exposed_sync("h100", lc.rs, lc.ag, lc.fwd, lc.bwd, lc.opt)
        assert got == pytest.approx(max(0, lc.rs - k * lc.bwd) + max(0, lc.ag - k * lc.fwd) + lc.opt, rel=1e-12)


def test_p2p_exposed_share_scales_pipeline_transfers():
    m, c = CAT.model("mixtral-8x7b"), CAT.cluster("64xh100")
    from hapmoe_milp.calibration.fidelity import with_devices

    cfg = ParallelConfig(tp=2, dp=4, ep=8)
    full = CostModel(m, c, Settings()).p2p("h100", cfg, 1, "h100", 8)
    cc = with_devices(c, {"h100": with_rt(c.device("h100"), p2p_exposed=0.25)})
    assert CostModel(m, cc, Settings()).p2p("h100", cfg, 1, "h100", 8) == pytest.approx(0.25 * full, rel=1e-12)


# ------------------------------------------------------------------ the table section
@pytest.mark.parametrize("p", PARAMS, ids=lambda p: p.name)
def test_runtime_values_outside_their_physical_range_are_refused(p):
    for bad in (p.lo - abs(p.lo) * 0.5 - 1e-3, p.hi * 2 + 1):
        with pytest.raises(SpecError, match=p.name):
            runtime_from_fields(Fields({p.name: bad}, "dev.yaml", "runtime"))
    rt, unset = runtime_from_fields(Fields({p.name: p.lo}, "dev.yaml", "runtime"))
    assert getattr(rt, p.name) == p.lo and p.name not in unset


def test_shipped_tables_say_where_each_runtime_term_comes_from():
    assert H100.runtime_basis("flex_inter_GBps") == "derived"
    assert H100.runtime_basis("sync_us") == "assumed"
    assert H100.runtime_basis("launch_us") == "derived"
    assert CAT.device("h800").runtime_basis("flex_intra_GBps") == "source"
    assert not H100.runtime_defaulted  # every term written by tools/derive_device_tables.py
    assert math.isclose(H100.memory_bound_efficiency, H100.runtime.memory_efficiency)


def test_roofline_runtime_has_no_host_or_latency_terms():
    rt = RuntimeParams.roofline()
    assert rt.launch_us == rt.sync_us == rt.ep_latency_us == rt.grouped_rows_half == 0.0


@pytest.mark.parametrize("vpp", [1, 2, 4])
def test_interleaving_sends_every_micro_batch_across_each_boundary_once_per_chunk(vpp):
    """Megatron's interleaved schedule moves each micro-batch through every rank boundary vpp times, so a
    stage's outgoing transfers per micro-batch are vpp single transfers; the last stage sends none."""
    from hapmoe_milp.cost.estimate import estimate
    from hapmoe_milp.knobs import plan_from_knobs

    m, c = CAT.model("mixtral-8x7b"), CAT.cluster("64xh100")
    st = Settings(seq_length=4096, global_batch_size=256, micro_batch_size=1)
    plan = plan_from_knobs(m, c, st, tp=2, pp=4, ep=8, etp=1, vpp=vpp)
    est = estimate(m, c, plan, st)
    cm = CostModel(m, c, st)
    one = cm.p2p("h100", plan.stages[0].cfg, 1, "h100", plan.stages[1].devices)
    assert [t.p2p_out for t in est.totals] == pytest.approx([vpp * one] * 3 + [0.0], rel=1e-12)
    assert all(t.tau == pytest.approx(t.fwd + t.bwd + 2 * t.p2p_out, rel=1e-12) for t in est.totals)


# ------------------------------------------------------------------ FP8 recipes
def test_fp8_gemm_pays_the_fixed_cost_of_a_bf16_gemm_of_equal_duration():
    """The efficiency curve's fall at small sizes is a fixed time; an FP8 GEMM of F FLOPs takes as long as a
    BF16 GEMM of F * peak_bf16 / peak_fp8 FLOPs, divided by fp8_gemm_scale (compute-bound shapes)."""
    dev = with_rt(H100, fp8_gemm_scale=0.9)
    ratio = dev.peak("bf16") / dev.peak("fp8")
    for m in (2048, 8192, 65536):
        t8 = gemm_time(dev, m, 4096, 4096, "fp8")
        t16 = gemm_time(dev, m * ratio, 4096, 4096, "bf16")
        assert t8 == pytest.approx(t16 / 0.9, rel=1e-9)


@pytest.mark.parametrize("ep", [4, 16])
def test_per_tensor_fp8_launches_three_more_kernels_per_expert_gemm_each_way_than_block_scaling(ep):
    """Megatron's tensorwise recipe is TE current scaling: zero the amax, reduce it, compute the scale, cast
    (4 launches) per routed-expert input (forward) and output gradient (backward), one quantisation per
    expert and GEMM (fc1, fc2); block scaling: one fused cast (TE v2.12 quantizer.cpp / current_scaling.cu).
    So 3 more per expert GEMM each way. Dense layers and BF16 are untouched by the recipe."""
    m = CAT.model("qwen3-30b-a3b")
    cfg = ParallelConfig(tp=1, dp=ep, ep=ep, etp=1)
    local = m.num_experts // ep
    tw = layer_kernels(m, cfg, "moe", "flex", "fp8", "none", "tensorwise")
    mx = layer_kernels(m, cfg, "moe", "flex", "fp8", "none", "mxfp8")
    assert tw.fwd - mx.fwd == 3 * 2 * local and tw.bwd - mx.bwd == 3 * 2 * local
    bf = [layer_kernels(m, cfg, "moe", "flex", "bf16", "none", r) for r in ("tensorwise", "mxfp8")]
    assert bf[0] == bf[1]
    d = CAT.model("llama-3-8b")
    dense = [layer_kernels(d, ParallelConfig(), "dense", "alltoall", "fp8", "none", r) for r in ("tensorwise", "mxfp8")]
    assert dense[0] == dense[1]


def test_fp8_recipe_and_ep_overlap_are_estimate_knobs_that_change_moe_speed():
    def step(**kw) -> float:
        m, c = CAT.model("qwen3-30b-a3b"), CAT.cluster("16xh100")
        from hapmoe_milp.cost.estimate import estimate
        from hapmoe_milp.knobs import plan_from_knobs

        st = Settings(seq_length=4096, global_batch_size=256, dispatcher="flex", **kw)
        plan = plan_from_knobs(m, c, st, ep=16, etp=1)
        return estimate(m, c, plan, st).iteration_time_s

    assert step(precision="fp8", fp8_recipe="tensorwise") > step(precision="fp8", fp8_recipe="mxfp8")
    assert step(overlap_ep_comm=True) < step(overlap_ep_comm=False)


# ------------------------------------------------------------------ attention variants
@pytest.mark.parametrize(("window", "freq"), [(128, 2), (512, 0), (1024, 3)])
def test_sliding_window_layers_run_at_the_window_length_efficiency(window, freq):
    """Windowed layers do the FLOPs of their window (ModelSpec.attention_keys_factor) at the efficiency the
    device table gives a ``window``-token attention; full layers at the sequence's."""
    seq, n = 8192, 12
    m = replace(CAT.model("llama-2-7b"), num_layers=n, window_size=window, window_attn_skip_freq=freq)
    st = Settings(seq_length=seq, global_batch_size=8)
    cm = CostModel(m, CAT.cluster("8xh100"), st)
    from hapmoe_milp.cost.attention import core_time

    fwd, _ = core_time(m, H100, seq * cm._core_macs() * 2, seq)  # t = seq tokens, TP 1
    full_flops = seq * cm._core_macs() * 2 * seq  # t = seq tokens, keys = S (causal halving in _core_macs)
    n_full = n // freq if freq else 0
    total_flops = full_flops * m.attention_keys_factor(seq)
    win_flops = (total_flops * n - full_flops * n_full) / (n - n_full)
    peak = H100.peak("bf16") * 1e12
    eff = H100.attention_efficiency
    want = (n_full * full_flops / eff(seq) + (n - n_full) * win_flops / eff(window)) / n / peak
    assert fwd == pytest.approx(want, rel=1e-9)
    assert eff(window) < eff(seq)  # the physics the test is about: short key loops run below long ones


@pytest.mark.parametrize(("cp", "window"), [(1, 0), (2, 0), (4, 0), (8, 0), (2, 4096), (4, 512)])
def test_context_parallel_ring_steps_run_at_the_block_length_efficiency(cp, window):
    """Ring attention calls the kernel once per ring step on S/CP local queries against one S/CP key block,
    so the layer's FLOPs run at the device table's efficiency at min(kernel length, S/CP): 910B's table,
    whose 8K-32K points are cited measurements (bench/calibration/microbenchmarks.yaml, 910b-fa-fwd-*)."""
    seq, n = 32768, 4
    dev = CAT.device("910b")
    m = replace(CAT.model("llama-2-7b"), num_layers=n, window_size=window or None)
    cm = CostModel(m, CAT.cluster("8x910b"), Settings(seq_length=seq, global_batch_size=8))
    from hapmoe_milp.cost.attention import core_time

    per_key = seq * cm._core_macs() * 2  # t = seq tokens at TP 1
    fwd, bwd = core_time(m, dev, per_key, seq, cp=cp)
    length = min(window or seq, seq // cp)
    flops = per_key * seq * m.attention_keys_factor(seq)
    peak = dev.peak("bf16") * 1e12
    assert fwd == pytest.approx(flops / (dev.attention_efficiency(length) * peak), rel=1e-9)
    assert bwd == pytest.approx(2.5 * flops / (dev.attention_bwd_efficiency(length) * peak), rel=1e-9)


def test_stack_compute_scale_slows_layer_compute_but_not_the_kernels_micro_benchmarks_measure():
    """The training stack's share of micro-benchmarked kernel speed divides a layer's compute (and nothing
    else), while a GEMM priced alone -- what a micro-benchmark row checks -- is unchanged."""
    m = CAT.model("llama-3-8b")
    st = Settings(seq_length=4096, global_batch_size=8)
    cfg = ParallelConfig(tp=2, dp=4)
    c = CAT.cluster("8xh100")
    from hapmoe_milp.calibration.fidelity import with_devices

    slow = with_devices(c, {"h100": with_rt(H100, stack_compute_scale=0.8)})
    a = CostModel(m, c, st).layer("h100", cfg, 1, "dense", "none")
    b = CostModel(m, slow, st).layer("h100", cfg, 1, "dense", "none")
    assert b.compute == pytest.approx(a.compute / 0.8, rel=1e-12)
    assert b.tp == pytest.approx(a.tp, rel=1e-12) and b.host == pytest.approx(a.host, rel=1e-12)
    assert gemm_time(with_rt(H100, stack_compute_scale=0.8), 4096, 4096, 4096) == gemm_time(H100, 4096, 4096, 4096)
