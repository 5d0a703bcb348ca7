"""Depth-wise lower bounds for plain-1F1B sub-problems at scale: stages as contiguous device-type blocks.

The covering bound of a :class:`~hapmoe_milp.search.depth_model.DepthModel` relaxes two things that
matter at hundreds of devices: a device type's stages may interleave with another type's (so fast
devices sit at both ends of the pipeline, where in-flight memory is smallest), and a middle stage of a
model with a leading block of another kind (DeepSeek's dense layers) is priced at its cheapest window,
so several stages each claim the cheap layers. Both leave it 10-20% below the optimum of a depth on
DeepSeek-V3 at 256 devices, and a depth model takes a second to build there. This module keeps both
exact, bounds every depth of a sub-problem in a few passes, and is what closes the gap at scale:

- *Items.* Every stage a plan of the sub-problem can have is an item ``(option, layer range)`` priced
  exactly as ``Instance.evaluate`` prices it (:meth:`SubProblem.range_values`): the first stage holds
  ``[0, n)`` with the embedding, the last ``[s, N)`` with the head and the MTP layers, a middle stage a
  window that starts inside the leading block (``s <= a``) or, holding only main-kind layers (which are
  interchangeable), the window ``[a, a + n)``. An item records its device type, size, the lead-kind
  layers ``l`` it holds, its layer count, its time plus the cheapest p2p it can pay (``eff``), its exposed
  sync, and the deepest position from the end at which its memory fits (``kmax``: plain in-flight counts
  ``min(M, k)`` only grow towards the front). Per (type, size, ``l``, layer count) only the items on the
  front of low ``eff`` and high ``kmax`` are kept (for the sync bound, of low sync and high ``kmax``):
  the others are never the best at any threshold and position.
- *Blocks.* A hetero plan of two device types is a back block of one type (positions ``1..s`` from the
  end, the last stage first) and a front block of the other (positions ``s+1..P``, the first stage on
  top); one type is one block. Devices are counted per type (a 1-D grid per type, in units of the gcd of
  the sizes that fit; a usage fits the inventory exactly when its units fit the inventory's units), so
  once the back block is finished its devices no longer matter: one pass from the last stage up carries,
  per type, a back block and a front block above the other type's best finished back block, and a first
  stage closes either at every position -- every depth at once. The lead-kind layers held are counted
  exactly (every plan holds each of the ``a`` of them once).
- *Bottleneck.* ``cover_P(T)``: can ``P`` such stages, each of ``eff <= T``, hold ``N`` layers? A max-plus
  pass over blocks; true for every ``T >= tau_max`` of a plan of depth ``P``. Thresholds are candidate
  ``eff`` values, evaluated in batches (all depths per pass); a depth's ``tau_max`` is at least the
  smallest candidate above the largest threshold at which it does not cover (valid after any number of
  rounds). Likewise with each stage's sync in place of ``eff``: a lower bound on ``sigma``.
- *Sum.* For any ``lam``, ``sum tau >= lam N + min sum(eff - lam n)`` over the same blocks with every
  ``eff <= T`` (a min-plus pass; the layer count is dualised, devices, lead layers and positions stay):
  ``S_P(T)``, a lower bound on ``sum tau`` of every depth-``P`` plan with ``tau_max <= T``; without the
  limit, a floor for every plan of the depth. Large multipliers price a stage that is not full at nearly
  its whole time, which is what makes the bound tight where the bottleneck bound is.
- *Depth bound.* A plan with ``tau_max`` in ``[T_i, T_{i+1})`` costs at least
  ``beta T_i + alpha S_P(T_{i+1}) + sigma_lo`` (``S_P`` does not increase with ``T``); intervals from the
  bottleneck bound to ``T_hi``, above which ``beta T + alpha S_floor + sigma_lo`` reaches the cutoff,
  cover every plan that could beat it (a depth with nothing below ``T_hi`` is closed without more).
  ``sigma_lo`` is the least sync of a last and of a first stage, or the sync bottleneck. A depth with
  one stage is enumerated exactly.

Relaxed on purpose (each only admits more): the boundary's p2p is the cheapest of the option's link
classes, node alignment and the one-size-per-type rule are ignored, windows are combined regardless of
overlap within the lead block, the covering asks for at least ``N`` layers, and times and memory get a
relative slack of :data:`SLACK`. Applies to plain (not interleaved) sub-problems with at most two device
types (hetero: contiguous blocks; one type: any family) whose layers are a leading block of one kind, a
body of another and at most one MTP layer (:meth:`BlockBounds.applicable`).
tests/test_search_block_bounds.py checks every depth bound against brute-force depth optima.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hapmoe_milp.instance import vpp_lead

if TYPE_CHECKING:
    from hapmoe_milp.search.formulation import SubProblem

#: Relative slack on times and memory: a window priced at another offset of the same kinds may differ
#: from the plan's own range in the last bits, so the relaxation never drops a plan by rounding.
SLACK = 1e-9
#: Multiples of the per-layer time ``T / N`` tried as the layer-count multiplier (one set for every depth;
#: a depth ``P`` plan is balanced near ``T P / N``): large ones price a stage that is not full at nearly
#: its whole time, which makes the sum bound tight when the bottleneck bound is (every stage is then
#: nearly full).
LAMBDAS = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)
#: Powers of two spanned by the multipliers of the floor (from the fastest middle stage's per-layer time).
FLOOR_SPAN = 10
#: First relative width of the ``tau_max`` intervals of the combined bound (doubling after each).
STEP = 0.002
#: Thresholds evaluated together per bisection round.
BATCH = 24
#: Rounds of the batched bisection, and points per depth interval in a round.
ROUNDS = 3
QUANTILES = 4
_FAMILIES = ("mid", "first", "last", "both")


@dataclass
class _Items:
    """Stage items of one family (middle, first, last or single stage), Pareto-reduced per class and
    layer count over (``eff`` low, ``kmax`` high)."""

    cls: np.ndarray  # class index: (device type, size in units, lead layers)
    n: np.ndarray  # layers held
    eff: np.ndarray  # stage time plus twice the cheapest p2p (the last stage sends nothing)
    sync: np.ndarray
    kmax: np.ndarray  # deepest position from the end at which the stage fits memory


class BlockBounds:
    """Depth bounds of one sub-problem (see the module doc). Built once; :meth:`depth_bounds` per cutoff."""

    def __init__(self, sub: SubProblem) -> None:
        self.sub = sub
        self.N = sub.N
        self.K = sub.K
        self.alpha, self.beta = sub.alpha, sub.beta
        self.lead = vpp_lead(sub.inst.model) or 0
        self.L = self.lead + 1
        self.ok = self.applicable(sub)
        self.passes = 0
        self.deadline: float | None = None
        if not self.ok:
            return
        self.types = sorted({int(j) for j in sub.tix.tolist()})
        self.items: dict[str, _Items] = {}
        self.items_sync: dict[str, _Items] = {}
        raw = {fam: self._price(fam) for fam in _FAMILIES}
        self.unit, self.grid = device_grid(raw.values(), self.types, sub.inv)
        both = raw["both"]
        #: P = 1 is enumerated exactly over every single-stage item (before any reduction)
        self.single = (
            float(((self.alpha + self.beta) * both["eff"] + both["sync"]).min()) if len(both["eff"]) else math.inf
        )
        self.sync_last = float(raw["last"]["sync"].min()) if len(raw["last"]["sync"]) else math.inf
        # least sync of a first stage that fits at position P or deeper (suffix minimum over kmax)
        first_sync = np.full(self.K + 2, np.inf)
        np.minimum.at(first_sync, raw["first"]["kmax"], raw["first"]["sync"])
        self.sync_first = np.minimum.accumulate(first_sync[::-1])[::-1]
        keys: dict[tuple[int, int, int], int] = {}
        for fam, r in raw.items():
            g = r["size"] // np.asarray([self.unit[int(j)] for j in r["typ"]], dtype=np.int64).reshape(-1)
            cls = np.asarray(
                [keys.setdefault((int(j), int(u), int(lv)), len(keys)) for j, u, lv in zip(r["typ"], g, r["l"])],
                dtype=np.int64,
            )
            self.items[fam] = _reduce(cls, r["n"], r["eff"], r["sync"], r["kmax"])
            # for the sync bottleneck: the front of low sync and high kmax (stage time not filtered)
            self.items_sync[fam] = _reduce(cls, r["n"], r["sync"], r["eff"], r["kmax"], swap=True)
        self.classes = sorted(keys, key=keys.get)  # type: ignore[arg-type]
        self.C = len(self.classes)
        self.cls_typ = np.asarray([c[0] for c in self.classes], dtype=np.int64)
        self.cls_unit = np.asarray([c[1] for c in self.classes], dtype=np.int64)
        self.cls_lead = np.asarray([c[2] for c in self.classes], dtype=np.int64)
        self._by_type = {j: np.flatnonzero(self.cls_typ == j) for j in self.types}
        effs = np.concatenate([it.eff for it in self.items.values()])
        self.cands = np.unique(effs)

    # ------------------------------------------------------------------ scope
    @staticmethod
    def applicable(sub: SubProblem) -> bool:
        """Plain schedule, one or two device types (two: hetero's contiguous blocks), and a layer sequence
        of a leading block, a body of one kind and at most one trailing MTP layer."""
        if sub.vpp > 1 or not sub.O or not sub.depths:
            return False
        ntypes = len({int(j) for j in sub.tix.tolist()})
        if ntypes > 2 or (ntypes == 2 and not sub.contiguous):
            return False
        kinds = sub.inst.layer_kinds
        t = sum(1 for k in kinds if k == "mtp")
        if t > 1 or (t and kinds[-1] != "mtp") or vpp_lead(sub.inst.model) is None:
            return False
        return len(kinds) >= 2

    # ------------------------------------------------------------------ items
    def _ranges(self, fam: str) -> tuple[np.ndarray, np.ndarray]:
        N, a = self.N, self.lead
        if fam == "first":
            e = np.arange(1, N, dtype=np.int64)
            return np.zeros_like(e), e
        if fam == "last":
            s = np.arange(1, N, dtype=np.int64)
            return s, np.full_like(s, N)
        if fam == "both":
            return np.asarray([0]), np.asarray([N])
        ss, ee = [], []
        for s0 in range(1, max(1, a) + 1):  # windows starting inside the lead block, or at its end
            e = np.arange(s0 + 1, N, dtype=np.int64)
            ss.append(np.full_like(e, s0))
            ee.append(e)
        return np.concatenate(ss), np.concatenate(ee)

    def _price(self, fam: str) -> dict[str, np.ndarray]:
        """Every (option, range) of a family that is valid and fits somewhere, as flat arrays."""
        s, e = self._ranges(fam)
        r = price_stages(self.sub, s, e, fam, self.K)
        r["l"] = np.maximum(0, np.minimum(r["e"], self.lead) - r["s"])
        return r

    # ------------------------------------------------------------------ tables per threshold
    def _tables(self, ths: np.ndarray, lams: np.ndarray | None, by: str = "eff") -> dict[str, np.ndarray]:
        """Per family, ``[b, class, position]``: the best item with ``value <= ths[b]`` (value: ``eff``, or
        ``sync`` with ``by='sync'``) that fits at that position -- the most layers (``lams`` None,
        covering) or the least ``eff - lams[b] n`` (Lagrangian)."""
        B = len(ths)
        out = {}
        pool = self.items if by == "eff" else self.items_sync
        for fam, it in pool.items():
            val = it.eff if by == "eff" else it.sync
            if lams is None:
                # items enter at the first threshold that admits them; a running max over thresholds
                order = np.argsort(ths, kind="stable")
                first = np.searchsorted(ths[order], val / (1 + SLACK), side="left")
                m = first < B
                tab = np.full((B, self.C, self.K + 2), -np.inf)
                np.maximum.at(tab, (first[m], it.cls[m], it.kmax[m]), it.n[m].astype(np.float64))
                tab = np.maximum.accumulate(tab, axis=0)
                tab = np.maximum.accumulate(tab[:, :, ::-1], axis=2)[:, :, ::-1]
                inv = np.empty(B, dtype=np.int64)
                inv[order] = np.arange(B)
                tab = tab[inv]
            else:
                tab = np.full((B, self.C, self.K + 2), np.inf)
                ok = val[None, :] <= ths[:, None] * (1 + SLACK)
                bb, ii = np.nonzero(ok)
                np.minimum.at(tab, (bb, it.cls[ii], it.kmax[ii]), it.eff[ii] - lams[bb] * it.n[ii])
                tab = np.minimum.accumulate(tab[:, :, ::-1], axis=2)[:, :, ::-1]
            out[fam] = tab
        return out

    def _step(self, state: np.ndarray, tab: np.ndarray, pos: int, j: int, cover: bool) -> np.ndarray:
        """One stage of device type ``j`` at position ``pos`` appended to ``[batch, ..., units, lead]``
        block states."""
        new = np.full(state.shape, -np.inf if cover else np.inf)
        U, L = state.shape[-2:]
        lift = (slice(None), *([None] * (state.ndim - 1)))
        for c in self._by_type[j]:
            val = tab[:, c, pos]
            g, lv = int(self.cls_unit[c]), int(self.cls_lead[c])
            if g >= U or lv >= L or not np.isfinite(val).any():
                continue
            src = state[..., : U - g, : L - lv] + val[lift]
            dst = new[..., g:, lv:]
            if cover:
                np.maximum(dst, src, out=dst)
            else:
                np.minimum(dst, src, out=dst)
        return new

    def _close(self, state: np.ndarray, tab: np.ndarray, pos: int, j: int, cover: bool) -> np.ndarray:
        """Best value per batch row after a first stage of type ``j`` at ``pos`` tops a block of
        ``[batch, ..., units, lead]`` states with every lead layer held: the step and the reduction over
        devices at once (a running best over units)."""
        acc = np.maximum.accumulate(state, axis=-2) if cover else np.minimum.accumulate(state, axis=-2)
        acc = acc.reshape(state.shape[0], -1, *state.shape[-2:])
        U = state.shape[-2]
        best = np.full(state.shape[0], -np.inf if cover else np.inf)
        a = self.lead
        for c in self._by_type[j]:
            g, lv = int(self.cls_unit[c]), int(self.cls_lead[c])
            if g >= U or lv > a:
                continue
            v = acc[:, :, U - 1 - g, a - lv].max(axis=1) if cover else acc[:, :, U - 1 - g, a - lv].min(axis=1)
            best = np.maximum(best, v + tab[:, c, pos]) if cover else np.minimum(best, v + tab[:, c, pos])
        return best

    def _sweep(self, tabs: dict[str, np.ndarray], Pmax: int, cover: bool) -> np.ndarray:
        """Best value of every depth up to ``Pmax`` per batch row, ``[batch, Pmax + 1]``: the most layers
        (covering) or the least ``sum(eff - lam n)`` (Lagrangian). One pass from the last stage up; per
        type two block states side by side: a back block (from the last stage), and a front block above a
        finished back block of the other type (whose devices no longer matter: types are counted apart);
        a first stage closes either at every depth."""
        self.passes += 1
        bad = -np.inf if cover else np.inf
        red = np.maximum if cover else np.minimum
        B = next(iter(tabs.values())).shape[0]
        out = np.full((B, Pmax + 1), bad)
        two = len(self.types) == 2
        state = {}
        for j in self.types:
            zero = np.full((B, 1 + two, self.grid[j] + 1, self.L), bad)
            zero[:, 0, 0, 0] = 0.0
            out[:, 1] = red(out[:, 1], self._close(zero[:, :1], tabs["both"], 1, j, cover))
            state[j] = self._step(zero, tabs["last"], 1, j, cover)
            if two:
                state[j][:, 1] = bad  # no front block before position 2
        for k in range(2, Pmax + 1):
            if two:  # a front block of type j may start here, above the other type's finished back block
                done = {j: (st[:, 0].max(axis=1) if cover else st[:, 0].min(axis=1)) for j, st in state.items()}
                for j in self.types:
                    other = self.types[0] if j == self.types[1] else self.types[1]
                    state[j][:, 1, 0, :] = red(state[j][:, 1, 0, :], done[other])
            for j in self.types:
                out[:, k] = red(out[:, k], self._close(state[j], tabs["first"], k, j, cover))
            if k < Pmax:
                for j in self.types:
                    state[j] = self._step(state[j], tabs["mid"], k, j, cover)
        return out

    # ------------------------------------------------------------------ bounds
    def _sum_floor(self, P: int) -> float:
        """Cheap floor on ``sum tau``: the least last, first and middle stage times that fit."""
        last, first, mid = self.items["last"], self.items["first"], self.items["mid"]
        fe = first.eff[first.kmax >= P]
        me = mid.eff[mid.kmax >= 2]
        if not len(last.eff) or not len(fe) or (P > 2 and not len(me)):
            return math.inf
        return float(last.eff.min()) + float(fe.min()) + (P - 2) * (float(me.min()) if P > 2 else 0.0)

    def _bottlenecks(self, cands: np.ndarray, hi: dict[int, float], by: str) -> dict[int, float]:
        """Per depth, a lower bound on the largest stage value (``eff`` or ``sync``) of its plans with that
        value at most ``hi[P]``: the smallest candidate above the largest threshold at which the depth does
        not cover every layer (inf: not even at ``hi[P]``). Batched rounds of thresholds, all depths per pass."""
        Pmax = max(hi)
        lo_v = dict.fromkeys(hi, -math.inf)  # largest value known not to cover
        hi_v = {P: math.inf for P in hi}  # smallest value known to cover
        top = {P: cands[cands <= h * (1 + SLACK)] for P, h in hi.items()}
        for _ in range(ROUNDS):
            if self._late():
                break  # what the rounds so far proved stands (none: the smallest candidate)
            want: set[float] = set()
            for P, c in top.items():
                if not len(c):
                    continue
                inside = c[(c > lo_v[P]) & (c < hi_v[P])]
                if math.isinf(hi_v[P]):
                    want.add(float(c[-1]))
                if len(inside) > 1 or (len(inside) == 1 and math.isinf(hi_v[P])):
                    q = np.linspace(0, len(inside) - 1, min(len(inside), QUANTILES)).round().astype(np.int64)
                    want.update(float(x) for x in inside[np.unique(q)])
            if not want:
                break
            ths = np.asarray(sorted(want))
            if len(ths) > BATCH:
                ths = ths[np.unique(np.linspace(0, len(ths) - 1, BATCH).round().astype(np.int64))]
            ok = self._sweep(self._tables(ths, None, by), Pmax, True) >= self.N - 0.5
            for P in hi:
                for t, good in zip(ths.tolist(), ok[:, P].tolist()):
                    if good:
                        hi_v[P] = min(hi_v[P], t)
                    else:
                        lo_v[P] = max(lo_v[P], t)
        out = {}
        for P, c in top.items():
            if not len(c) or (math.isinf(hi_v[P]) and lo_v[P] >= float(c[-1])):
                out[P] = math.inf  # does not cover even at its largest admissible value
                continue
            above = c[c > lo_v[P]]
            out[P] = float(above[0]) * (1 - 2 * SLACK) if len(above) else math.inf
        return out

    def _lagrangian(self, ths: np.ndarray, Pmax: int, lams: np.ndarray | None = None) -> np.ndarray:
        """``[threshold, P]``: the best over the multipliers (default :data:`LAMBDAS` times the threshold
        per layer) of the Lagrangian bound on ``sum tau`` of depth-``P`` plans whose stages all take at
        most the threshold."""
        m = np.asarray(LAMBDAS) / self.N if lams is None else np.asarray(lams)
        rows = np.repeat(ths, len(m))
        lam = (rows if lams is None else np.ones_like(rows)) * np.tile(m, len(ths))
        vals = self._sweep(self._tables(rows, lam), Pmax, False) + lam[:, None] * self.N
        return vals.reshape(len(ths), len(m), Pmax + 1).max(axis=1)

    def _floor(self, Pmax: int) -> np.ndarray:
        """Per depth, a Lagrangian floor on ``sum tau`` with no stage-time limit; the multipliers span the
        per-layer times of the middle stages (the fastest one times powers of two)."""
        mid = self.items["mid"]
        per = mid.eff / np.maximum(mid.n, 1) if len(mid.eff) else self.cands / self.N
        lams = float(per.min()) * 2.0 ** np.arange(FLOOR_SPAN)
        return np.maximum(0.0, self._lagrangian(np.asarray([float(self.cands[-1])]), Pmax, lams)[0])

    def _late(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def depth_bounds(self, cutoff: float = math.inf, deadline: float | None = None) -> dict[int, float]:
        """A lower bound per depth on every plan of the sub-problem that costs less than ``cutoff``
        (``cutoff`` itself where none can); see the module doc for the steps. Past ``deadline``
        (``perf_counter``) the steps left are skipped: the bounds so far stand (still valid, only weaker),
        and depths not reached yet are left out."""
        self.deadline = deadline
        #: per depth, the bottleneck bound on ``tau_max`` of its plans below the cutoff (inf: none)
        self.tau_lo: dict[int, float] = {}
        depths = list(self.sub.depths)
        out = {P: min(cutoff, self.single) for P in depths if P == 1}
        depths = [P for P in depths if P >= 2]
        if not depths or not len(self.cands):  # no stage fits anywhere: no plan of these depths
            return {**out, **dict.fromkeys(depths, cutoff)}
        Pmax = max(depths)
        top = float(self.cands[-1])
        floor = self._floor(Pmax)
        if self._late():
            return dict(sorted(out.items()))
        sigma = {P: max(self.sync_last, float(self.sync_first[min(P, self.K + 1)])) for P in depths}
        t_hi = {}
        for P in depths:
            h = top
            if self.beta > 0 and math.isfinite(cutoff):
                h = min(h, (cutoff - sigma[P] - self.alpha * floor[P]) / self.beta)
            if not math.isfinite(sigma[P]) or h < self.cands[0]:
                out[P] = cutoff
            else:
                t_hi[P] = h
        if not t_hi:
            return dict(sorted(out.items()))
        tau = self._bottlenecks(self.cands, t_hi, "eff")
        self.tau_lo.update(tau)
        live = {P: t for P, t in tau.items() if math.isfinite(t)}
        out.update({P: cutoff for P in tau if P not in live})
        if not live:
            return dict(sorted(out.items()))
        Pmax = max(live)
        if self.beta <= 0 or self._late():  # (out of time: the bottleneck and the floor alone)
            lb = {P: self.beta * t + self.alpha * floor[P] for P, t in live.items()}
        else:
            # tau_max in [p_i, p_i+1): at least beta p_i + alpha S(p_i+1), on one grid for every depth
            # (a depth's last point is the first grid point at or above its t_hi: S there is no larger)
            t0 = min(live.values())
            grid = [t0]
            step = STEP
            while grid[-1] < max(t_hi[P] for P in live):
                grid.append(grid[-1] * (1 + step))
                step *= 2
            g = np.asarray(grid)
            S = np.maximum(self._lagrangian(g, Pmax), floor[None, : Pmax + 1])
            lb = {}
            for P, t in live.items():
                inner = [i for i, x in enumerate(grid) if t < x < t_hi[P]]
                last = next(i for i, x in enumerate(grid) if x >= t_hi[P])
                pts = [t, *(grid[i] for i in inner)]
                lb[P] = min(self.beta * p + self.alpha * float(S[i, P]) for p, i in zip(pts, [*inner, last]))
        need = {P: t_hi[P] for P in live if lb[P] + sigma[P] < cutoff}
        if need and not self._late():  # the sync bottleneck (a few more passes) only for depths still open
            sync_cands = np.unique(np.concatenate([it.sync for it in self.items_sync.values()]))
            ys = self._bottlenecks(sync_cands, dict.fromkeys(need, float(sync_cands[-1])), "sync")
            for P, y in ys.items():
                sigma[P] = max(sigma[P], y)
        out.update({P: min(cutoff, lb[P] + sigma[P]) for P in live})
        return dict(sorted(out.items()))


def _reduce(
    cls: np.ndarray, n: np.ndarray, eff: np.ndarray, sync: np.ndarray, kmax: np.ndarray, swap: bool = False
) -> _Items:
    """Per (class, layer count), the items on the front of low ``eff`` and high ``kmax`` (the others are
    never the best at any threshold and position; the sync floors are taken before this)."""
    if not len(cls):
        z = np.zeros(0)
        return _Items(cls.astype(np.int64), n.astype(np.int64), z, z, kmax.astype(np.int64))
    order = np.lexsort((-kmax, eff, n, cls))
    cls, n, eff, sync, kmax = cls[order], n[order], eff[order], sync[order], kmax[order]
    grp = np.r_[True, (cls[1:] != cls[:-1]) | (n[1:] != n[:-1])]
    gid = np.cumsum(grp) - 1
    # running max of kmax within each group (sorted by eff): an item is on the front if it raises it
    offset = gid * (int(kmax.max()) + 2)
    run = np.maximum.accumulate(kmax + offset) - offset
    prev = np.r_[-1, run[:-1]]
    keep = grp | (kmax > np.where(grp, -1, prev))
    if swap:  # reduced over the second value (sync): give the fields back their names
        return _Items(cls[keep], n[keep], sync[keep], eff[keep], kmax[keep])
    return _Items(cls[keep], n[keep], eff[keep], sync[keep], kmax[keep])


def device_grid(
    priced: Iterable[dict[str, np.ndarray]], types: list[int], inv: Sequence[int]
) -> tuple[dict[int, int], dict[int, int]]:
    """Per device type, the gcd of every priced stage's device count (the unit the bounds count devices in)
    and how many such units the cluster holds: counting in units keeps the bound DPs' tables small."""
    unit: dict[int, int] = {}
    for r in priced:
        for j, g in zip(r["typ"].tolist(), r["size"].tolist()):
            unit[j] = math.gcd(unit.get(j, 0), g)
    units = {j: unit.get(j, 1) or 1 for j in types}
    return units, {j: inv[j] // units[j] for j in types}


def price_stages(sub: SubProblem, s: np.ndarray, e: np.ndarray, fam: str, K: int) -> dict[str, np.ndarray]:
    """Every (option, range ``[s, e)``) of a stage family (``mid``, ``first``, ``last`` or ``both``) that is
    valid and fits memory somewhere among positions ``1..K`` from the end, as flat arrays: option, device
    type index, size, range, layers, ``eff`` (time plus twice the cheapest p2p; the last stage sends nothing),
    sync and ``kmax`` (the deepest position that fits: plain in-flight counts only grow towards the front)."""
    sides = {"mid": (), "first": ("first",), "last": ("last",), "both": ("single",)}[fam]
    v = sub.range_values(s, e, sides)
    valid = np.isfinite(v["time"])
    if sub.layer_band:
        n = (e - s)[None, :]
        lo = np.asarray([o.band[0] for o in sub.options])[:, None]
        hi = np.asarray([o.band[1] for o in sub.options])[:, None]
        valid &= (n >= lo) & (n <= hi)
    if fam in ("first", "both"):
        valid &= sub.first_ok[:, None]
    kmax = np.zeros(valid.shape, dtype=np.int64)
    positions = [1] if fam in ("last", "both") else list(range(2, K + 1))
    alive = valid.copy()
    cap = sub.cap[:, None] * (1 + SLACK)
    prev = None
    for k in positions:
        infl = sub.in_flight(k, k)
        if prev is not None and infl == prev:
            kmax[alive] = k
            continue
        alive &= v["w"] + infl * v["a"] + v["fixed"] <= cap
        kmax[alive] = k
        prev = infl
        if not alive.any():
            break
    oi, ri = np.nonzero(kmax > 0)
    p2p = 0.0 if fam in ("last", "both") else 2 * sub.pmin[oi]
    return {
        "opt": oi,
        "typ": sub.tix[oi],
        "size": sub.size[oi],
        "s": s[ri],
        "e": e[ri],
        "n": (e - s)[ri],
        "eff": v["time"][oi, ri] + p2p,
        "sync": v["sync"][oi, ri],
        "kmax": kmax[oi, ri],
    }


__all__ = ["BlockBounds", "price_stages"]
