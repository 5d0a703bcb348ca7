"""Prove that no plan fits before any stage option is priced, from the memory floor (``cost/floor.py``).

Two necessary conditions of every plan, cheapest first; when one fails, nothing in the space fits:

1. **Whole cluster** (:func:`hapmoe_milp.cost.floor.memory_floor`): the model state of every parameter,
   summed over the devices holding it, fits the cluster's total budget.
2. **Stages**: each stage of ``g`` devices of type ``h`` holds a contiguous range of layers whose
   per-device floors (:func:`hapmoe_milp.cost.floor.stage_floor_bytes`: model state, plus the embedding on
   the first stage and the output layer with its logits on the last, plus the working set every rank
   holds) add up to at most one device's budget, and the stages of type ``h`` use at most its inventory.
   Stored activations and fragmentation only add, so a plan that fits passes this test with the same
   stages. The test itself is a small search over (position in
   the layer sequence, devices used per type): from each position a stage of each (type, size) the space
   has (``space.stage_sizes``) takes the longest range it can hold -- never worse than a shorter one, since
   dropping layers from the next stage only lowers its floor and a stage left empty is dropped -- and only
   device-usage vectors no other at the same position beats are kept. Each family's own rules between
   stages hold in it: the hetero family's stages of one device type are consecutive, the megatron
   family's share one mesh (one stage size) in any type order; runtime rules (FlagScale's edge TP, mesh
   sizes) are left out, which only weakens the test. It stops without a proof past ``max_moves``; the
   solver's own search then decides.

Condition 2 implies 1 (a stage's ``g`` times its per-device floor is at least its layers' whole-cluster
floor), but 1 is O(1) and says why in one number. ``tests/test_cost_floor.py`` checks the floors against
every priced option of small spaces, ``tests/test_search_floor.py`` the proofs against the full search.
"""

from __future__ import annotations

import numpy as np

from hapmoe_milp.config import Family, Settings
from hapmoe_milp.cost.floor import device_budget, memory_floor, stage_floor_bytes
from hapmoe_milp.cost.primitives import GIB
from hapmoe_milp.space import stage_sizes
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

#: relative slack on every "fits" comparison, so float rounding can never turn a fit into a proof
SLACK = 1e-9
#: stage moves the search over stage splits may make before it gives up (a few ms of CPU)
MAX_MOVES = 20_000


def prove_no_fit(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    families: tuple[Family, ...] = ("megatron", "hetero"),
    max_moves: int = MAX_MOVES,
) -> str | None:
    """Why no plan of ``families`` for ``model`` on ``cluster`` fits under ``settings`` (a proof), or None
    when the floor cannot tell (a plan may fit, or the stage search gave up)."""
    floor = memory_floor(model, cluster, settings)
    if floor.need > floor.usable * (1 + SLACK):
        return (
            f"its {floor.params / 1e9:,.1f}B parameters need at least {floor.per_param:g} bytes of model state "
            f"each, summed over the devices holding them at the widest sharding any plan allows: "
            f"{floor.need / GIB:,.0f} GiB in all, and the cluster's {floor.devices} devices hold "
            f"{floor.usable / GIB:,.0f} GiB usable"
        )
    n = len(model.layer_kinds)
    placed: list[str] = []
    for fam in families:
        got = most_layers_placed(model, cluster, settings, fam, max_moves)
        if got is None or got >= n:
            return None
        placed.append(f"{got} of its {n} layers in {fam}-family stages")
    return (
        f"counting only model state at the widest sharding a stage allows (TP within a node, experts and "
        f"optimizer state over the whole stage) and the working set every device holds, the cluster's "
        f"{floor.devices} devices can hold at most {' and '.join(placed)} (with the embedding and output layer)"
    )


