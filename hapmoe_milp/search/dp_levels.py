"""The vectorised label DP: one pass over pipeline depth, every state and label of a batch at once.

Same algorithm as the reference (:mod:`hapmoe_milp.search.dp_reference`): stages are placed from the
last to the first; a state is (sub-problem, first layer of the placed suffix, devices used per type, type
and size class of the stage placed last, device types seen); each state keeps the Pareto front of
``(sum tau, max tau, max sync)`` labels. What changes is the representation -- states and labels are
numpy arrays, and each level extends all of them together -- and the bounds, which are stronger but
still valid lower bounds (see :mod:`hapmoe_milp.search.dp_tables`), so exactness with every pruning
switch off is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hapmoe_milp.instance import Option
from hapmoe_milp.search.dp_tables import (
    AG,
    OP,
    RS,
    WORK,
    A,
    B,
    Batch,
    Bounds,
    Clock,
    F,
    SubProblem,
    W,
    aligned_vec,
    capacity_bound,
)
from hapmoe_milp.space import PruneCounter

# label expansions per chunk (bounds memory when little is pruned, e.g. with every switch off)
CHUNK = 400_000


@dataclass(frozen=True)
class Chain:
    """A complete plan found by the DP: stages first to last as (option, start, end), and its batch group."""

    stages: tuple[tuple[Option, int, int], ...]
    group: int
    vpp: int

    def same(self, other: Chain) -> bool:
        return (
            self.vpp == other.vpp
            and len(self.stages) == len(other.stages)
            and all(a[0] is b[0] and a[1] == b[1] for a, b in zip(self.stages, other.stages, strict=True))
        )


@dataclass
class Best:
    """The best and second-best plans found so far (the second differs from the first)."""

    value: float = math.inf
    chain: Chain | None = None
    sub: SubProblem | None = None
    second_value: float = math.inf
    second_chain: Chain | None = None
    second_sub: SubProblem | None = None

    def offer(self, value: float, chain: Chain, sub: SubProblem) -> None:
        if value < self.value:
            if self.chain is not None and not self.chain.same(chain):
                self.second_value, self.second_chain, self.second_sub = self.value, self.chain, self.sub
            self.value, self.chain, self.sub = value, chain, sub
        elif value < self.second_value and (self.chain is None or not self.chain.same(chain)):
            self.second_value, self.second_chain, self.second_sub = value, chain, sub


@dataclass
class _History:
    """Every label ever kept, so a plan can be read back from its last label (parent pointers)."""

    rows: list[np.ndarray] = field(default_factory=list)
    starts: list[np.ndarray] = field(default_factory=list)
    ends: list[np.ndarray] = field(default_factory=list)
    parents: list[np.ndarray] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    size: int = 0

    def add(self, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray, parents: np.ndarray) -> np.ndarray:
        ids = np.arange(self.size, self.size + len(rows), dtype=np.int64)
        self.offsets.append(self.size)
        self.rows.append(rows)
        self.starts.append(starts)
        self.ends.append(ends)
        self.parents.append(parents)
        self.size += len(rows)
        return ids

    def walk(self, hid: int) -> list[tuple[int, int, int]]:
        out = []
        while hid >= 0:
            j = int(np.searchsorted(self.offsets, hid, side="right")) - 1
            i = hid - self.offsets[j]
            out.append((int(self.rows[j][i]), int(self.starts[j][i]), int(self.ends[j][i])))
            hid = int(self.parents[j][i])
        return out  # last stage first


def _ranges(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For runs of ``counts[i]`` items: the run each item belongs to and its offset inside the run."""
    owner = np.repeat(np.arange(len(counts)), counts)
    start = np.cumsum(counts) - counts
    return owner, np.arange(len(owner)) - start[owner]


def _capacity_unique(
    bd: Bounds, grp: np.ndarray, s: np.ndarray, rem: np.ndarray, G: int, N: int, inv: np.ndarray
) -> np.ndarray:
    """:func:`capacity_bound` evaluated once per distinct (group, start, remaining devices)."""
    T = rem.shape[1]
    key = _pack([grp, s, *[rem[:, t] for t in range(T)]], [G, N + 1, *[int(inv[t]) + 1 for t in range(T)]])
    if key is None:
        return capacity_bound(bd, grp, s, rem)
    _uk, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    vals = capacity_bound(bd, grp[first], s[first], rem[first])
    return vals[inverse.ravel()]


