"""Plan evaluation (hapmoe_milp/cost/estimate.py): metric relations, memory reporting, breakdown, simulation.

Relations checked (design.md §5): tokens/s = GBS*S / T; MFU = Megatron model FLOPs / (T * sum of the used
devices' dense BF16 peaks); model TFLOP/s per device = FLOPs / T / devices; T = sum(tau) + (M-1) max(tau)
+ the slowest stage's exposed DP sync and optimizer step.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from hapmoe_milp import api
from hapmoe_milp.config import ParallelConfig, Settings
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.cost.primitives import GIB
from hapmoe_milp.plan import Plan, Stage, check_plan
from hapmoe_milp.specs import Catalog, ClusterSpec, NodeGroup
from tests.helpers import synthetic_device, tiny_moe

S = 4096
BREAKDOWN_KEYS = {"compute", "host", "tp", "cp", "ep", "pp_p2p", "dp_sync", "optimizer", "bubble"}


def two_type_cluster(mem_a: float = 1e6, mem_b: float = 1e6) -> ClusterSpec:
    a = synthetic_device(memory_gib=mem_a, mem_GBps=1000.0)
    b = replace(synthetic_device(memory_gib=mem_b, mem_GBps=800.0), id="slow", peak_tflops={"bf16": 40.0})
    return ClusterSpec(name="a+b", groups=(NodeGroup(a, 1, 8), NodeGroup(b, 1, 8)))


def plan(stages, gbs=32, mbs=1, vpp=1) -> Plan:
    return Plan("tiny-moe", "a+b", "hetero", tuple(stages), gbs, S, mbs, vpp=vpp)


def two_stage_plan(rec="none", gbs=32) -> Plan:
    c = ParallelConfig(tp=2, dp=4, ep=4)
    return plan([Stage("syn", c, 0, 5, rec), Stage("slow", c, 5, 8, rec)], gbs=gbs)


MODEL = tiny_moe()


def test_plan_is_valid_for_the_tests():
    check_plan(two_stage_plan(), MODEL, two_type_cluster())


def test_metric_relations():
    cl = two_type_cluster()
    p = two_stage_plan()
    e = estimate(MODEL, cl, p, Settings(seq_length=S))
    T = e.iteration_time_s
    tokens = 32 * S
    flops = MODEL.flops_per_token(S) * tokens
    assert e.tokens_per_s == pytest.approx(tokens / T, rel=1e-12)
    assert e.tokens_per_s_per_device == pytest.approx(tokens / T / 16, rel=1e-12)
    assert e.devices == 16
    assert e.model_tflops_per_device == pytest.approx(flops / T / 16 / 1e12, rel=1e-12)
    # dense BF16 peaks of the devices each stage uses: 8 x 100 + 8 x 40 TFLOP/s
    assert e.mfu == pytest.approx(flops / (T * (8 * 100 + 8 * 40) * 1e12), rel=1e-12)


def test_iteration_time_is_the_closed_form_over_reported_stages():
    e = estimate(MODEL, two_type_cluster(), two_stage_plan(), Settings(seq_length=S))
    M = 32 // 4
    taus = [s["stage_time_s"] for s in e.stages]
    for s in e.stages:
        assert s["stage_time_s"] == pytest.approx(s["forward_s"] + s["backward_s"] + 2 * s["p2p_out_s"], rel=1e-12)
    assert e.stages[-1]["p2p_out_s"] == 0.0 and e.stages[0]["p2p_out_s"] > 0.0
    sync = max(s["sync_exposed_s"] for s in e.stages)
    assert e.iteration_time_s == pytest.approx(sum(taus) + (M - 1) * max(taus) + sync, rel=1e-12)
    assert e.sync_s == sync
    assert [s["bottleneck"] for s in e.stages].count(True) == 1
    assert e.stages[taus.index(max(taus))]["bottleneck"]


def test_breakdown_keys_and_that_it_adds_up_to_the_iteration():
    e = estimate(MODEL, two_type_cluster(), two_stage_plan(), Settings(seq_length=S))
    bd = e.breakdown
    assert set(bd) == BREAKDOWN_KEYS
    assert all(v >= 0 for v in bd.values())
    assert sum(bd.values()) == pytest.approx(e.iteration_time_s, rel=1e-12)
    taus = [s["stage_time_s"] for s in e.stages]
    M = 8
    busy = bd["compute"] + bd["tp"] + bd["cp"] + bd["ep"] + bd["pp_p2p"]
    assert busy == pytest.approx(M * max(taus), rel=1e-12)  # the bottleneck stage's M micro-batches
    assert bd["bubble"] == pytest.approx(sum(taus) - max(taus), rel=1e-9)  # 1F1B fill/drain
    assert bd["tp"] > 0 and bd["ep"] > 0 and bd["cp"] == 0.0


def test_sync_exposure_with_and_without_overlap():
    cl, p = two_type_cluster(), two_stage_plan()
    over = estimate(MODEL, cl, p, Settings(seq_length=S))
    flat = estimate(MODEL, cl, p, Settings(seq_length=S, overlap_grad_reduce=False, overlap_param_gather=False))
    for a, b, t in zip(over.stages, flat.stages, flat.totals, strict=True):
        assert b["sync_exposed_s"] == pytest.approx(t.rs + t.ag + t.opt, rel=1e-12)
        hidden = max(0.0, t.rs - t.bwd) + max(0.0, t.ag - t.fwd) + t.opt
        assert a["sync_exposed_s"] == pytest.approx(hidden, rel=1e-12)
    assert flat.iteration_time_s >= over.iteration_time_s


def test_memory_reporting_fits_and_worst_stage():
    roomy = estimate(MODEL, two_type_cluster(), two_stage_plan(), Settings(seq_length=S))
    assert roomy.fits and roomy.worst_memory() is None
    need = [s["memory_gib"] for s in roomy.stages]
    for s, t in zip(roomy.stages, roomy.totals, strict=True):
        assert s["memory_gib"] == pytest.approx(t.memory / GIB, rel=1e-12)
        assert t.memory > t.weights + t.activations  # plus working set and framework overhead
    # capacities just below each stage's need (5 % headroom): both overflow, the second by more
    cap_a, cap_b = (need[0] - 0.1) / 0.95, (need[1] - 1.0) / 0.95
    tight = estimate(
        MODEL, two_type_cluster(cap_a, cap_b), two_stage_plan(), Settings(seq_length=S, memory_headroom=0.05)
    )
    assert not tight.fits
    assert tight.stages[0]["capacity_gib"] == pytest.approx(need[0] - 0.1, rel=1e-9)
    worst = tight.worst_memory()
    assert worst is not None and worst["index"] == 1
    assert worst["memory_gib"] - worst["capacity_gib"] == pytest.approx(1.0, rel=1e-6)
    # the timings do not depend on the capacity
    assert tight.iteration_time_s == roomy.iteration_time_s


def test_full_recompute_trades_time_for_memory():
    cl = two_type_cluster()
    none = estimate(MODEL, cl, two_stage_plan("none"), Settings(seq_length=S))
    full = estimate(MODEL, cl, two_stage_plan("full"), Settings(seq_length=S))
    assert full.iteration_time_s > none.iteration_time_s
    for a, b in zip(none.stages, full.stages, strict=True):
        assert b["activations_gib"] < a["activations_gib"] / 5
        assert b["weights_gib"] == a["weights_gib"]


def test_simulate_flag_reports_the_simulated_schedule_and_keeps_the_closed_form():
    cl, p = two_type_cluster(), two_stage_plan()
    cf = estimate(MODEL, cl, p, Settings(seq_length=S))
    sim = estimate(MODEL, cl, p, Settings(seq_length=S), simulate_schedule=True)
    assert sim.simulated and not cf.simulated
    assert sim.closed_form_s == pytest.approx(cf.iteration_time_s, rel=1e-12)
    assert cf.closed_form_s == cf.iteration_time_s
    assert sim.iteration_time_s <= cf.iteration_time_s * (1 + 1e-12)  # 1F1B: the closed form is an upper bound
    assert sim.tokens_per_s == pytest.approx(32 * S / sim.iteration_time_s, rel=1e-12)
    d = sim.to_dict()
    assert d["simulated"] is True and d["iteration_time_s"] == sim.iteration_time_s
    assert {"tokens_per_s", "mfu", "fits", "stages", "breakdown", "closed_form_s"} <= set(d)


def test_single_stage_simulation_equals_closed_form():
    c = ParallelConfig(tp=2, dp=4, ep=4)
    p = plan([Stage("syn", c, 0, 8)])
    cl = two_type_cluster()
    a = estimate(MODEL, cl, p, Settings(seq_length=S))
    b = estimate(MODEL, cl, p, Settings(seq_length=S), simulate_schedule=True)
    assert b.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-12)
    assert a.breakdown["bubble"] == pytest.approx(0.0, abs=1e-12)


def test_interleaved_plan_divides_the_bubble():
    c = ParallelConfig(tp=2, dp=4, ep=4)
    stages = [Stage("syn", c, 0, 4), Stage("slow", c, 4, 8)]
    one = estimate(MODEL, two_type_cluster(), plan(stages), Settings(seq_length=S))
    two = estimate(MODEL, two_type_cluster(), plan(stages, vpp=2), Settings(seq_length=S))
    taus = [s["stage_time_s"] for s in one.stages]
    M = 8
    assert one.pipeline_s == pytest.approx(sum(taus) + (M - 1) * max(taus), rel=1e-12)
    # interleaved: each micro-batch crosses the boundary once per chunk, so stage 0 sends twice
    taus2 = [taus[0] + 2 * one.totals[0].p2p_out, taus[1]]
    assert [s["stage_time_s"] for s in two.stages] == pytest.approx(taus2, rel=1e-12)
    assert two.pipeline_s == pytest.approx(sum(taus2) / 2 + (M - 0.5) * max(taus2), rel=1e-12)


def test_catalog_plan_through_the_api():
    """Mixtral-S on HAPMoE's 16-1 (8 H800 + 8 910B): one stage per type, a cross-type boundary."""
    cat = Catalog()
    c = ParallelConfig(tp=2, dp=4, ep=4)
    p = Plan(
        "mixtral-s",
        "16-1",
        "megatron",
        (Stage("h800", c, 0, 14, "selective"), Stage("910b", c, 14, 24, "selective")),
        256,
        4096,
        1,
    )
    e = api.estimate_plan("mixtral-s", "16-1", p, catalog=cat)
    m = cat.model("mixtral-s")
    peak = 8 * 989.4 + 8 * 353.9
    assert e.mfu == pytest.approx(m.flops_per_token(4096) * 256 * 4096 / (e.iteration_time_s * peak * 1e12), rel=1e-9)
    assert 0.05 < e.mfu < 0.8
    assert e.stages[0]["p2p_out_s"] > 0
