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


def _p_none(pool: int, hit: int, k: int) -> float:
    """Probability that ``k`` distinct experts drawn uniformly from ``pool`` miss ``hit`` given ones."""
    if pool - hit < k:
        return 0.0
    return comb(pool - hit, k) / comb(pool, k)


def distinct_destinations(experts: int, topk: int, units: int, groups: int | None, group_topk: int | None) -> float:
    """Expected distinct units (ranks or nodes, ``units`` dividing the experts evenly) that receive at least
    one of a token's ``topk`` experts.

    Without groups it is :func:`distinct_groups`. With ``groups`` G and ``group_topk`` g:

    - G a multiple of ``units`` (each unit holds c = G/units whole groups, DeepSeek-V3's node-limited case
      when G = nodes): the chosen groups are a uniform g-subset of G, a unit holds j of them with
      hypergeometric probability ``C(c, j) C(G-c, g-j) / C(G, g)``, and with j chosen groups it is hit unless
      all ``topk`` experts fall in the other ``g - j`` chosen groups;
    - ``units`` a multiple of G (each group spans s = units/G units): the token's experts are uniform over
      the g chosen groups' ``g*s`` units, so :func:`distinct_groups` on those;
    - otherwise (groups straddle units) the ungrouped value, an upper bound.
    """
    if units <= 1:
        return 1.0
    if not groups or not group_topk or groups <= 1 or group_topk >= groups:
        return distinct_groups(experts, topk, units)
    G, g = groups, group_topk
    per_group = experts // G
    if G % units == 0:
        c = G // units
        total = 0.0
        for j in range(1, min(c, g) + 1):
            p_j = comb(c, j) * comb(G - c, g - j) / comb(G, g)
            total += p_j * (1.0 - _p_none(g * per_group, j * per_group, topk))
        return units * total
    if units % G == 0:
        s = units // G
        return distinct_groups(g * per_group, topk, g * s)
    return distinct_groups(experts, topk, units)