def _seg_min(values: np.ndarray, seg: np.ndarray, n: int) -> np.ndarray:
    out = np.full(n, np.inf)
    np.minimum.at(out, seg, values)
    return out


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
    # 2. the rest of the (tot, tm)-dominated labels: compare with every earlier label of their key
    idx = np.flatnonzero(dom2 & ~sure)
    d = 1
    while len(idx):
        idx = idx[pos[idx] >= d]
        if not len(idx):
            break
        j = idx - d
        hit = (tm[j] <= tm[idx]) & (sm[j] <= sm[idx]) & (tot[j] <= tot[idx])
        keep[idx[hit]] = False
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


def _pack(cols: list[np.ndarray], radix: list[int]) -> np.ndarray | None:
    """Mixed-radix int64 key of integer columns, or None when it would overflow."""
    if math.prod(radix) >= 2**62:
        return None
    key = np.zeros(len(cols[0]), dtype=np.int64)
    for c, r in zip(cols, radix, strict=True):
        key = key * r + c
    return key


def run_batch(
    batch: Batch,
    best: Best,
    counter: PruneCounter,
    clock: Clock,
) -> bool:
    """Run the DP over every group of ``batch``; offer complete plans to ``best``. False if the clock ran out."""
    inst0 = batch.subs[0].inst
    pr = inst0.pruning
    st = inst0.settings
    T = len(batch.types)
    N = batch.n_layers
    G = batch.n_groups
    inv, node = batch.inv, batch.node
    kc = batch.kind_count
    NTG = len(batch.tg_t)
    present = np.flatnonzero(kc[:, -1] > 0)
    mtp_n = sum(1 for k in inst0.model.layer_kinds if k == "mtp")

    hist = _History()
    # level-0 states: one root per group
    s_grp = np.arange(G, dtype=np.int64)
    s_e = np.full(G, N, dtype=np.int64)
    s_used = np.zeros((G, T), dtype=np.int64)
    s_nd = np.full(G, -1, dtype=np.int64)
    s_ng = np.zeros(G, dtype=np.int64)
    s_seen = np.zeros(G, dtype=np.int64)
    l_st = np.arange(G, dtype=np.int64)
    l_tot = np.zeros(G)
    l_tmx = np.zeros(G)
    l_smx = np.zeros(G)
    l_hist = np.full(G, -1, dtype=np.int64)
    n_bound = n_mem = n_pareto = n_minrec = n_cross = n_cap = 0
    kmax_all = int(batch.kmax.max())
    alpha, beta = batch.alpha, batch.beta

    def finish() -> None:
        counter.add("bound", n_bound)
        counter.add("memory_bound", n_mem)
        counter.add("pareto", n_pareto)
        counter.add("min_recompute", n_minrec)
        counter.add("cross_type_comm", n_cross)
        counter.add("max_stages", n_cap)

    for k in range(1, kmax_all + 1):
        if clock.passed():
            finish()
            return False
        if len(l_st) == 0:
            break
        # ---- 1. labels that can no longer beat the best plan
        lg = s_grp[l_st]
        bd_now = batch.bounds(k)  # the layers still to place sit k or more stages from the end
        t_rest = capacity_bound(bd_now, s_grp, s_e, inv[None, :] - s_used)
        tr = t_rest[l_st]
        with np.errstate(invalid="ignore"):
            lb = alpha[lg] * (l_tot + bd_now.sum_pre[lg, s_e[l_st]]) + beta[lg] * np.maximum(l_tmx, tr) + l_smx
        keep = (lb < best.value) & np.isfinite(tr)  # inf: the remaining devices cannot hold the layers
        if not keep.all():
            n_bound += int((~keep).sum())
            l_st, l_tot, l_tmx, l_smx, l_hist = l_st[keep], l_tot[keep], l_tmx[keep], l_smx[keep], l_hist[keep]
            if len(l_st) == 0:
                break
            alive = np.zeros(len(s_grp), dtype=bool)
            alive[l_st] = True
            remap = np.cumsum(alive) - 1
            s_grp, s_e, s_used, s_nd, s_ng, s_seen = (
                s_grp[alive],
                s_e[alive],
                s_used[alive],
                s_nd[alive],
                s_ng[alive],
                s_seen[alive],
            )
            l_st = remap[l_st]
        nS = len(s_grp)
        l_cnt = np.bincount(l_st, minlength=nS)
        l_start = np.r_[0, np.cumsum(l_cnt)[:-1]]
        s_mt = np.minimum.reduceat(l_tot, l_start)
        s_mx = np.minimum.reduceat(l_tmx, l_start)
        s_ms = np.minimum.reduceat(l_smx, l_start)

        bd = batch.bounds(k + 1)  # after this stage, the rest sit k + 1 or more from the end
        # ---- 2. candidate stages (option, start) for every (group, end) present
        ge_keys, s_ge = np.unique(s_grp * (N + 1) + s_e, return_inverse=True)
        ge_g, ge_e = np.divmod(ge_keys, N + 1)
        nge = len(ge_keys)
        lo_tot = _seg_min(s_mt, s_ge, nge)
        lo_tmx = _seg_min(s_mx, s_ge, nge)
        lo_smx = _seg_min(s_ms, s_ge, nge)
        nrows = batch.grp_hi[ge_g] - batch.grp_lo[ge_g]
        X, xoff = _ranges(nrows)
        row = batch.grp_lo[ge_g][X] + xoff
        gi = ge_g[X]
        e = ge_e[X]
        v = batch.vpp[gi]
        n_lo = np.maximum(batch.lo[row], v)
        n_hi = np.minimum(batch.hi[row], e)
        fixed_pp = batch.pp[gi]
        if k == 1 and mtp_n > 1:
            n_lo = np.where(v > 1, np.maximum(n_lo, v + mtp_n - 1), n_lo)
        # the last allowed stage must start at layer 0; a fixed depth leaves v layers per later stage
        must_first = np.where(fixed_pp > 0, fixed_pp == k, batch.kmax[gi] == k)
        capped = (fixed_pp == 0) & (batch.kmax[gi] == k) & batch.capped[gi] & (e > n_lo)
        if capped.any():
            n_cap += int(capped.sum())
        n_lo = np.where(must_first, np.maximum(n_lo, e), n_lo)
        n_hi = np.where((fixed_pp > 0) & (fixed_pp > k), np.minimum(n_hi, e - (fixed_pp - k) * v), n_hi)
        if math.isfinite(best.value):
            tcap = (best.value - alpha[gi] * lo_tot[X] - lo_smx[X]) / (alpha[gi] + beta[gi])
            tm = batch.tmin[row]
            with np.errstate(divide="ignore", invalid="ignore"):
                n_t = np.where(tm > 0, np.floor(tcap / np.where(tm > 0, tm, 1.0)), N)
            n_hi = np.minimum(n_hi, np.clip(n_t, -1, N).astype(np.int64))
        infl_k = batch.infl[gi, k]
        mrow = batch.coef[row][:, present, W] + infl_k[:, None] * batch.coef[row][:, present, A]
        mmin = mrow.min(axis=1)
        budget = batch.cap[row] - batch.fixed[row]
        with np.errstate(divide="ignore", invalid="ignore"):
            n_m = np.where(mmin > 0, np.floor(budget / np.where(mmin > 0, mmin, 1.0)), N)
        n_hi = np.minimum(n_hi, np.clip(n_m, -1, N).astype(np.int64))
        cnt = np.maximum(n_hi - n_lo + 1, 0)
        C, coff = _ranges(cnt)
        n = n_lo[C] + coff
        c_x = X[C]
        c_row = row[C]
        c_g = gi[C]
        c_e = e[C]
        c_s = c_e - n
        # exact stage cost
        cnt_k = kc[:, c_e] - kc[:, c_s]  # (K, nc)
        vals = np.einsum("kn,nka->na", cnt_k.astype(float), batch.coef[c_row])
        first_on = c_s == 0
        fr = batch.first[c_row]
        vals += fr[:, :7] * first_on[:, None]
        extra = batch.fixed[c_row] + fr[:, WORK] * first_on
        if k == 1:
            lr = batch.last[c_row]
            vals += lr[:, :7]
            extra = extra + lr[:, WORK]
        fwd, bwd = vals[:, F], vals[:, B]
        mem = vals[:, W] + batch.infl[c_g, k] * vals[:, A] + extra
        rs = np.maximum(0.0, vals[:, RS] - bwd) if st.overlap_grad_reduce else vals[:, RS]
        ag = np.maximum(0.0, vals[:, AG] - fwd) if st.overlap_param_gather else vals[:, AG]
        c_sync = rs + ag + vals[:, OP]
        c_tau = fwd + bwd
        ok = mem <= batch.cap[c_row]
        ok &= ~first_on | (batch.dp[c_row] == batch.first_dp[c_g])
        lead = batch.lead[c_g]
        if lead.any():
            vv = batch.vpp[c_g]
            ok &= ~first_on | (vv <= 1) | (-(-(c_e - c_s) // vv) >= lead)
        bound_c = (
            alpha[c_g] * (lo_tot[c_x] + c_tau + bd.sum_pre[c_g, c_s])
            + beta[c_g] * np.maximum(c_tau, lo_tmx[c_x])
            + np.maximum(lo_smx[c_x], c_sync)
        )
        bad = bound_c >= best.value
        n_bound += int((ok & bad).sum())
        ok &= ~bad
        sel = np.flatnonzero(ok)
        if pr.min_recompute and len(sel):
            # the cheapest recompute level that fits (per group, end, shape, start)
            o2 = np.lexsort((batch.level[c_row[sel]], c_s[sel], batch.shape[c_row[sel]], c_x[sel]))
            sel = sel[o2]
            kx, ksh, ks = c_x[sel], batch.shape[c_row[sel]], c_s[sel]
            firstm = np.r_[True, (kx[1:] != kx[:-1]) | (ksh[1:] != ksh[:-1]) | (ks[1:] != ks[:-1])]
            n_minrec += int((~firstm).sum())
            sel = sel[firstm]
        c_x, c_row, c_g, c_s, c_e = c_x[sel], c_row[sel], c_g[sel], c_s[sel], c_e[sel]
        c_tau, c_sync, c_fb = c_tau[sel], c_sync[sel], (fwd + bwd)[sel]
        c_tg = batch.tg[c_row]
        ckey = c_x * NTG + c_tg
        o3 = np.argsort(ckey, kind="stable")
        c_x, c_row, c_g, c_s, c_e, c_tau, c_sync, c_fb, c_tg, ckey = (
            c_x[o3],
            c_row[o3],
            c_g[o3],
            c_s[o3],
            c_e[o3],
            c_tau[o3],
            c_sync[o3],
            c_fb[o3],
            c_tg[o3],
            ckey[o3],
        )
        if len(ckey) == 0:
            break

        # ---- 3. (state, candidate) pairs that the inventory and the family rules allow
        tt, gg = batch.tg_t[None, :], batch.tg_g[None, :]
        u = s_used[:, batch.tg_t]
        rem = inv[batch.tg_t][None, :] - u - gg
        valid = (rem >= 0) & aligned_vec(np.maximum(rem, 0), np.broadcast_to(gg, rem.shape), node[batch.tg_t][None, :])
        cont = batch.contiguous[s_grp][:, None]
        if cont.any():
            seen_has = ((s_seen[:, None] >> tt) & 1).astype(bool)
            valid &= ~(cont & seen_has & (s_nd[:, None] != tt))
        uni = batch.uniform[s_grp][:, None]
        if uni.any():
            valid &= ~(uni & (s_nd[:, None] == tt) & (s_ng[:, None] != gg))
        si, ti = np.nonzero(valid)
        pkey = s_ge[si] * NTG + ti
        blo = np.searchsorted(ckey, pkey, side="left")
        bhi = np.searchsorted(ckey, pkey, side="right")
        pown, poff = _ranges(bhi - blo)
        P_S = si[pown]
        P_C = blo[pown] + poff
        if len(P_S) == 0:
            break
        p_row = c_row[P_C]
        p_g = s_grp[P_S]
        p_s = c_s[P_C]
        p_t = batch.typ[p_row]
        p_gsz = batch.g[p_row]
        nd = s_nd[P_S]
        has = nd >= 0
        p2p = np.zeros(len(P_S))
        if has.any():
            hi_ = np.flatnonzero(has)
            ndh = nd[hi_]
            smallh = (s_ng[P_S[hi_]] < node[ndh]).astype(np.int64)
            p2p[hi_] = batch.p2p_for(p_row[hi_], ndh, smallh)
        tau = c_tau[P_C] + 2 * p2p
        sync = c_sync[P_C]
        okp = np.ones(len(P_S), dtype=bool)
        if pr.cross_type_comm:
            cross = has & (nd != p_t) & (2 * p2p > pr.eta * c_fb[P_C])
            n_cross += int(cross.sum())
            okp &= ~cross
        used2 = s_used[P_S].copy()
        used2[np.arange(len(P_S)), p_t] += p_gsz
        rem_t = inv[None, :] - used2
        first = p_s == 0
        rest_sum = np.zeros(len(P_S))
        rest_max = np.zeros(len(P_S))
        nf = np.flatnonzero(~first)
        if len(nf):
            gnf = p_g[nf]
            remf = rem_t[nf]
            snf = p_s[nf]
            okn = remf.sum(axis=1) > 0
            rem_cap = (remf * bd.cap_t[gnf]).sum(axis=1)
            memb = bd.m_pre[gnf, snf] > rem_cap
            n_mem += int((okn & memb).sum())
            okn &= ~memb
            fpp = batch.pp[gnf]
            left = np.where(fpp > 0, fpp - k, batch.kmax[gnf] - k)
            # device-seconds per second the rest can absorb: all remaining devices at their best rate,
            # and no more than `left` stages of at most the largest stage each can take
            big = (np.minimum(remf, bd.gmax_t[gnf]) * bd.inv_r[gnf]).max(axis=1)
            eff = np.minimum((remf * bd.inv_r[gnf]).sum(axis=1), left * big)
            okn &= (left > 0) & (eff > 0)
            fixed_g = fpp > 0
            if fixed_g.any():
                # a fixed-depth (megatron) plan needs room for its remaining stages of this size
                room = (remf // np.maximum(p_gsz[nf], 1)[:, None]).sum(axis=1)
                okn &= ~fixed_g | (room >= left)
            wrest = bd.w_pre[gnf, snf]
            cap_t_rest = _capacity_unique(bd, gnf, snf, remf, G, N, inv)
            memc = ~np.isfinite(cap_t_rest)
            n_mem += int((okn & memc).sum())
            okn &= ~memc
            with np.errstate(divide="ignore", invalid="ignore"):
                rest_max[nf] = np.where(eff > 0, wrest / np.where(eff > 0, eff, 1.0), 0.0)
                rest_max[nf] = np.maximum(rest_max[nf], np.where(memc, 0.0, cap_t_rest))
                # the stages' times add up to at least the per-layer least times, and to at least the
                # work over the largest stage the remaining devices can still form
                rest_sum[nf] = np.maximum(
                    bd.sum_pre[gnf, snf], np.where(big > 0, wrest / np.where(big > 0, big, 1.0), 0.0)
                )
            okp[nf] &= okn
        pb = (
            alpha[p_g] * (s_mt[P_S] + tau + rest_sum)
            + beta[p_g] * np.maximum(np.maximum(s_mx[P_S], tau), rest_max)
            + np.maximum(s_ms[P_S], sync)
        )
        badp = okp & (pb >= best.value)
        n_bound += int(badp.sum())
        okp &= ~badp
        keepp = np.flatnonzero(okp)
        P_S, P_C, p_row, p_g, p_s, p_t, p_gsz = (
            P_S[keepp],
            P_C[keepp],
            p_row[keepp],
            p_g[keepp],
            p_s[keepp],
            p_t[keepp],
            p_gsz[keepp],
        )
        tau, sync, used2, rest_sum, rest_max, first = (
            tau[keepp],
            sync[keepp],
            used2[keepp],
            rest_sum[keepp],
            rest_max[keepp],
            first[keepp],
        )
        if len(P_S) == 0:
            break

        # ---- 4. complete plans first (they tighten the bound for the rest of the level)
        fi = np.flatnonzero(first)
        if len(fi):
            own, off = _ranges(l_cnt[P_S[fi]])
            pair = fi[own]
            li = l_start[P_S[pair]] + off
            tot = l_tot[li] + tau[pair]
            tmx = np.maximum(l_tmx[li], tau[pair])
            smx = np.maximum(l_smx[li], sync[pair])
            val = alpha[p_g[pair]] * tot + beta[p_g[pair]] * tmx + smx
            order = np.argsort(val, kind="stable")
            for j in order:
                vj = float(val[j])
                if vj >= best.second_value:
                    break
                pj = pair[j]
                stages = [(int(p_row[pj]), 0, int(s_e[P_S[pj]]))]
                stages += hist.walk(int(l_hist[li[j]]))
                gidx = int(p_g[pj])
                chain = Chain(
                    tuple((batch.row_opt[r], s0, e0) for r, s0, e0 in stages),
                    gidx,
                    int(batch.vpp[gidx]),
                )
                best.offer(vj, chain, batch.subs[gidx])
        nfp = np.flatnonzero(~first)
        if len(nfp) == 0 or k == kmax_all:
            break

        if clock.passed():
            finish()
            return False
        # ---- 5. extend labels of the remaining pairs, chunk by chunk
        P_S, p_row, p_g, p_s, p_t, p_gsz = P_S[nfp], p_row[nfp], p_g[nfp], p_s[nfp], p_t[nfp], p_gsz[nfp]
        tau, sync, used2, rest_sum, rest_max = tau[nfp], sync[nfp], used2[nfp], rest_sum[nfp], rest_max[nfp]
        # key of the state each pair leads to
        gkey = np.where(batch.uniform[p_g], p_gsz, np.where(batch.small[p_row], 1, node[p_t]))
        seen2 = s_seen[P_S] | (1 << p_t)
        gk_max = int(batch.g.max()) + 1
        cols = [p_g, p_s, *[used2[:, t] for t in range(T)], p_t, gkey, seen2]
        radix = [G, N + 1, *[int(inv[t]) + 1 for t in range(T)], T, max(gk_max, int(node.max()) + 1), 1 << T]
        key = _pack(cols, radix)
        if key is None:
            stack = np.stack(cols, axis=1)
            _, key = np.unique(stack, axis=0, return_inverse=True)
            key = key.astype(np.int64).ravel()
        nl = l_cnt[P_S]
        acc: list[tuple[np.ndarray, ...]] = []
        acc_n = 0
        bounds = np.r_[0, np.cumsum(nl)]
        pos = 0
        while pos < len(P_S):
            end = int(np.searchsorted(bounds, bounds[pos] + CHUNK, side="right")) - 1
            end = max(end, pos + 1)
            sl = slice(pos, end)
            pos = end
            cnt_l = nl[sl]
            own, off = _ranges(cnt_l)
            pair = sl.start + own
            li = l_start[P_S[pair]] + off
            tp, sp = tau[pair], sync[pair]
            # labels of a state are sorted by total: once one with tmax <= tau and smax <= sync is
            # extended, the later such labels only give dominated results
            flag = (l_tmx[li] <= tp) & (l_smx[li] <= sp)
            cs = np.cumsum(flag)
            run_start = (np.cumsum(cnt_l) - cnt_l)[own]  # chunk position of the pair's first label
            keep_l = ~flag | (cs - (cs - flag)[run_start] == 1)
            tot = l_tot[li] + tp
            tmx = np.maximum(l_tmx[li], tp)
            smx = np.maximum(l_smx[li], sp)
            gp = p_g[pair]
            lbv = alpha[gp] * (tot + rest_sum[pair]) + beta[gp] * np.maximum(tmx, rest_max[pair]) + smx
            badl = keep_l & (lbv >= best.value)
            n_bound += int(badl.sum())
            keep_l &= ~badl
            w = np.flatnonzero(keep_l)
            acc.append((key[pair[w]], tot[w], tmx[w], smx[w], rest_max[pair[w]], pair[w], l_hist[li[w]]))
            acc_n += len(w)
            if acc_n > 4 * CHUNK and len(acc) > 1:
                acc = [_front(acc, pr.pareto_eps, counter)]
                acc_n = len(acc[0][0])
        if not acc_n:
            break
        before = acc_n
        nk, ntot, ntmx, nsmx, _fl, npair, npar = _front(acc, pr.pareto_eps, counter)
        n_pareto += before - len(nk)
        # ---- 6. the next level's states and labels
        hid = hist.add(p_row[npair], p_s[npair], s_e[P_S[npair]], npar)
        newst = np.r_[True, nk[1:] != nk[:-1]]
        first_lab = np.flatnonzero(newst)
        l_st = np.cumsum(newst) - 1
        fp = npair[first_lab]
        s_grp = p_g[fp]
        s_e = p_s[fp]
        s_used = used2[fp]
        s_nd = p_t[fp]
        s_ng = gkey[fp]
        s_seen = seen2[fp]
        l_tot, l_tmx, l_smx, l_hist = ntot, ntmx, nsmx, hid
    finish()
    return True


def _front(acc: list[tuple[np.ndarray, ...]], eps: float, counter: PruneCounter) -> tuple[np.ndarray, ...]:
    """Concatenate label chunks and keep each key's Pareto front, sorted by (key, total, tmax, smax)."""
    key, tot, tmx, smx, fl, pair, par = (np.concatenate(c) for c in zip(*acc, strict=True))
    order = np.lexsort((smx, tmx, tot, key))
    key, tot, tmx, smx, fl, pair, par = (a[order] for a in (key, tot, tmx, smx, fl, pair, par))
    keep, n_eps = pareto_mask(key, tot, np.maximum(tmx, fl), smx, eps)
    if n_eps:
        counter.add("pareto_eps", n_eps)
    return tuple(a[keep] for a in (key, tot, tmx, smx, fl, pair, par))


__all__ = ["Best", "Chain", "pareto_mask", "run_batch"]
