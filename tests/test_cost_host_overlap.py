"""EP-communication overlap hides the forward launch idle of a MoE layer behind the other micro-batch's
backward (Megatron's interleaved 1F1B layer schedule issues that backward's expert GEMMs before the
forward's dropless sync, so the device does not drain there). Expected values are closed forms of that
structure: ``share x min(forward launch idle, backward computation)``, with the share the schedule's own
(``flex_overlap`` for the flex dispatcher, ``ep_overlap`` otherwise), and nothing without overlap.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from hapmoe_milp.calibration.fidelity import with_devices
from hapmoe_milp.config import ParallelConfig, Settings
from hapmoe_milp.cost.kernels import layer_kernels
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.cost.primitives import ep_overlap_host_hidden
from hapmoe_milp.specs import Catalog

CAT = Catalog(use_calibrated=False)


def with_rt(dev, **kw):
    return replace(dev, runtime=replace(dev.runtime, **kw))


@pytest.mark.parametrize(
    ("dispatcher", "host", "bwd", "want"),
    [
        ("flex", 2.0e-3, 5.0e-3, 0.6 * 2.0e-3),  # the backward outlasts the idle: a share of all of it
        ("flex", 2.0e-3, 1.0e-3, 0.6 * 1.0e-3),  # the backward is shorter: only as much as it lasts
        ("alltoall", 2.0e-3, 5.0e-3, 0.3 * 2.0e-3),  # the all-to-all dispatcher's own share
        ("alltoall", 0.0, 5.0e-3, 0.0),
        ("flex", 2.0e-3, 0.0, 0.0),
    ],
)
def test_hidden_idle_is_the_schedule_share_of_the_shorter_of_idle_and_backward(dispatcher, host, bwd, want):
    dev = with_rt(CAT.device("h100"), flex_overlap=0.6, ep_overlap=0.3)
    assert ep_overlap_host_hidden(dev, dispatcher, host, bwd) == pytest.approx(want, rel=1e-12)


def _layer(m, cluster, cfg, dispatcher, overlap, launch_us, share):
    dev = with_rt(
        cluster.device("h100"), launch_us=launch_us, sync_us=0.0, call_us=0.0, flex_overlap=share, ep_overlap=share
    )
    cc = with_devices(cluster, {"h100": dev})
    st = Settings(dispatcher=dispatcher, overlap_ep_comm=overlap, seq_length=4096, micro_batch_size=1)
    return CostModel(m, cc, st).layer("h100", cfg, 1, "moe", "none")


@pytest.mark.parametrize("dispatcher", ["alltoall", "flex"])
@pytest.mark.parametrize("share", [0.25, 0.75])
def test_overlap_removes_that_share_of_the_forward_launch_idle_of_a_moe_layer(dispatcher, share):
    """Qwen3-30B-A3B at EP16, MBS 1, 4K tokens: the forward launch idle (kernels x launch_us) is far
    shorter than the backward's computation, so overlap removes exactly ``share`` of it; the backward's
    own idle stays (the forward it runs beside is not launch-bound behind a sync). The host-CPU bound is
    off (``call_us`` 0) so only the launch terms move (tests/test_cost_host_bound.py prices it)."""
    m = CAT.model("qwen3-30b-a3b")
    c = CAT.cluster("16xh100")
    cfg = ParallelConfig(dp=16, ep=16, etp=1)
    k = layer_kernels(m, cfg, "moe", dispatcher, "bf16", "none")
    launch = 12.0
    off0, off = (_layer(m, c, cfg, dispatcher, False, x, share) for x in (0.0, launch))
    on0, on = (_layer(m, c, cfg, dispatcher, True, x, share) for x in (0.0, launch))
    host_f, host_b = k.fwd * launch * 1e-6, k.bwd * launch * 1e-6
    assert off.host == pytest.approx(host_f + host_b, rel=1e-9)
    assert on.host == pytest.approx((1 - share) * host_f + host_b, rel=1e-9)
    # the launch terms are all that moved: with launch_us 0 both settings price the same host (nothing)
    assert on0.host == off0.host == 0.0
    assert on.fwd - on0.fwd == pytest.approx((1 - share) * host_f, rel=1e-9)
    assert on.bwd - on0.bwd == pytest.approx(host_b, rel=1e-9)


def test_dense_layers_and_runs_without_overlap_keep_their_launch_idle():
    m = CAT.model("llama-3-8b")
    c = CAT.cluster("8xh100")
    cfg = ParallelConfig(dp=8)
    dev = with_rt(c.device("h100"), launch_us=12.0, sync_us=0.0, call_us=0.0)
    cc = with_devices(c, {"h100": dev})
    k = layer_kernels(m, cfg, "dense", "alltoall", "bf16", "none")
    for overlap in (False, True):
        st = Settings(overlap_ep_comm=overlap, seq_length=4096, micro_batch_size=1)
        lay = CostModel(m, cc, st).layer("h100", cfg, 1, "dense", "none")
        assert lay.host == pytest.approx((k.fwd + k.bwd) * 12.0e-6, rel=1e-9)
