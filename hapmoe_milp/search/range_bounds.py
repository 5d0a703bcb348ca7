"""Depth bounds that count every layer exactly: a threshold DP over (devices, layers from the end).

:mod:`~hapmoe_milp.search.block_bounds` bounds every depth of a plain sub-problem in a few passes, but it
relaxes the layers twice: a middle stage is a *window* of the leading block's kind (several stages may
claim the same cheap dense layers) and the layer count is dualised (a Lagrangian over a few multipliers).
On DeepSeek-V3 at 256 devices that leaves 0.2-2.5% between the bound and the best plan on the few
depths it cannot close, and CP-SAT does not close them in a minute either. This module closes them with
a bound in which the layers are exact: a plan's stages, from the last one up, hold ``[N - r - n, N - r)``
where ``r`` is the number of layers the stages behind it hold, so a DP whose state counts ``r`` prices
every stage at its own range (``SubProblem.range_values``, exactly as ``Instance.evaluate``) and holds
each layer exactly once. It is run only on the depths the block bounds leave open (a few per
sub-problem), under the incumbent as cutoff.

- *State.* Per device type ``j`` (one or two; two are contiguous blocks, as in the block bounds): a back
  block of type ``j`` from the last stage, and a front block of ``j`` above the other type's finished
  back block (whose devices no longer matter: the inventory is per type). Each is a table over devices
  used (in units of the gcd of the type's stage sizes; a usage fits exactly when its units fit), layers
  held ``r`` and what the top stage is: its class (device type and size, which fix its link class, so
  the next stage up pays its exact p2p to it) and, where the runtime's meshes after the first need two
  stages (FlagScale), whether its run of one class is still open (one stage). A mesh is one device type
  and parallel config, hence one class: a plan's meshes are runs of one class, so a run of one stage
  may only be the first (front-most) mesh, and counting runs by class only admits more plans. A first
  stage ``[0, N - r)`` closes a state at every position: every depth at once.
- *Threshold.* ``S_P(T)``: the least ``sum eff`` over depth-``P`` stage sequences whose every stage has
  ``eff <= T`` and fits its position's memory (plain 1F1B in-flight counts grow towards the front, so an
  item records the deepest position from the end it fits: ``kmax``), where ``eff`` is the stage's time
  plus twice its p2p to the stage behind it (the last stage sends nothing): exactly the stage's
  ``tau``. ``S_P`` does not increase with ``T``.
- *Depth bound.* Every plan's largest ``eff`` ``E`` is one of the candidates ``c`` (all item ``eff``
  values), and the plan costs at least ``beta E + alpha S_P(E) + sigma_lo``. Over a range of candidates
  ``c[i..j]`` that is at least ``beta c[i] + alpha S_P(c[j]) + sigma_lo``; above the candidate at which
  ``beta c + alpha S_P(inf) + sigma_lo`` reaches the cutoff nothing can beat it, and below a known lower
  bound on ``E`` (the block bounds' bottleneck: their ``eff`` uses the cheapest p2p, never more) there is
  no plan. The ranges start as a coarse grid; each round drops the ranges at or above the cutoff and
  halves the least one of every depth (a range of one candidate is exact: the relaxation's optimum for
  that ``E``). One threshold DP serves every depth. ``sigma_lo`` is the least sync of a last stage and
  of a first stage that fit.

Relaxed on purpose (each only admits more plans): node alignment, one-size-per-type, the edge stages'
TP/DP rules and the mesh rule beyond "runs of one size" are ignored; times and memory get the block
bounds' relative slack. Applies where the block bounds do (plain schedule, one or two device types,
two only as contiguous blocks); the ranges are exact whatever the layer kinds. The exact search
(:mod:`~hapmoe_milp.search.exact`) runs it at scale on the depths the block bounds leave open.
tests/test_search_range_bounds.py checks every depth bound against brute-force depth optima, with and
without FlagScale's rules.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import TYPE_CHECKING

import numpy as np

from hapmoe_milp.search.block_bounds import SLACK, device_grid, price_stages

if TYPE_CHECKING:
    from hapmoe_milp.search.formulation import SubProblem

#: Rounds of range splitting after the first grid (each evaluates a threshold per open depth).
REFINE_ROUNDS = 12
#: First grid: this many ranges of candidate thresholds per depth.
GRID = 6
#: Largest stage table (classes x link classes x positions x ranges) the bound builds: past it a pass
#: takes seconds and hundreds of MB, and the block bounds stand alone.
MAX_TABLE = 4_000_000


class RangeBounds:
    """Exact-layer depth bounds of one plain sub-problem (see the module doc)."""

    def __init__(self, sub: SubProblem, depths: list[int]) -> None:
        self.sub = sub
        self.N = N = sub.N
        self.alpha, self.beta = sub.alpha, sub.beta
        self.depths = sorted(P for P in depths if P >= 2)
        self.Pmax = K = max(self.depths) if self.depths else 0
        self.types = sorted({int(j) for j in sub.tix.tolist()})
        self.L = len(sub.classes)  # link classes: what the stage behind a stage is, for its p2p
        self.passes = 0
        if not self.depths:
            return
        s_mid, e_mid = np.triu_indices(N + 1, k=1)
        keep = (s_mid >= 1) & (e_mid <= N - 1)
        fams = {
            "mid": (s_mid[keep], e_mid[keep]),
            "first": (np.zeros(N - 1, dtype=np.int64), np.arange(1, N, dtype=np.int64)),
            "last": (np.arange(1, N, dtype=np.int64), np.full(N - 1, N, dtype=np.int64)),
        }
        raw = {f: price_stages(sub, s.astype(np.int64), e.astype(np.int64), f, K) for f, (s, e) in fams.items()}
        self.unit, self.grid = device_grid(raw.values(), self.types, sub.inv)
        keys: dict[tuple[int, int, int], int] = {}
        self.raw = {}
        for fam, r in raw.items():
            g = r["size"] // np.asarray([self.unit[int(j)] for j in r["typ"]], dtype=np.int64).reshape(-1)
            link = sub.cls[r["opt"]]
            cls = [keys.setdefault((int(j), int(u), int(lc)), len(keys)) for j, u, lc in zip(r["typ"], g, link)]
            # exact p2p to each link class of the stage behind (price_stages adds the cheapest one)
            eff = r["eff"][:, None] + (0.0 if fam == "last" else 2 * (sub.p2p[r["opt"]] - sub.pmin[r["opt"], None]))
            if fam == "last":
                eff = np.broadcast_to(eff, (len(eff), self.L))
            self.raw[fam] = {**r, "cls": np.asarray(cls, dtype=np.int64), "effl": np.ascontiguousarray(eff)}
        self.classes = sorted(keys, key=keys.get)  # type: ignore[arg-type]
        self.C = len(self.classes)
        self.by_type = {j: [c for c, key in enumerate(self.classes) if key[0] == j] for j in self.types}
        #: the runtime's meshes after the first hold at least two stages: a mesh is one device type and
        #: config, so one class (type, size); runs of one class are tracked (open: one stage so far)
        self.runs = sub.rules.mesh_min_stages >= 2
        self.cands = np.unique(np.concatenate([r["effl"].ravel() for r in self.raw.values()]))
        self.sync_last = float(raw["last"]["sync"].min()) if len(raw["last"]["sync"]) else math.inf
        first_sync = np.full(K + 2, np.inf)
        np.minimum.at(first_sync, np.minimum(raw["first"]["kmax"], K + 1), raw["first"]["sync"])
        self.sync_first = np.minimum.accumulate(first_sync[::-1])[::-1]

    # ------------------------------------------------------------------ one threshold
    def _table(self, fam: str, T: float) -> np.ndarray:
        """``[class, link class behind, position, r, n]``: the least ``eff <= T`` of a stage of that class
        holding ``n`` layers with ``r`` layers behind it that fits at that position or deeper (inf: none)."""
        r = self.raw[fam]
        N, K, L = self.N, self.Pmax, self.L
        tab = np.full((self.C, L, K + 2, N + 1, N + 1), np.inf)
        ok = r["effl"] <= T * (1 + SLACK)
        ii, ll = np.nonzero(ok)
        idx = (r["cls"][ii], ll, np.minimum(r["kmax"][ii], K + 1), N - r["e"][ii], r["n"][ii])
        np.minimum.at(tab, idx, r["effl"][ii, ll])
        for k in range(K, 0, -1):  # fits at position k: fits at k or deeper
            np.minimum(tab[:, :, k], tab[:, :, k + 1], out=tab[:, :, k])
        return tab

    def sums(self, T: float) -> np.ndarray:
        """``S_P(T)`` for ``P = 0..Pmax`` (inf where no depth-``P`` sequence of stages with ``eff <= T``
        holds every layer)."""
        self.passes += 1
        N, K, L = self.N, self.Pmax, self.L
        tabs = {f: self._table(f, T) for f in ("mid", "first", "last")}
        out = np.full(K + 1, np.inf)
        two = len(self.types) == 2
        state = {}
        for j in self.types:
            cl = self.by_type[j]
            st = np.full((1 + two, 2 * len(cl) + L, self.grid[j] + 1, N + 1), np.inf)
            for ci, c in enumerate(cl):
                g = self.classes[c][1]
                if g <= self.grid[j]:  # the last stage opens a run (closes it when runs are not counted)
                    e = ci if self.runs else len(cl) + ci
                    np.minimum(st[0, e, g, :], tabs["last"][c, 0, 1, 0, :], out=st[0, e, g, :])
            state[j] = st
        for k in range(2, K + 1):
            if two:  # a front block of type j starts above the other type's finished (closed) back block
                for j in self.types:
                    o = self.types[1] if j == self.types[0] else self.types[0]
                    co = len(self.by_type[o])
                    done = np.full((L, N + 1), np.inf)
                    for ci, c in enumerate(self.by_type[o]):
                        lc = self.classes[c][2]
                        np.minimum(done[lc], state[o][0, co + ci].min(axis=0), out=done[lc])
                    cj = len(self.by_type[j])
                    np.minimum(state[j][1, 2 * cj :, 0, :], done, out=state[j][1, 2 * cj :, 0, :])
            for j in self.types:
                out[k] = min(out[k], self._close(state[j], tabs["first"][:, :, k], j))
            if k < K:
                mid = tabs["mid"][:, :, k]
                for j in self.types:
                    state[j] = self._step(state[j], mid, j)
        return out

    def _by_link(self, st: np.ndarray, j: int) -> np.ndarray:
        """``[block, link, units, r]``: the least closed state (a finished run, or the other type's back
        block) per link class of its top stage."""
        cl = self.by_type[j]
        out = st[:, 2 * len(cl) :].copy()
        for ci, c in enumerate(cl):
            lc = self.classes[c][2]
            np.minimum(out[:, lc], st[:, len(cl) + ci], out=out[:, lc])
        return out

    def _close(self, st: np.ndarray, first: np.ndarray, j: int) -> float:
        """The least sum after a first stage of type ``j`` tops the states (``first``: ``[class, link, r,
        n]`` at this position): it may start the first mesh above a closed state, or join its own class's
        run (an open run of another class would be a mesh of one stage that is not the first)."""
        N, cl = self.N, self.by_type[j]
        U = self.grid[j]
        rr = np.arange(N + 1)
        n_first = np.clip(N - rr, 0, N)
        closed = np.minimum.accumulate(self._by_link(st, j).min(axis=0), axis=1)  # [link, units, r]: up to
        best = math.inf
        for ci, c in enumerate(cl):
            g, lc = self.classes[c][1], self.classes[c][2]
            if g > U:
                continue
            cost = first[c][:, rr, n_first]  # [link, r]: the first stage holds [0, N - r)
            cost[:, N] = np.inf
            best = min(best, float((closed[:, U - g, :] + cost).min()))
            own = np.minimum.accumulate(st[:, ci].min(axis=0), axis=0)  # open run of this class
            best = min(best, float((own[U - g] + cost[lc]).min()))
        return best

    def _step(self, st: np.ndarray, mid: np.ndarray, j: int) -> np.ndarray:
        """One middle stage of type ``j`` appended to ``[block, entry, units, r]`` states (entries: open run
        per class, closed run per class, the other type's finished block per link class): it opens a run
        of its class above a closed state, or closes/extends its own class's run. Each is a min-plus
        product over ``r`` (only over the units and blocks that hold a state)."""
        N, cl = self.N, self.by_type[j]
        U = self.grid[j]
        new = np.full(st.shape, np.inf)
        rr = np.arange(N + 1)
        n = rr[None, :] - rr[:, None]  # M[r, r2] = mid[r, r2 - r]: a stage holding [N - r2, N - r)
        valid = n > 0
        nn = np.clip(n, 0, N)
        closed = self._by_link(st, j)
        for ci, c in enumerate(cl):
            g, lc = self.classes[c][1], self.classes[c][2]
            if g > U:
                continue
            to = ci if self.runs else len(cl) + ci
            for lk in range(self.L):  # open a run (or, runs not counted, extend the sequence)
                self._product(closed[:, lk], np.where(valid, mid[c, lk][rr[:, None], nn], np.inf), g, U, new[:, to])
            own = np.minimum(st[:, ci], st[:, len(cl) + ci])  # close or extend this class's run
            self._product(own, np.where(valid, mid[c, lc][rr[:, None], nn], np.inf), g, U, new[:, len(cl) + ci])
        return new

    @staticmethod
    def affordable(sub: SubProblem, depths: list[int]) -> bool:
        """Is one threshold pass small enough (:data:`MAX_TABLE`) for these depths?"""
        classes = len({(int(j), int(g)) for j, g in zip(sub.tix.tolist(), sub.size.tolist())})
        return bool(depths) and classes * len(sub.classes) * (max(depths) + 2) * (sub.N + 1) ** 2 <= MAX_TABLE

    @staticmethod
    def _product(src: np.ndarray, M: np.ndarray, g: int, U: int, dst: np.ndarray) -> None:
        """``dst[b, u + g, r2] = min(dst, min_r src[b, u, r] + M[r, r2])`` over the live part of ``src``."""
        if not np.isfinite(M).any():
            return
        live = np.isfinite(src).any(axis=-1)  # [block, units]
        if not live.any():
            return
        bs = np.flatnonzero(live.any(axis=1))
        b0, b1 = int(bs[0]), int(bs[-1]) + 1
        us = np.flatnonzero(live[b0:b1].any(axis=0))
        u0, u1 = int(us[0]), min(int(us[-1]), U - g) + 1
        if u1 <= u0:
            return
        cand = (src[b0:b1, u0:u1, :, None] + M[None, None]).min(axis=2)
        view = dst[b0:b1, u0 + g : u1 + g, :]
        np.minimum(view, cand, out=view)

    # ------------------------------------------------------------------ bounds
    def depth_bounds(
        self, cutoff: float = math.inf, deadline: float | None = None, t0: dict[int, float] | None = None
    ) -> dict[int, float]:
        """A lower bound per depth on every plan of the sub-problem costing less than ``cutoff`` (``cutoff``
        where none can). ``t0``: a known lower bound on the largest stage ``eff`` per depth (e.g. the block
        bounds' bottleneck, whose ``eff`` is never above this module's); else none. Past ``deadline``
        (``perf_counter``) the refinement stops and the bounds so far stand (weaker, still valid); past it
        before the first pass, there are none (an empty dict)."""
        if not self.depths:
            return {}
        if not len(self.cands):
            return dict.fromkeys(self.depths, cutoff)
        c = self.cands
        cache: dict[int, np.ndarray] = {}
        if deadline is not None and time.perf_counter() > deadline:
            return {}

        def S(i: int) -> np.ndarray:
            if i not in cache:
                cache[i] = self.sums(float(c[i]))
            return cache[i]

        floor = S(len(c) - 1)  # S_P(inf): every stage that fits anywhere
        out: dict[int, float] = {}
        sigma = {P: max(self.sync_last, float(self.sync_first[P])) for P in self.depths}
        ranges: dict[int, list[tuple[int, int]]] = {}
        for P in self.depths:
            if not math.isfinite(floor[P]):
                out[P] = cutoff  # no depth-P sequence of stages holds every layer
                continue
            lo = int(np.searchsorted(c, (t0 or {}).get(P, -math.inf) * (1 - 2 * SLACK), side="left"))
            if self.beta <= 0 or not math.isfinite(cutoff):
                top = len(c) - 1
            else:  # a largest eff above c[top] already costs the cutoff with the floor
                lim = (cutoff - sigma[P] - self.alpha * floor[P]) / self.beta
                top = int(np.searchsorted(c, lim * (1 + 2 * SLACK), side="right")) - 1
            if top < lo:
                out[P] = cutoff
                continue
            edges = np.unique(np.linspace(lo, top + 1, min(GRID, top + 1 - lo) + 1).round().astype(np.int64))
            ranges[P] = [(int(a), int(b) - 1) for a, b in itertools.pairwise(edges.tolist())]

        def lb(P: int, i: int, j: int) -> float:
            """Every plan whose largest stage eff is one of c[i..j]: beta c[i] + alpha S(c[j]) + sigma."""
            s = cache[j][P] if j in cache else floor[P]
            return self.beta * float(c[i]) + self.alpha * float(s) + sigma[P]

        for _ in range(REFINE_ROUNDS + 1):
            want = {j for rs in ranges.values() for _, j in rs if j not in cache}
            for j in sorted(want):
                if deadline is not None and time.perf_counter() > deadline:
                    break
                S(j)
            if deadline is not None and time.perf_counter() > deadline:
                break
            split = False
            for P, rs in ranges.items():
                # ranges that reach the cutoff are done; the least one is split (a leaf is exact)
                rs[:] = [(i, j) for i, j in rs if lb(P, i, j) < cutoff]
                if not rs:
                    continue
                i, j = min(rs, key=lambda r: lb(P, *r))
                if i < j:
                    m = (i + j) // 2
                    rs.remove((i, j))
                    rs.extend([(i, m), (m + 1, j)])
                    split = True
            if not split:
                break
        for P, rs in ranges.items():
            out[P] = min([cutoff, *(lb(P, i, j) for i, j in rs)])
        return dict(sorted(out.items()))


__all__ = ["RangeBounds"]
