"""One sub-problem at one pipeline depth under a cutoff: the arcs and cuts both exact backends translate.

:class:`DepthModel` takes a :class:`~hapmoe_milp.search.formulation.SubProblem`'s arcs at a fixed depth
``P`` (slots count from the end, so every slot's in-flight multiplier, edges and first-stage rule are
constants) and shrinks them under the incumbent until nothing more follows; the backends
(:mod:`hapmoe_milp.search.cpsat`, :mod:`hapmoe_milp.search.milp`) translate what is left.

Why each reduction and cut is valid (it removes no plan that beats the cutoff; tests check every one
against brute-force depth optima, plain and interleaved). Every argument below uses only that an arc's
time, sync and memory are constants of (slot, depth), that layer counts are at least the slots' minima,
and the objective ``alpha sum tau + beta tau_max + sigma`` with ``alpha, beta >= 0``; all three hold for
interleaved depth models (with ``alpha = 1/v``), so each reduction carries over; where one needs more,
it says so:

- *Objective cutoff* ``obj <= cutoff`` (the incumbent): sub-problems are solved to prove that nothing
  beats it. With lower bounds ``tau_lo`` on ``tau_max``, ``S`` on ``sum tau`` and ``sigma_lo`` on
  ``sigma``, an arc of (p2p-cheapest) stage time ``t`` and sync ``y`` in slot ``k`` is in no plan under
  the cutoff if ``beta max(tau_lo, t) + alpha max(S, t + R_k) + max(sigma_lo, y) > cutoff``, where
  ``R_k`` sums the other slots' smallest stage times; such arcs are not built. (Only the objective's
  form and ``alpha, beta >= 0`` are used, so it holds for ``alpha = 1/v`` alike.)
- *Arc dominance*: of two arcs in one slot with the same device type, size, link class, group and layer
  range, one no worse in time, sync and p2p towards every class can replace the other in any plan
  (inventory, layout, memory -- both fit -- and every other stage unchanged), so the worse one is
  dropped (ties keep the lower option index). Off when the cross-type p2p rule is on (it could forbid
  the better arc). Interleaved: dominance is decided within one (slot, depth) arc set, where both arcs
  fit at that depth's in-flight count, and the VPP rules depend only on the (shared) range.
- *Suffix bounds* (the DP's remaining-layer/remaining-time and memory bounds, per slot): slots
  ``1..k-1`` and ``k+1..P`` can hold at most ``cover(u)`` layers on ``u`` devices per type (a DP over
  devices per type; each slot contributes the most layers any of its surviving arcs of that type and
  size holds -- arcs exist only within the time bound *and* the memory), so an arc of ``n`` layers on
  ``g`` devices is in no plan unless ``n + max_{u1 + u2 <= inv - g} (fwd[k-1](u1) + bwd[k+1](u2)) >= N``
  (probing). The smallest stage time at which the surviving arcs still cover all ``N`` layers is
  ``tau_lo``; the smallest sync at which they do is ``sigma_lo`` (bottleneck bisections; the layer
  counts' integrality and the inventory are what make them strong). Relaxations used there (cheapest
  p2p, layout rules ignored, each slot's minimum layer count ignored) only make the covering larger.
  Memory enters only through which arcs exist, and those are the depth's own (interleaved in-flight at
  that ``P``), so the covering is valid per depth. Filter, probe and bounds repeat to a fixpoint.
- *Sum bound* (Lagrangian): for any ``lam``, ``sum tau = lam N + sum_k (tau_k - lam n_k)``, and a min-plus
  DP over devices per type of each slot's cheapest ``time - lam n`` bounds the second term; a few
  ``lam`` around the balanced per-layer time are tried. ``S`` is the best of that, ``tau_lo + R`` and
  the sum of the slots' smallest times.
- *Symmetry* (uniform layer kinds only): two adjacent middle slots ``k, k+1`` with the same option,
  when slot ``k-1`` has that option's link class, have the same p2p, so swapping their layer counts
  swaps their stage times and syncs (sum and max unchanged); in-flight memory does not decrease towards
  the front (checked per depth on ``inst.in_flight(k, P)``: plain ``min(M, k)``, interleaved
  ``min(Mv, 2(k-1) + (v-1)P + 1) / v``, both non-decreasing in ``k`` at a fixed ``P``), so moving the
  larger count to slot ``k`` still fits, and the smaller count fits wherever the larger did (memory grows
  with the count). Middle slots share one minimum layer count (``v`` or 1), so the swapped counts keep
  it. Hence ``n[k+1] <= n[k]`` loses no objective value.
- *Depth bound*: ``beta tau_lo + alpha S + sigma_lo`` bounds every plan of this depth under the cutoff;
  a depth whose bound reaches the cutoff, or whose slots lose every arc, is closed without a model.
- *Block bounds* (at scale, before any depth model: :mod:`hapmoe_milp.search.block_bounds`, where each
  step is argued): the covering and Lagrangian bounds above, with a hetero plan's device types as
  contiguous blocks and the leading block's layers counted exactly (each once), every depth at once.
  They close most depths of a 256-2048 device sub-problem and bound the rest within a fraction of a
  percent, where the covering bound here is 10-20% low (interleaved types, cheap windows counted twice).

"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hapmoe_milp.search.formulation import ArcSet, Assignment

if TYPE_CHECKING:
    from hapmoe_milp.search.formulation import SubProblem

_NEG = -(10**9)


# ------------------------------------------------------------------------------------------ covering
def _shift(j: int, g: int, inv: Sequence[int]) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
    """Source and destination views of a devices-per-type grid for an item using ``g`` devices of type ``j``
    (a usage ``u`` moves to ``u + g`` along axis ``j``)."""
    src = [slice(None)] * len(inv)
    dst = [slice(None)] * len(inv)
    src[j] = slice(0, inv[j] + 1 - g)
    dst[j] = slice(g, inv[j] + 1)
    return tuple(src), tuple(dst)


def _cover_step(best: np.ndarray, items: dict[tuple[int, int], int], inv: Sequence[int]) -> np.ndarray:
    """One slot of the covering DP: most layers held on each devices-per-type usage."""
    new = np.full(best.shape, _NEG, dtype=np.int64)
    for (j, g), n in items.items():
        if g > inv[j]:
            continue
        s, d = _shift(j, g, inv)
        np.maximum(new[d], best[s] + n, out=new[d])
    new[new < 0] = _NEG
    return new


def _minplus_step(best: np.ndarray, items: dict[tuple[int, int], float], inv: Sequence[int]) -> np.ndarray:
    """One slot of a min-plus DP over devices per type: smallest sum of item values on each usage."""
    new = np.full(best.shape, np.inf)
    for (j, g), v in items.items():
        if g > inv[j]:
            continue
        s, d = _shift(j, g, inv)
        np.minimum(new[d], best[s] + v, out=new[d])
    return new


def _cummax(a: np.ndarray) -> np.ndarray:
    for ax in range(a.ndim):
        a = np.maximum.accumulate(a, axis=ax)
    return a


class DepthModel:
    """One sub-problem at one depth under a cutoff: the arcs and cuts both backends translate.

    ``closed`` is True when the reductions alone prove that no plan of this depth beats the cutoff
    (``reason`` says which); the arcs are then empty and no backend is needed.
    """

    def __init__(self, sub: SubProblem, P: int, cutoff: float) -> None:
        self.sub = sub
        self.P = P
        self.cutoff = cutoff
        self.alpha, self.beta = sub.alpha, sub.beta
        self.closed = False
        self.reason = ""
        self.stats: dict[str, int] = {}
        self.tau_lo = 0.0
        self.tau_hi = math.inf
        self.sum_lo = 0.0
        self.sigma_lo = 0.0
        self.bound = 0.0
        self.unmodelled = sub.too_large
        if self.unmodelled:  # bounded by the sub-problem's root bound only
            self.bound = sub.root_bound
            self.reason = "too many arcs to enumerate"
            self._slots = []
            self._finish([])
            return
        N = sub.N
        slots: list[ArcSet] = []
        masks: list[np.ndarray] = []
        lo = [0] + [sub.min_layers(k, k == P) for k in range(1, P + 1)]  # lo[k]: fewest layers of slot k
        below = np.cumsum(lo)  # below[k]: fewest layers of slots 1..k
        for k in range(1, P + 1):
            a = sub.arcs(k, k == P, P)
            slots.append(a)
            # every other slot holds at least its fewest layers (slots above k come first)
            if sub.counts:
                m = a.n <= N - (int(below[P]) - lo[k])
            else:
                m = (a.s >= int(below[P] - below[k])) & (a.e <= N - int(below[k - 1]))
            masks.append(m)
        self._slots = slots
        built = sum(int(m.sum()) for m in masks)
        self.stats["arcs_built"] = built
        eff = [a.time + (2 * sub.pmin[a.opt] if k >= 2 else 0.0) for k, a in zip(range(1, P + 1), slots)]
        self._eff = eff
        self._sync = [a.sync for a in slots]
        # reductions to a fixpoint: the per-arc objective filter under the cutoff, the covering probe,
        # then the bounds again (cheap ones first; the bottleneck bisections once the cheap ones settle)
        lim = cutoff * (1 + 1e-12)
        exact_bounds = False
        for _ in range(12):
            if any(not m.any() for m in masks):
                break
            tmin = [float(t[m].min()) for t, m in zip(eff, masks)]
            R = sum(tmin) - max(tmin)
            self.sum_lo = max(self.sum_lo, sum(tmin))
            self.tau_lo = max(self.tau_lo, max(tmin))
            self.sigma_lo = max(self.sigma_lo, max(float(y[m].min()) for y, m in zip(self._sync, masks)))
            if exact_bounds:
                self.sum_lo = max(self.sum_lo, self._sum_bound(masks))
                self.tau_lo = max(self.tau_lo, self._bottleneck(masks, eff))
                self.sigma_lo = max(self.sigma_lo, self._bottleneck(masks, self._sync))
            self.sum_lo = max(self.sum_lo, self.tau_lo + R)
            self.bound = self.beta * self.tau_lo + self.alpha * self.sum_lo + self.sigma_lo
            if self.bound >= cutoff:
                break
            new = masks
            if math.isfinite(cutoff):
                if self.beta > 0:
                    self.tau_hi = (cutoff - self.sigma_lo - self.alpha * self.sum_lo) / self.beta * (1 + 1e-12)
                else:
                    self.tau_hi = (cutoff - self.sigma_lo - self.alpha * R) / self.alpha * (1 + 1e-12)
                new = []
                for k, (m, t, y) in enumerate(zip(masks, eff, self._sync)):
                    rest = R + max(tmin) - tmin[k]  # the other slots' smallest stage times
                    obj = (
                        self.beta * np.maximum(self.tau_lo, t)
                        + self.alpha * np.maximum(self.sum_lo, t + rest)
                        + np.maximum(self.sigma_lo, y)
                    )
                    new.append(m & (obj <= lim))
            new = self._probe(new, self.tau_hi)
            changed = any((a != b).any() for a, b in zip(new, masks))
            masks = new
            if not changed:
                if exact_bounds:
                    break
                exact_bounds = True
        self.stats["arcs_after_reductions"] = sum(int(m.sum()) for m in masks)
        if any(not m.any() for m in masks):
            self._close(masks, f"covering: no depth-{P} plan holds all layers under the cutoff")
            return
        if self.bound >= cutoff:
            self._close(masks, "depth bound reaches the cutoff")
            return
        self._finish(masks)

    # ------------------------------------------------------------------ reductions
    def _items(self, k: int, sel: np.ndarray) -> dict[tuple[int, int], int]:
        """Most layers per (type, size) the selected arcs of slot ``k`` hold."""
        sub = self.sub
        a = self._slots[k - 1]
        out: dict[tuple[int, int], int] = {}
        if not sel.any():
            return out
        o = a.opt[sel]
        n = a.n[sel]
        key = sub.tix[o] * 100_000 + sub.csize[o]
        order = np.lexsort((n, key))
        key, n = key[order], n[order]
        last = np.r_[key[1:] != key[:-1], True]
        for kk, nn in zip(key[last].tolist(), n[last].tolist()):
            out[(kk // 100_000, kk % 100_000)] = nn
        return out

    def _sum_bound(self, masks: list[np.ndarray]) -> float:
        """Lower bound on ``sum tau`` (Lagrangian relaxation of ``sum n = N``; see the module doc).

        For any ``lam``, ``sum_k tau_k = lam N + sum_k (tau_k - lam n_k)`` and each slot's term is at least
        the smallest ``time + 2 p2p_min - lam n`` among its arcs of the device type and size it uses, so a
        min-plus DP over devices per type bounds the sum; a few ``lam`` around the balanced per-layer
        time are tried and the best bound kept.
        """
        sub = self.sub
        P, N = self.P, sub.N
        inv = sub.cinv
        effs = [t[m] for t, m in zip(self._eff, masks)]
        if any(not len(e) for e in effs):
            return math.inf
        tmin = [float(e.min()) for e in effs]
        best = sum(tmin)
        top = max(float(e.max()) for e in effs)
        ref = min(top, self.tau_hi) if math.isfinite(self.tau_hi) else top
        shape = tuple(v + 1 for v in inv)
        keys = []
        for k in range(1, P + 1):
            a = self._slots[k - 1]
            m = masks[k - 1]
            o = a.opt[m]
            keys.append((sub.tix[o] * 100_000 + sub.csize[o], a.n[m].astype(np.float64)))
        for q in (0.0, 0.5, 0.7, 0.85, 1.0):
            lam = q * ref * P / N
            dp = np.full(shape, np.inf)
            dp[(0,) * len(inv)] = 0.0
            for k in range(1, P + 1):
                key, n = keys[k - 1]
                val = effs[k - 1] - lam * n
                order = np.lexsort((val, key))
                ks, vs = key[order], val[order]
                firsts = np.r_[True, ks[1:] != ks[:-1]]
                items = {(int(kk) // 100_000, int(kk) % 100_000): float(v) for kk, v in zip(ks[firsts], vs[firsts])}
                dp = _minplus_step(dp, items, inv)
            v = float(dp.min())
            if math.isfinite(v):
                best = max(best, lam * N + v)
        return best

    def _probe(self, masks: list[np.ndarray], limit: float) -> list[np.ndarray]:
        sub = self.sub
        P, N = self.P, sub.N
        inv = sub.cinv
        shape = tuple(v + 1 for v in inv)
        items = [self._items(k, masks[k - 1] & (self._eff[k - 1] <= limit)) for k in range(1, P + 1)]
        zero = np.full(shape, _NEG, dtype=np.int64)
        zero[(0,) * len(inv)] = 0
        fwd = [zero]
        for k in range(1, P):
            fwd.append(_cover_step(fwd[-1], items[k - 1], inv))
        bwd = [zero] * (P + 2)
        for k in range(P, 1, -1):
            bwd[k] = _cover_step(bwd[k + 1] if k < P else zero, items[k - 1], inv)
        out = []
        for k in range(1, P + 1):
            F = _cummax(fwd[k - 1])
            B = bwd[k + 1] if k < P else zero
            a = self._slots[k - 1]
            m = masks[k - 1].copy()
            if not m.any():
                out.append(m)
                continue
            need = np.full(len(a), N + 1, dtype=np.int64)
            for j, g in items[k - 1]:
                w = list(inv)
                w[j] -= g
                if w[j] < 0:
                    continue
                box = tuple(slice(0, x + 1) for x in w)
                flip = tuple(slice(None, None, -1) for _ in w)
                v = int((B[box] + F[box][flip]).max())
                sel = (sub.tix[a.opt] == j) & (sub.csize[a.opt] == g)
                need[sel] = N - v if v > _NEG // 2 else N + 1
            m &= a.n >= need
            out.append(m)
        return out

    def _covers(self, masks: list[np.ndarray], values: list[np.ndarray], v: float) -> bool:
        """Can one arc per slot, each with ``value <= v``, hold every layer on the inventory?"""
        sub = self.sub
        inv = sub.cinv
        shape = tuple(x + 1 for x in inv)
        best = np.full(shape, _NEG, dtype=np.int64)
        best[(0,) * len(inv)] = 0
        for k in range(1, self.P + 1):
            best = _cover_step(best, self._items(k, masks[k - 1] & (values[k - 1] <= v)), inv)
            if int(best.max()) < 0:
                return False
        return int(best.max()) >= sub.N

    def _bottleneck(self, masks: list[np.ndarray], values: list[np.ndarray]) -> float:
        """Smallest ``v`` such that arcs with value <= v (stage time or sync) still cover every layer:
        a lower bound on the plan's largest value (``tau_max`` or ``sigma``); bisection over candidates."""
        cands = np.unique(np.concatenate([t[m] for t, m in zip(values, masks)]))
        lo_t = max(float(t[m].min()) for t, m in zip(values, masks))
        cands = cands[cands >= lo_t]
        if not len(cands) or not self._covers(masks, values, float(cands[-1])):
            return math.inf  # nothing covers every layer: no plan of this depth
        a, b = 0, len(cands) - 1
        while a < b:
            mid = (a + b) // 2
            if self._covers(masks, values, float(cands[mid])):
                b = mid
            else:
                a = mid + 1
        return float(cands[a])

    def _close(self, masks: list[np.ndarray], reason: str) -> None:
        self.closed = True
        self.reason = reason
        self._finish([np.zeros_like(m) for m in masks])

    def _finish(self, masks: list[np.ndarray]) -> None:
        sub = self.sub
        ks, opt, s, e, tm, sy = [], [], [], [], [], []
        for k, (a, m) in enumerate(zip(self._slots, masks), start=1):
            ks.append(np.full(int(m.sum()), k, dtype=np.int64))
            opt.append(a.opt[m])
            s.append(a.s[m])
            e.append(a.e[m])
            tm.append(a.time[m])
            sy.append(a.sync[m])
        self.slot = np.concatenate(ks) if ks else np.zeros(0, np.int64)
        self.opt = np.concatenate(opt) if opt else np.zeros(0, np.int64)
        self.start = np.concatenate(s) if s else np.zeros(0, np.int64)
        self.end = np.concatenate(e) if e else np.zeros(0, np.int64)
        self.time = np.concatenate(tm) if tm else np.zeros(0)
        self.sync = np.concatenate(sy) if sy else np.zeros(0)
        self.n = self.end - self.start
        self.by_slot = [np.nonzero(self.slot == k)[0] for k in range(1, self.P + 1)]
        self.stats["arcs"] = len(self.slot)
        # symmetry pairs (uniform kinds, non-decreasing in-flight): adjacent middle slots, same option
        self.symmetry: list[tuple[int, int]] = []
        if sub.uniform and sub.in_flight_monotone(self.P) and not self.closed:
            for k in range(2, self.P - 1):
                here = set(self.opt[self.by_slot[k - 1]].tolist())
                above = set(self.opt[self.by_slot[k]].tolist())
                self.symmetry.extend((k, i) for i in sorted(here & above))
        # cross-type p2p rule (a pruning switch): arc a may not send to class j
        self.forbidden: list[tuple[int, int]] = []
        if sub.cross_type and not self.closed:
            for a in np.nonzero(self.slot >= 2)[0].tolist():
                i = int(self.opt[a])
                for j, (dev, _) in enumerate(sub.classes):
                    if dev != sub.options[i].device and 2 * sub.p2p[i, j] > sub.eta * self.time[a]:
                        self.forbidden.append((a, j))

    def rule_rows(self) -> list[tuple[str, list[int], list[int], int]]:
        """The runtime's rules between stages as rows ``sum x[plus] - sum x[minus] <= rhs`` over arcs
        (each slot holds one arc, so a slot's arcs of one mesh, TP or DP sum to 0 or 1):

        - every mesh after the first holds ``m`` stages: slot ``k`` (slot ``P`` is the first stage) starts a
          mesh after the first when slot ``k+1`` is of another mesh, and then slots ``k-1 .. k-m+1`` are of
          its mesh: ``y[k,h] - y[k+1,h] - y[k-j,h] <= 0`` (``y[k,h] - y[k+1,h] <= 0`` when ``k-j < 1``);
        - first and last stage one TP: ``y[1,t] = y[P,t]`` per TP ``t``;
        - their DPs divide one another: ``y[1,d] + y[P,d'] <= 1`` per pair that does not.
        """
        sub, P = self.sub, self.P
        rules = sub.rules
        rows: list[tuple[str, list[int], list[int], int]] = []
        if not rules.active or self.closed or not len(self.slot):
            return rows

        def members(k: int, attr: np.ndarray) -> dict[int, list[int]]:
            out: dict[int, list[int]] = {}
            for a in self.by_slot[k - 1].tolist():
                out.setdefault(int(attr[self.opt[a]]), []).append(a)
            return out

        m = rules.mesh_min_stages
        if m > 1:
            by = {k: members(k, sub.mesh) for k in range(1, P + 1)}
            for k in range(1, P):
                for h, here in by[k].items():
                    before = by[k + 1].get(h, [])
                    for j in range(1, m):
                        after = by[k - j].get(h, []) if k - j >= 1 else []
                        rows.append((f"mesh_run_k{k}_m{h}_j{j}", here, before + after, 0))
                        if k - j < 1:
                            break
        if P >= 2 and rules.edge_tp:
            last, first = members(1, sub.tp), members(P, sub.tp)
            for t in sorted(set(last) | set(first)):
                rows.append((f"edge_tp_{t}_a", last.get(t, []), first.get(t, []), 0))
                rows.append((f"edge_tp_{t}_b", first.get(t, []), last.get(t, []), 0))
        if P >= 2 and rules.edge_dp:
            last, first = members(1, sub.dp), members(P, sub.dp)
            for dl, la in last.items():
                for d0, fa in first.items():
                    if dl % d0 and d0 % dl:
                        rows.append((f"edge_dp_{dl}_{d0}", la + fa, [], 1))
        return rows

    # ------------------------------------------------------------------ plans
    def describe(self) -> str:
        return f"{self.sub.describe()} P={self.P}"

    def arc_of(self, k: int, i: int, s: int, e: int) -> int | None:
        """Index of the arc (slot, option, range), following dominance; None if not in the model."""
        sub = self.sub
        if sub.counts:
            s, e = 0, e - s
        a = sub.arcs(k, k == self.P, self.P)
        i = a.dominated_by.get((i, s, e), i)
        idx = self.by_slot[k - 1]
        hit = idx[(self.opt[idx] == i) & (self.start[idx] == s) & (self.end[idx] == e)]
        return int(hit[0]) if len(hit) else None

    def hint_arcs(self, assignment: Assignment) -> list[int] | None:
        """The arcs of a plan of this depth (first stage first), or None if it is not in the model."""
        if len(assignment) != self.P or self.closed or not self.sub.admissible(assignment):
            return None
        out = []
        for j, (i, s, e) in enumerate(assignment):
            a = self.arc_of(self.P - j, i, s, e)
            if a is None:
                return None
            out.append(a)
        return out

    def assignment(self, chosen: Sequence[int]) -> Assignment:
        """Decode one chosen arc per slot into stages from first to last."""
        by_k = {int(self.slot[a]): a for a in chosen}
        out: Assignment = []
        pos = 0
        for k in range(self.P, 0, -1):
            a = by_k[k]
            if self.sub.counts:
                s, e = pos, pos + int(self.n[a])
            else:
                s, e = int(self.start[a]), int(self.end[a])
            out.append((int(self.opt[a]), s, e))
            pos = e
        return out

    def p2p_of(self, a: int, next_arc: int | None) -> float:
        """Seconds of arc ``a``'s transfer towards the next (later) stage's arc."""
        if next_arc is None:
            return 0.0
        return float(self.sub.p2p[self.opt[a], self.sub.cls[self.opt[next_arc]]])

    def values(self, chosen: Sequence[int]) -> dict[str, Any]:
        """Stage times, p2p, tau_max, sigma and the objective of chosen arcs (for hints and checks)."""
        by_k = {int(self.slot[a]): a for a in chosen}
        taus, ps = {}, {}
        for k in range(1, self.P + 1):
            a = by_k[k]
            p = self.p2p_of(a, by_k.get(k - 1))
            ps[k] = p
            taus[k] = float(self.time[a]) + 2 * p
        sigma = max(float(self.sync[a]) for a in chosen)
        obj = self.alpha * sum(taus.values()) + self.beta * max(taus.values()) + sigma
        return {"tau": taus, "p2p": ps, "tau_max": max(taus.values()), "sigma": sigma, "objective": obj}


__all__ = ["DepthModel"]
