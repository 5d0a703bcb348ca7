"""Ring collectives across nodes in the cost model: a group's NICs add up (hapmoe_milp/cost/primitives.py
``rail_busbw``, wired in ``CostModel.collective``).

Expected values are restated from the B200 table's derivation formula written in its header
(clusters/devices/b200.yaml: busbw(S) = B*S / (S + alpha*B*1e9), alpha = 20 us; reduce-scatter B = 765 GB/s in a
node, 46.5 GB/s per 400 Gb/s NIC across nodes), not read back from the code.
"""

from __future__ import annotations

import pytest

from hapmoe_milp.config import ParallelConfig, Settings
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.specs import Catalog

CAT = Catalog(use_calibrated=False)


def busbw(b_GBps: float, nbytes: float, alpha_s: float = 20e-6) -> float:
    return b_GBps * nbytes / (nbytes + alpha_s * b_GBps * 1e9)


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel(CAT.model("llama-3-8b"), CAT.cluster("16xb200"), Settings())


def test_dp16_over_two_nodes_runs_on_eight_nics_capped_by_nvlink(cm):
    """TP1 DP16 on 2 nodes: 8 members per node, each ring channel leaves the node by its own NIC."""
    size = 1e9
    bw = min(8 * busbw(46.5, size / 8), busbw(765.0, size))
    expected = 15 / 16 * size / (bw * 1e9)
    got = cm.collective(cm.device("b200"), "b200", "reduce_scatter", size, 16, 16)
    assert got == pytest.approx(expected, rel=0.01)


def test_dp2_of_tp8_has_one_member_per_node_and_one_nic(cm):
    size = 1e9
    expected = 1 / 2 * size / (busbw(46.5, size) * 1e9)
    got = cm.collective(cm.device("b200"), "b200", "reduce_scatter", size, 2, 16)
    assert got == pytest.approx(expected, rel=0.01)


def test_dp_sync_of_a_cross_node_stage_falls_with_the_members_per_node(cm):
    """The same parameters synced by DP16 (8 per node) and by DP2 under TP8 (1 per node): per byte the first
    moves ~8x faster (the whole group's reduce-scatter and all-gather, Megatron's distributed optimizer)."""
    p = 1e9
    _, rs16, ag16, _ = cm.state_and_sync(cm.device("b200"), "b200", ParallelConfig(tp=1, dp=16), p, 0.0)
    _, rs2, ag2, _ = cm.state_and_sync(cm.device("b200"), "b200", ParallelConfig(tp=8, dp=2), p, 0.0)
    per_byte16 = (rs16 + ag16) / (15 / 16)
    per_byte2 = (rs2 + ag2) / (1 / 2)
    assert 6.0 < per_byte2 / per_byte16 < 8.5