def _reach(model: ModelSpec, settings: Settings, g: int, node: int, budget: float) -> np.ndarray:
    """``reach[i]``: the end of the longest range ``[i, e)`` one stage of ``g`` devices can hold from
    ``i`` (``i`` itself when not even one layer fits)."""
    sf = stage_floor_bytes(model, settings, g, node)
    emb, out = sf.first, sf.last
    kinds = model.layer_kinds
    n = len(kinds)
    prefix = np.concatenate(([0.0], np.cumsum([sf.per_kind[k] for k in kinds])))
    cap = budget * (1 + SLACK) - sf.fixed
    start = np.arange(n)
    room = prefix[:n] + cap - np.where(start == 0, emb, 0.0)
    end = np.searchsorted(prefix, room, side="right") - 1  # largest e with prefix[e] <= room
    end = np.minimum(end, n)
    # a stage ending at n also holds the output layer; one from 0 to n both edges as one term (its
    # floor is at least the embedding's, so the ranges ending before n above stand)
    over = (end == n) & (prefix[n] - prefix[:n] + np.where(start == 0, sf.single, out) > cap)
    end = np.where(over, n - 1, end)
    return np.maximum(end, start)


def most_layers_placed(
    model: ModelSpec, cluster: ClusterSpec, settings: Settings, family: Family, max_moves: int = MAX_MOVES
) -> int | None:
    """The most leading layers stages of ``family`` can hold under the stage condition (module
    docstring): the layer count when every layer can be placed, None when the search gave up after
    ``max_moves``. The hetero family's stages of one device type are consecutive (``dp_tables``:
    ``contiguous``); the megatron family's share one mesh, hence one stage size, in any type order."""
    n = len(model.layer_kinds)
    types = list(cluster.inventory)
    reach: dict[tuple[int, int], np.ndarray] = {}
    for h, did in enumerate(types):
        node, budget = cluster.node_size(did), device_budget(cluster, settings, did)
        for g in stage_sizes(cluster, did):
            reach[(h, g)] = _reach(model, settings, g, node, budget)
    have = tuple(cluster.inventory[t] for t in types)
    if family == "hetero":
        return _search(n, have, reach, True, max_moves)
    best = 0
    for size in sorted({g for _, g in reach}, reverse=True):
        one = {k: v for k, v in reach.items() if k[1] == size}
        got = _search(n, have, one, False, max_moves)
        if got is None or got >= n:
            return got
        best = max(best, got)
    return best


def _search(
    n: int, have: tuple[int, ...], reach: dict[tuple[int, int], np.ndarray], grouped: bool, max_moves: int
) -> int | None:
    """Stage splits over (position, devices used per type, and with ``grouped`` the current type and the
    types already left behind): the furthest position reached, ``n`` as soon as one split covers every
    layer, None past ``max_moves``. Only usage vectors no other beats at the same position and type state
    are kept (using fewer devices of every type leaves at least the same moves)."""
    fronts: list[dict[tuple[int, int], list[tuple[int, ...]]]] = [{} for _ in range(n + 1)]
    fronts[0][(-1, 0)] = [(0,) * len(have)]
    best, made = 0, 0
    for i in range(n):
        for (cur, done), front in fronts[i].items():
            for used in front:
                for (h, g), ends in reach.items():
                    e = int(ends[i])
                    if e <= i or used[h] + g > have[h]:
                        continue
                    if grouped and h != cur and done >> h & 1:
                        continue  # that type's block is behind us
                    made += 1
                    if made > max_moves:
                        return None
                    if e == n:
                        return n
                    best = max(best, e)
                    state = (h, done | (1 << cur if cur >= 0 and h != cur else 0)) if grouped else (-1, 0)
                    _insert(fronts[e].setdefault(state, []), (*used[:h], used[h] + g, *used[h + 1 :]))
    return best


def _insert(front: list[tuple[int, ...]], new: tuple[int, ...]) -> None:
    """Add ``new`` to ``front`` unless a vector there uses no more of every type; drop those it beats."""
    for old in front:
        if all(a <= b for a, b in zip(old, new, strict=True)):
            return
    front[:] = [old for old in front if not all(b <= a for a, b in zip(old, new, strict=True))]
    front.append(new)


__all__ = ["MAX_MOVES", "most_layers_placed", "prove_no_fit"]
