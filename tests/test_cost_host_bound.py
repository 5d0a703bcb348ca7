"""The host-CPU bound: a span of a layer lasts at least as long as the host takes to make its calls.

Expected values are closed forms of that structure: ``max(0, calls x call_us - device timeline)``, with the
calls counted from the layer structure documented in ``hapmoe_milp.cost.kernels`` (one per structural
kernel; FP8 casts and collectives add kernels but no calls; captured parts add none), and the device
timeline the layer's own price with the bound switched off (``call_us`` 0).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import pytest

from hapmoe_milp.calibration.fidelity import with_devices
from hapmoe_milp.config import ParallelConfig, Settings
from hapmoe_milp.cost.kernels import layer_kernels
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.cost.primitives import host_bound_excess
from hapmoe_milp.specs import Catalog

CAT = Catalog(use_calibrated=False)
QWEN = CAT.model("qwen3-30b-a3b")  # GQA attention with QK norm, 128 experts, no shared expert
CFG = ParallelConfig(dp=8, ep=8)  # 16 local experts


def with_rt(dev, **kw):
    return replace(dev, runtime=replace(dev.runtime, **kw))


@pytest.mark.parametrize(
    ("calls", "call_us", "device_s", "want"),
    [
        (100, 80.0, 5.0e-3, 3.0e-3),  # the host needs 8 ms for what the device runs in 5: 3 ms idle
        (100, 80.0, 8.0e-3, 0.0),  # exactly balanced
        (100, 80.0, 20.0e-3, 0.0),  # the device is the bottleneck: the host hides entirely
        (0, 80.0, 1.0e-3, 0.0),  # everything captured
    ],
)
def test_excess_is_the_host_time_beyond_the_device_timeline(calls, call_us, device_s, want):
    dev = with_rt(CAT.device("h100"), call_us=call_us)
    assert host_bound_excess(dev, calls, device_s) == pytest.approx(want, abs=1e-15)


@pytest.mark.parametrize(
    ("scope", "precision", "calls"),
    [
        # attention 7 + QK norm 2, router 7, preprocess 5, the rest of the MoE block 8 + 2 per local expert
        ("none", "bf16", 7 + 2 + 20 + 2 * 16),
        ("none", "fp8", 7 + 2 + 20 + 2 * 16),  # FP8 casts are issued inside the calls they serve
        ("attn", "bf16", 20 + 2 * 16),
        ("moe_router,moe_preprocess", "bf16", 7 + 2 + 8 + 2 * 16),
        ("layer", "bf16", 0),
    ],
)
def test_calls_follow_the_layer_structure_and_the_graphed_parts(scope, precision, calls):
    k = layer_kernels(QWEN, CFG, "moe", "alltoall", precision, "none", "tensorwise", scope)
    assert k.calls_fwd == calls
    assert k.calls_bwd == calls  # one call back per forward call
    full = layer_kernels(QWEN, CFG, "moe", "alltoall", precision, "full", "tensorwise", scope)
    assert full.calls_bwd == 2 * calls  # full recompute repeats the forward's calls


def _layer(call_us, st, b=1):
    c = CAT.cluster("8xh100")
    dev = with_rt(c.device("h100"), call_us=call_us)
    return CostModel(QWEN, with_devices(c, {"h100": dev}), st).layer("h100", CFG, b, "moe", "none")


@pytest.mark.parametrize("call_us", [20.0, 80.0, 300.0])
def test_a_layer_lasts_at_least_as_long_as_its_calls(call_us):
    st = Settings(dispatcher="alltoall", seq_length=4096, micro_batch_size=1)
    k = layer_kernels(QWEN, CFG, "moe", "alltoall", "bf16", "none")
    free = _layer(0.0, st)  # the device timeline: work, exposed communication, launch idle and the sync
    lay = _layer(call_us, st)
    assert lay.fwd == pytest.approx(max(free.fwd, k.calls_fwd * call_us * 1e-6), rel=1e-9)
    assert lay.bwd == pytest.approx(max(free.bwd, k.calls_bwd * call_us * 1e-6), rel=1e-9)
    assert lay.host - free.host == pytest.approx((lay.fwd - free.fwd) + (lay.bwd - free.bwd), rel=1e-9)


def test_longer_micro_batches_hide_the_host():
    """The calls do not grow with the micro-batch, the device work does: at some size the host stops binding."""
    st = Settings(dispatcher="alltoall", seq_length=4096, micro_batch_size=1)
    call_us = 150.0
    excess = [_layer(call_us, st, b).fwd - _layer(0.0, st, b).fwd for b in (1, 2, 4, 8, 16)]
    assert excess[0] > 0.0
    assert all(a >= b for a, b in pairwise(excess))
    assert excess[-1] == 0.0


def test_under_ep_overlap_the_forward_and_the_other_backward_pool_their_calls():
    """Megatron's EP-overlap schedule issues one micro-batch's forward layer and another's backward layer as
    one span, so the bound is on their sum, shared between the two by calls."""
    st = Settings(dispatcher="alltoall", overlap_ep_comm=True, seq_length=4096, micro_batch_size=1)
    k = layer_kernels(QWEN, CFG, "moe", "alltoall", "bf16", "none")
    call_us = 300.0
    free, lay = _layer(0.0, st), _layer(call_us, st)
    calls = k.calls_fwd + k.calls_bwd
    excess = max(0.0, calls * call_us * 1e-6 - (free.fwd + free.bwd))
    assert excess > 0.0
    assert lay.fwd + lay.bwd == pytest.approx(free.fwd + free.bwd + excess, rel=1e-9)
    assert lay.fwd - free.fwd == pytest.approx(excess * k.calls_fwd / calls, rel=1e-9)
