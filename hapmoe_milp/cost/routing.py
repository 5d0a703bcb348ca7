"""Where a token's routed experts land: expected distinct destinations, with group-limited routing.

Experts are laid out contiguously: expert ``e`` lives on EP rank ``e // (E / EP)``, and Megatron's router
groups are contiguous blocks of ``E / G`` experts (``group_limited_topk`` views the scores as
``[tokens, G, E / G]``, megatron/core/transformer/moe/moe_utils.py at megatron-core 0.16.1). A token picks
``group_topk`` of the ``G`` groups, then its ``topk`` experts among the experts of those groups.

Under balanced routing (the planner's assumption everywhere: each choice uniform), the expected number of
distinct *destinations* (ranks, or nodes) a token's experts fall on is what a dispatcher that sends a token
once per destination (DeepEP / HybridEP, Megatron's ``flex``) moves. A dispatcher that sends one copy per
(token, expert) pair (``alltoall``) moves ``topk`` copies whatever the grouping: group-limited routing
cannot change its expected traffic, only bound the worst case.
"""

from __future__ import annotations

from math import comb

from hapmoe_milp.cost.primitives import distinct_groups


def _experts_per_chosen_group(per_group: int, topk: int, group_topk: int) -> dict[int, float]:
    """Distribution of how many of a token's ``topk`` experts fall in one of its chosen groups.

    A group is chosen for the sum of its best ``topk / group_topk`` scores, so each chosen group holds at
    least one of the token's top-k experts (a simulation of Megatron's rule on i.i.d. scores gives 0.99 of
    the chosen groups hit); we take one each and spread the other ``topk - group_topk`` uniformly over the
    chosen groups' remaining experts (hypergeometric)."""
    pool, draws, mine = group_topk * (per_group - 1), topk - group_topk, per_group - 1
    return {
        1 + x: comb(mine, x) * comb(pool - mine, draws - x) / comb(pool, draws)
        for x in range(0, min(draws, mine) + 1)
        if draws - x <= pool - mine
    }


def distinct_destinations(experts: int, topk: int, units: int, groups: int | None, group_topk: int | None) -> float:
    """Expected distinct units (ranks or nodes, ``units`` dividing the experts evenly) that receive at least
    one of a token's ``topk`` experts.

    Without groups it is :func:`distinct_groups`. With ``groups`` G and ``group_topk`` g:

    - G a multiple of ``units`` (each unit holds c = G/units whole groups; DeepSeek-V3's node-limited case
      when G = nodes): every chosen group is hit, and the g chosen groups are a uniform g-subset of G, so a
      unit is hit unless none of its c groups is chosen: ``units * (1 - C(G-c, g) / C(G, g))``;
    - ``units`` a multiple of G (each group spans s = units/G units of m/s experts): a chosen group with n of
      the token's experts (:func:`_experts_per_chosen_group`) misses a given one of its units with
      probability ``C(m - m/s, n) / C(m, n)``;
    - otherwise (groups straddle units) the ungrouped value, an upper bound.

    tests/test_cost_routing.py checks these against a simulation of Megatron's selection.
    """
    if units <= 1:
        return 1.0
    if not groups or not group_topk or groups <= 1 or group_topk >= groups or topk < group_topk:
        return distinct_groups(experts, topk, units)
    G, g = groups, group_topk
    m = experts // G
    if G % units == 0:
        c = G // units
        return units * (1.0 - comb(G - c, g) / comb(G, g))
    if units % G == 0:
        s = units // G
        per_unit = m // s
        dist = _experts_per_chosen_group(m, topk, g)
        miss = sum(p * comb(m - per_unit, n) / comb(m, n) for n, p in dist.items())
        return g * s * (1.0 - miss)
    return distinct_groups(experts, topk, units)
