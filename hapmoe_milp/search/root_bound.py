"""The sub-problem root bound's floors (see :mod:`hapmoe_milp.search.formulation`, "Sub-problem root
bound" and "Quick root bound", for why each is valid): a floor on ``sum tau`` and one on ``tau_max`` from
the options' per-layer costs, sizes and capacities at a given number of micro-batches in flight."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hapmoe_milp.search.formulation import SubProblem


def root_floors(sub: SubProblem, infl: float) -> tuple[float, float]:
    """(floor on ``sum tau``, floor on ``tau_max``) of the sub-problem's root bound at ``infl`` micro-batches
    in flight. They read only the options' per-layer costs, sizes and capacities, which every schedule's
    copy of a sub-problem shares (``SubProblem.for_schedule``), so the copies share them by ``infl``; only
    the coefficients ``alpha``, ``beta`` that combine them are the schedule's."""
    pre = sub._pre

    def per_layer(attr: str) -> np.ndarray:
        return pre[attr][:, 1:] - pre[attr][:, :-1]

    one = (per_layer("weights") + infl * per_layer("act")).min(axis=1) + sub._fixed
    usable = one <= sub.cap
    if not usable.any():
        return math.inf, math.inf
    t = (per_layer("fwd") + per_layer("bwd"))[usable]
    size = sub.size[usable]
    w = t * size[:, None]  # device-seconds per layer
    W = float(w.min(axis=0).sum())
    fastest = float(t.min(axis=0).sum())
    sum_lb = max(W / float(size.max()), fastest)
    tix = sub.tix[usable]
    rate = 0.0  # layers per second the whole cluster can process at best
    for j in set(tix.tolist()):
        wt = float(w[tix == j].min())
        rate += sub.inv[j] / wt if wt > 0 else math.inf
    tau_lb = sub.N / rate if rate > 0 else 0.0
    t1 = t.min(axis=1)
    m1 = (per_layer("weights") + infl * per_layer("act")).min(axis=1)[usable]
    room = (sub.cap - sub._fixed)[usable]
    nmem = np.where(m1 > 0, np.floor(room / np.where(m1 > 0, m1, 1.0)), sub.N).astype(np.int64)
    tau_lb = max(tau_lb, knapsack_floor(sub, t1, np.minimum(nmem, sub.N), tix, size))
    return sum_lb, tau_lb


def knapsack_floor(sub: SubProblem, t1: np.ndarray, nmem: np.ndarray, tix: np.ndarray, size: np.ndarray) -> float:
    """Smallest stage time ``T`` at which stages of at most ``T`` can hold all layers on the inventory.

    Relaxation (so a lower bound on ``tau_max``): a stage of option ``o`` holds at most
    ``min(nmem_o, T / t1_o)`` layers (``t1`` its cheapest per-layer time, ``nmem`` what its memory
    holds of its lightest layer), edges, p2p, slot positions and the stage count are ignored, and
    each device type is an unbounded knapsack over its stage sizes, so coverage is a sum over types.
    """
    N = sub.N
    cands = np.unique((t1[:, None] * np.arange(1, N + 1)[None, :])[np.arange(N)[None, :] < nmem[:, None]])
    if not len(cands):
        return math.inf

    def covers(T: float) -> bool:
        n = np.minimum(nmem, np.floor(T / t1 * (1 + 1e-12)).astype(np.int64))
        total = 0
        for j in set(tix.tolist()):
            best: dict[int, int] = {}
            for g, k in zip(size[tix == j].tolist(), n[tix == j].tolist()):
                if k > best.get(g, 0):
                    best[g] = k
            cap = sub.inv[j]
            if len(best) == 1:
                ((g, k),) = best.items()
                total += (cap // g) * k
            else:
                dp = [0] * (cap + 1)
                items = sorted(best.items())
                for u in range(1, cap + 1):
                    dp[u] = max([dp[u - 1], *(dp[u - g] + k for g, k in items if g <= u)])
                total += dp[cap]
            if total >= N:
                return True
        return total >= N

    if not covers(float(cands[-1])):
        return math.inf
    a, b = 0, len(cands) - 1
    while a < b:
        mid = (a + b) // 2
        if covers(float(cands[mid])):
            b = mid
        else:
            a = mid + 1
    return float(cands[a])
