"""Pareto fronts of the vectorised DP's labels, and the integer keys that group them.

A DP state keeps only the labels ``(sum tau, max tau, max sync)`` that no other label of the same state
beats in all three (:func:`pareto_mask`, with the reference's ``eps`` thinning); before labels are made,
two stage options leading from one state to the same next state are compared on (stage time, sync)
(:func:`pair_front`). These are the DP's array kernels that know nothing of stages or devices: sorted
arrays in, keep-masks out. :mod:`hapmoe_milp.search.dp_levels` calls them level by level.
"""

from __future__ import annotations

import math

import numpy as np

from hapmoe_milp.space import PruneCounter


def pack(cols: list[np.ndarray], radix: list[int]) -> np.ndarray | None:
    """Mixed-radix int64 key of integer columns, or None when it would overflow."""
    if math.prod(radix) >= 2**62:
        return None
    key = np.zeros(len(cols[0]), dtype=np.int64)
    for c, r in zip(cols, radix, strict=True):
        key = key * r + c
    return key


def pareto_mask(key: np.ndarray, tot: np.ndarray, tm: np.ndarray, sm: np.ndarray, eps: float) -> tuple[np.ndarray, int]:
    """Keep-mask of labels not dominated in (tot, tm, sm) within their key; inputs sorted by (key, tot, tm, sm).

    A label is dominated when an earlier label of the same key is no worse in all three (dominance is
    transitive, so comparing against every earlier label, kept or not, gives the exact front). With
    ``eps > 0`` a label on the exact front is also dropped when an earlier *kept* label is within a factor
    ``1 + eps`` in tm and sm -- the reference's rule, evaluated to its fixed point. Returns the mask and
    how many labels only the ``eps`` rule dropped.
    """
    n = len(key)
    keep = np.ones(n, dtype=bool)
    if n <= 1:
        return keep, 0
    start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    gsize = np.diff(np.r_[start, n])
    grp = np.repeat(np.arange(len(start)), gsize)
    pos = np.arange(n) - start[grp]
    # 1. the earlier label with the least tm (a running arg-min per key, via integer ranks so keys can be
    #    stacked without losing precision): a label whose tm is below every earlier one is on the front
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(tm, kind="stable")] = np.arange(n)
    val = (len(start) - 1 - grp) * (n + 1) + rank  # later keys are smaller: running minima reset per key
    run = np.minimum.accumulate(val)
    at = np.maximum.accumulate(np.where(val == run, np.arange(n), -1))
    prev = np.r_[-1, at[:-1]]  # arg-min over labels before i (same key when pos > 0)
    has = pos > 0
    h = np.where(has, prev, 0)
    dom2 = has & (tm[h] <= tm)  # some earlier label is no worse in (tot, tm)
    sure = dom2 & (sm[h] <= sm) & (tot[h] <= tot)
    j1 = np.maximum(np.arange(n) - 1, 0)
    sure |= has & (tm[j1] <= tm) & (sm[j1] <= sm) & (tot[j1] <= tot)
    keep[sure] = False
    # 2. the rest of the (tot, tm)-dominated labels: compare with the earlier labels of their key that
    #    step 1 kept (if any label dominates one, a label of the front does, and the front was kept)
    r = np.flatnonzero(keep)
    unsure = (dom2 & ~sure)[r]
    if unsure.any():
        rk = key[r]
        rstart = np.flatnonzero(np.r_[True, rk[1:] != rk[:-1]])
        rpos = np.arange(len(r)) - np.repeat(rstart, np.diff(np.r_[rstart, len(r)]))
        rt, rm, rs = tot[r], tm[r], sm[r]
        idx = np.flatnonzero(unsure)
        d = 1
        while len(idx):
            idx = idx[rpos[idx] >= d]
            if not len(idx):
                break
            j = idx - d
            hit = (rm[j] <= rm[idx]) & (rs[j] <= rs[idx]) & (rt[j] <= rt[idx])
            keep[r[idx[hit]]] = False
            idx = idx[~hit]
            d += 1
    if eps <= 0:
        return keep, 0
    # eps-thinning among the exact front, against kept labels only (a sequential rule: iterate)
    front = np.flatnonzero(keep)
    if len(front) <= 1:
        return keep, 0
    fk, ft, fs = key[front], tm[front], sm[front]
    fstart = np.flatnonzero(np.r_[True, fk[1:] != fk[:-1]])
    fpos = np.arange(len(front)) - np.repeat(fstart, np.diff(np.r_[fstart, len(front)]))
    f = 1.0 + eps
    kept = np.ones(len(front), dtype=bool)
    for _ in range(64):
        drop = np.zeros(len(front), dtype=bool)
        idx = np.flatnonzero(fpos >= 1)
        d = 1
        while len(idx):
            j = idx - d
            hit = kept[j] & (ft[j] <= ft[idx] * f) & (fs[j] <= fs[idx] * f)
            drop[idx[hit]] = True
            d += 1
            idx = idx[fpos[idx] >= d]
        new = ~drop
        if np.array_equal(new, kept):
            break
        kept = new
    keep[front[~kept]] = False
    return keep, int((~kept).sum())


def pair_front(S: np.ndarray, key: np.ndarray, tau: np.ndarray, sync: np.ndarray) -> np.ndarray:
    """Keep-mask of pairs not dominated in (tau, sync) by another pair of the same (state, next state);
    of equal pairs the first is kept. The result keeps the pairs' original order."""
    n = len(S)
    if n <= 1:
        return np.ones(n, dtype=bool)
    order = np.lexsort((sync, tau, key, S))
    gs, gk = S[order], key[order]
    head = np.r_[True, (gs[1:] != gs[:-1]) | (gk[1:] != gk[:-1])]
    grp = np.cumsum(head) - 1
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(sync[order], kind="stable")] = np.arange(n)
    val = (grp[-1] - grp) * (n + 1) + rank  # later groups are smaller: running minima reset per group
    run = np.minimum.accumulate(val)
    before = np.r_[np.iinfo(np.int64).max, run[:-1]]  # least sync rank among earlier pairs of the group
    dominated = ~head & (before - (grp[-1] - grp) * (n + 1) <= rank)
    keep = np.ones(n, dtype=bool)
    keep[order[dominated]] = False
    return keep


def label_front(acc: list[tuple[np.ndarray, ...]], eps: float, counter: PruneCounter) -> tuple[np.ndarray, ...]:
    """Concatenate label chunks and keep each key's Pareto front, sorted by (key, total, tmax, smax)."""
    key, tot, tmx, smx, fl, pair, par = (np.concatenate(c) for c in zip(*acc, strict=True))
    order = np.lexsort((smx, tmx, tot, key))
    key, tot, tmx, smx, fl, pair, par = (a[order] for a in (key, tot, tmx, smx, fl, pair, par))
    keep, n_eps = pareto_mask(key, tot, np.maximum(tmx, fl), smx, eps)
    if n_eps:
        counter.add("pareto_eps", n_eps)
    return tuple(a[keep] for a in (key, tot, tmx, smx, fl, pair, par))


__all__ = ["label_front", "pack", "pair_front", "pareto_mask"]
