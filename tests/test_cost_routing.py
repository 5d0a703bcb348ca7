"""Group-limited routing (DeepSeek's n_group / topk_group, Megatron's moe_router_num_groups / group_topk).

Closed forms and a simulation of Megatron's own selection rule are the oracles; the cost model's expert
all-to-all must move with them exactly as the topology says.
"""

from __future__ import annotations

from dataclasses import replace
from math import comb

import numpy as np
import pytest

from hapmoe_milp.config import ParallelConfig, Settings
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.cost.routing import distinct_destinations
from hapmoe_milp.specs import Catalog

CAT = Catalog()
DSV3 = CAT.model("deepseek-v3")
H100_64 = CAT.cluster("64-h100")  # 8 nodes of 8 H100


def megatron_group_limited_destinations(
    experts: int, topk: int, units: int, groups: int, group_topk: int, tokens: int = 20000, seed: int = 0
) -> float:
    """Mean distinct units hit, simulating Megatron's group_limited_topk (moe_utils.py, megatron-core
    0.16.1) on i.i.d. scores: group score = sum of its top (topk / group_topk) scores, the best group_topk
    groups are kept, then the topk experts among them. Experts sit on units contiguously."""
    rng = np.random.default_rng(seed)
    scores = rng.random((tokens, experts))
    per_group = scores.reshape(tokens, groups, experts // groups)
    top_in_group = np.sort(per_group, axis=-1)[..., -(topk // group_topk) :].sum(-1)
    keep = np.argsort(-top_in_group, axis=-1)[:, :group_topk]
    mask = np.zeros((tokens, groups), dtype=bool)
    np.put_along_axis(mask, keep, True, axis=-1)
    masked = np.where(np.repeat(mask, experts // groups, axis=-1), scores, -1.0)
    chosen = np.argsort(-masked, axis=-1)[:, :topk]
    unit = chosen // (experts // units)
    return float(np.mean([len(set(row)) for row in unit]))


def closed_form_groups_per_unit(groups: int, group_topk: int, units: int) -> float:
    """Units holding whole groups: every chosen group receives an expert (it was chosen for its best
    scores), so a unit is reached iff one of its groups is among the group_topk chosen."""
    c = groups // units
    return units * (1 - comb(groups - c, group_topk) / comb(groups, group_topk))


def test_ungrouped_is_the_usual_expectation() -> None:
    want = 8 * (1 - comb(224, 8) / comb(256, 8))  # 256 experts on 8 units, 8 routed
    assert distinct_destinations(256, 8, 8, None, None) == pytest.approx(want)


@pytest.mark.parametrize(
    ("units", "groups", "gk"), [(8, 8, 4), (4, 8, 4), (2, 8, 4), (16, 8, 4), (32, 8, 4), (64, 8, 4), (8, 8, 3)]
)
def test_matches_megatron_selection_simulated(units: int, groups: int, gk: int) -> None:
    ours = distinct_destinations(256, 8, units, groups, gk)
    sim = megatron_group_limited_destinations(256, 8, units, groups, gk)
    assert ours == pytest.approx(sim, rel=0.02)
    assert ours <= min(units, gk * max(1, units // groups)) + 1e-9  # never more units than the groups span


def test_deepseek_v3_node_limited_closed_form() -> None:
    """DeepSeek-V3: 256 experts, top-8, 8 groups, top-4 groups; with one group per node a token reaches at
    most 4 nodes."""
    got = distinct_destinations(256, 8, 8, 8, 4)
    assert got == pytest.approx(closed_form_groups_per_unit(8, 4, 8)) == pytest.approx(4.0)
    assert distinct_destinations(256, 8, 8, None, None) == pytest.approx(8 * (1 - comb(224, 8) / comb(256, 8)))
    # on 4 nodes (2 groups per node) a token reaches 4 * (1 - C(6,4)/C(8,4)) = 22/7 nodes
    assert distinct_destinations(256, 8, 4, 8, 4) == pytest.approx(22 / 7)


def _ep_time(model, dispatcher: str, ep: int) -> float:
    """Per-layer expert all-to-all seconds (dispatch + combine, forward and backward) on one rank."""
    cm = CostModel(model, H100_64, Settings(seq_length=4096, dispatcher=dispatcher))
    cfg = ParallelConfig(tp=1, dp=64 // ep, ep=ep) if ep <= 64 else ParallelConfig(ep=ep)
    return cm.layer("h100", cfg, 1, "moe", "none").ep


def test_deepseek_v3_flex_all_to_all_scales_with_distinct_nodes() -> None:
    """Flex dispatcher (one copy per destination node), EP 64 over 8 nodes: the network part of the
    all-to-all is (nodes-1)/nodes x distinct nodes x token bytes, and it dominates the in-node part, so the
    layer's all-to-all (4 transfers, each latency + network time) scales by the ratio of distinct nodes."""
    ungrouped = replace(DSV3, moe_router_num_groups=None, moe_router_group_topk=None)
    dev = H100_64.device("h100")
    rt = dev.runtime
    tok = 4096 * DSV3.hidden_size * 2  # one micro-batch's tokens per rank (tp = cp = 1), bf16
    d_nodes_g = closed_form_groups_per_unit(8, 4, 8)
    d_nodes_u = 8 * (1 - comb(224, 8) / comb(256, 8))
    d_ranks_u = 64 * (1 - comb(252, 8) / comb(256, 8))
    # the network transfer is the slower of the two in both cases (so the max() picks it)
    for d_nodes in (d_nodes_g, d_nodes_u):
        t_out = 7 / 8 * d_nodes * tok / (rt.flex_inter_GBps * 1e9)
        t_in = d_ranks_u * tok / (rt.flex_intra_GBps * 1e9)
        assert t_out > t_in
    lat = rt.ep_latency_us * 1e-6
    g, u = _ep_time(DSV3, "flex", 64), _ep_time(ungrouped, "flex", 64)
    assert (g / 4 - lat) / (u / 4 - lat) == pytest.approx(d_nodes_g / d_nodes_u, rel=1e-9)
    assert (g / 4 - lat) == pytest.approx(7 / 8 * d_nodes_g * tok / (rt.flex_inter_GBps * 1e9), rel=1e-9)


def test_grouping_does_not_change_what_the_topology_does_not_constrain() -> None:
    ungrouped = replace(DSV3, moe_router_num_groups=None, moe_router_group_topk=None)
    # alltoall sends one copy per (token, expert) pair: k copies whatever the grouping
    assert _ep_time(DSV3, "alltoall", 64) == _ep_time(ungrouped, "alltoall", 64)
    # EP inside one node: no network traffic; the in-node part changes with the distinct ranks
    assert _ep_time(DSV3, "flex", 8) < _ep_time(ungrouped, "flex", 8)
