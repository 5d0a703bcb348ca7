"""The vectorised label DP: one pass over pipeline depth, every state and label of a batch at once.

Same algorithm as the reference (``tests/oracles/dp_reference.py``, the tests' oracle): stages are placed from the
last to the first; a state is (sub-problem, first layer of the placed suffix, devices used per type, type
and size class of the stage placed last, device types seen); each state keeps the Pareto front of
``(sum tau, max tau, max sync)`` labels. What changes is the representation -- states and labels are
numpy arrays, and each level extends all of them together -- and the bounds, which are stronger but
still valid lower bounds (see :mod:`hapmoe_milp.search.dp_tables`), so exactness with every pruning
switch off is kept. The Pareto-front kernels the levels call are :mod:`hapmoe_milp.search.dp_fronts`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hapmoe_milp.deadline import TimeLimitReached
from hapmoe_milp.instance import Option
from hapmoe_milp.search.dp_fronts import label_front, pack, pair_front, pareto_mask
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
    DPScope,
    F,
    W,
    aligned_vec,
    capacity_bound,
    rest_unique,
)
from hapmoe_milp.space import PruneCounter

# label expansions per chunk (bounds memory when little is pruned, e.g. with every switch off)
CHUNK = 400_000
# (state, stage) pairs priced between two looks at the clock (about 20 ms of work on one core)
PAIR_SLICE = 50_000


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
    sub: DPScope | None = None
    second_value: float = math.inf
    second_chain: Chain | None = None
    second_sub: DPScope | None = None

    def offer(self, value: float, chain: Chain, sub: DPScope) -> None:
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


def _seg_min(values: np.ndarray, seg: np.ndarray, n: int) -> np.ndarray:
    out = np.full(n, np.inf)
    np.minimum.at(out, seg, values)
    return out


@dataclass
class _Counts:
    """What each rule removed in one batch (added to the solve's counter at the end)."""

    bound: int = 0
    memory_bound: int = 0
    pareto: int = 0
    min_recompute: int = 0
    cross_type_comm: int = 0
    max_stages: int = 0

    def flush(self, counter: PruneCounter) -> None:
        for name in ("bound", "memory_bound", "pareto", "min_recompute", "cross_type_comm", "max_stages"):
            counter.add(name, getattr(self, name))


@dataclass
class _Level:
    """The live states of one level and their labels (grouped by state, each state's by rising total).

    A state: group, first layer of the placed suffix (``e``), devices used per type, device type and
    size key of the stage placed last (``nd``, ``ng``; -1/0 for none), device types seen (bit mask), and
    for groups under a runtime's rules between stages (:class:`~hapmoe_milp.space.StageRules`; else 0):
    the mesh of the stage placed last and how many stages its run holds so far (capped at the rule's
    minimum), and the last pipeline stage's TP and DP (which the first stage must match).
    A label: ``(tot, tmx, smx)`` and the id of its last stage in the history.
    """

    grp: np.ndarray
    e: np.ndarray
    used: np.ndarray
    nd: np.ndarray
    ng: np.ndarray
    seen: np.ndarray
    mesh: np.ndarray
    run: np.ndarray
    etp: np.ndarray
    edp: np.ndarray
    st: np.ndarray
    tot: np.ndarray
    tmx: np.ndarray
    smx: np.ndarray
    hist: np.ndarray

    @classmethod
    def roots(cls, G: int, n: int, T: int) -> _Level:
        z = np.zeros(G, dtype=np.int64)
        return cls(np.arange(G), np.full(G, n), np.zeros((G, T), dtype=np.int64), z - 1, z, z, z - 1, z, z, z,
                   np.arange(G), np.zeros(G), np.zeros(G), np.zeros(G), z - 1)  # fmt: skip

    def keep_labels(self, keep: np.ndarray) -> _Level:
        """The level with only the labels in ``keep`` (states left without labels are dropped)."""
        alive = np.zeros(len(self.grp), dtype=bool)
        alive[self.st[keep]] = True
        remap = np.cumsum(alive) - 1
        return _Level(self.grp[alive], self.e[alive], self.used[alive], self.nd[alive], self.ng[alive],
                      self.seen[alive], self.mesh[alive], self.run[alive], self.etp[alive], self.edp[alive],
                      remap[self.st[keep]], self.tot[keep], self.tmx[keep], self.smx[keep],
                      self.hist[keep])  # fmt: skip

    def label_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """Per state: number of labels and index of its first label."""
        cnt = np.bincount(self.st, minlength=len(self.grp))
        return cnt, np.cumsum(cnt) - cnt


@dataclass
class _Cands:
    """Candidate stages (option row, start) for the (group, end) pairs of the level, sorted by
    ``key = (group-end index, device type-size class)`` so a state finds its candidates by search."""

    row: np.ndarray
    grp: np.ndarray
    s: np.ndarray
    tau: np.ndarray  # fwd + bwd, before the boundary's p2p
    sync: np.ndarray
    key: np.ndarray


def run_batch(batch: Batch, best: Best, counter: PruneCounter, clock: Clock) -> bool:
    """Run the DP over every group of ``batch``; offer complete plans to ``best``. False if the clock ran out."""
    n_types = len(batch.types)
    lv: _Level | None = _Level.roots(batch.n_groups, batch.n_layers, n_types)
    cnt = _Counts()
    hist = _History()
    kmax_all = int(batch.kmax.max())
    for k in range(1, kmax_all + 1):
        if clock.passed():
            cnt.flush(counter)
            return False
        lv = _prune(batch, k, lv, best, cnt)
        if lv is None:
            break
        ge_keys, s_ge = np.unique(lv.grp * (batch.n_layers + 1) + lv.e, return_inverse=True)
        s_ge = s_ge.ravel()
        l_start = lv.label_runs()[1]
        mins = [np.minimum.reduceat(x, l_start) for x in (lv.tot, lv.tmx, lv.smx)]
        ge_mins = [_seg_min(m, s_ge, len(ge_keys)) for m in mins]
        bd = batch.bounds(k + 1)  # after this stage, the rest sit k + 1 or more from the end
        cands = _candidates(batch, k, ge_keys, ge_mins, bd, best, cnt)
        if len(cands.key) == 0:
            break
        try:
            pairs = _pairs(batch, k, lv, s_ge, cands, mins, bd, best, cnt, clock)
        except TimeLimitReached:
            cnt.flush(counter)
            return False
        if pairs is None:
            break
        # complete plans first: they tighten the bound for the rest of the level
        _complete(batch, lv, pairs, hist, best)
        rest = np.flatnonzero(pairs["s"] > 0)
        if len(rest) == 0 or k == kmax_all:
            break
        if clock.passed():
            cnt.flush(counter)
            return False
        lv = _extend(batch, lv, {n: a[rest] for n, a in pairs.items()}, hist, best, cnt, counter)
        if lv is None:
            break
    cnt.flush(counter)
    return True


def _prune(batch: Batch, k: int, lv: _Level, best: Best, cnt: _Counts) -> _Level | None:
    """Drop labels that can no longer beat the best plan: the layers still to place sit ``k`` or more
    stages from the end and need at least the bounds of ``batch.bounds(k)``."""
    bd = batch.bounds(k)
    t_rest = capacity_bound(bd, lv.grp, lv.e, batch.inv[None, :] - lv.used)[lv.st]
    g = lv.grp[lv.st]
    with np.errstate(invalid="ignore"):
        lb = batch.alpha[g] * (lv.tot + bd.sum_pre[g, lv.e[lv.st]]) + batch.beta[g] * np.maximum(lv.tmx, t_rest)
    keep = (lb + lv.smx < best.value) & np.isfinite(t_rest)  # inf: the devices left cannot hold the layers
    if keep.all():
        return lv if len(lv.st) else None
    cnt.bound += int((~keep).sum())
    if not keep.any():
        return None
    return lv.keep_labels(keep)


def _candidates(
    batch: Batch, k: int, ge_keys: np.ndarray, ge_mins: list[np.ndarray], bd: Bounds, best: Best, cnt: _Counts
) -> _Cands:
    """Every (option, start) that can be the ``k``-th stage from the end for some state of each (group,
    end): layer counts within the option's band and the family's depth rules, then its exact cost; it must
    fit memory, start the pipeline with the first stage's DP, and not already lose to the best plan."""
    N = batch.n_layers
    pr = batch.subs[0].inst.pruning
    alpha, beta = batch.alpha, batch.beta
    lo_tot, lo_tmx, lo_smx = ge_mins
    ge_g, ge_e = np.divmod(ge_keys, N + 1)
    X, xoff = _ranges(batch.grp_hi[ge_g] - batch.grp_lo[ge_g])
    row = batch.grp_lo[ge_g][X] + xoff
    gi, e = ge_g[X], ge_e[X]
    v = batch.vpp[gi]
    # interleaved: a layer per virtual chunk, the last stage's MTP layers in its last chunk
    n_lo = np.maximum(batch.lo[row], batch.lo_stage[gi, 1 if k == 1 else 0])
    n_hi = np.minimum(batch.hi[row], e)
    fixed_pp = batch.pp[gi]
    # the last allowed stage must start at layer 0; a fixed depth leaves v layers per later stage
    must_first = np.where(fixed_pp > 0, fixed_pp == k, batch.kmax[gi] == k)
    capped = (fixed_pp == 0) & (batch.kmax[gi] == k) & batch.capped[gi] & (e > n_lo)
    cnt.max_stages += int(capped.sum())
    # (a stage that must be the first takes the first stage's own minimum, not a middle stage's)
    n_lo = np.where(must_first, np.maximum(np.maximum(batch.lo[row], batch.lo_stage[gi, 2]), e), n_lo)
    # (the stages before this one: middles need v layers each, the first stage its own minimum -- v - 1 when
    # its first chunk may hold only the embedding)
    before = (fixed_pp - k - 1) * v + batch.lo_stage[gi, 2]
    n_hi = np.where(fixed_pp > k, np.minimum(n_hi, e - before), n_hi)
    # prefilters (exact checks follow): the stage's time alone must not lose, its memory must fit
    if math.isfinite(best.value):
        tcap = (best.value - alpha[gi] * lo_tot[X] - lo_smx[X]) / (alpha[gi] + beta[gi])
        tm = batch.tmin[row]
        with np.errstate(divide="ignore", invalid="ignore"):
            n_t = np.where(tm > 0, np.floor(tcap / np.where(tm > 0, tm, 1.0)), N)
        n_hi = np.minimum(n_hi, np.clip(n_t, -1, N).astype(np.int64))
    pk = batch.present
    mrow = batch.coef[row][:, pk, W] + batch.infl[gi, k][:, None] * batch.coef[row][:, pk, A]
    mmin = mrow.min(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        n_m = np.where(mmin > 0, np.floor((batch.cap[row] - batch.fixed[row]) / np.where(mmin > 0, mmin, 1.0)), N)
    n_hi = np.minimum(n_hi, np.clip(n_m, -1, N).astype(np.int64))
    C, coff = _ranges(np.maximum(n_hi - n_lo + 1, 0))
    c_x, c_row, c_g, c_e = X[C], row[C], gi[C], e[C]
    c_s = c_e - (n_lo[C] + coff)
    # exact stage cost: layers of each kind times the option's per-kind coefficients, plus the edges
    kc = batch.kind_count
    vals = np.einsum("kn,nka->na", (kc[:, c_e] - kc[:, c_s]).astype(float), batch.coef[c_row])
    first_on = c_s == 0
    if k == 1:  # the last stage: its head, or both edges as one term when it is also the first
        edge = np.where(first_on[:, None], batch.single[c_row], batch.last[c_row])
    else:
        edge = batch.first[c_row] * first_on[:, None]
    vals += edge[:, :WORK]
    extra = batch.fixed[c_row] + edge[:, WORK]
    fwd, bwd = vals[:, F], vals[:, B]
    mem = vals[:, W] + batch.infl[c_g, k] * vals[:, A] + extra
    # exposed DP sync + optimizer step: the cost model's rule, one call per device type
    cm = batch.subs[0].inst.cost_model
    c_sync = np.empty(len(c_row))
    c_typ = batch.typ[c_row]
    for t, did in enumerate(batch.types):
        on = c_typ == t
        if on.any():
            c_sync[on] = cm.exposed_sync(did, vals[on, RS], vals[on, AG], fwd[on], bwd[on], vals[on, OP])
    c_tau = fwd + bwd
    ok = mem <= batch.cap[c_row]
    ok &= ~first_on | (batch.dp[c_row] == batch.first_dp[c_g])
    # interleaved: the first rank's first chunk holds the leading layers of another kind
    ok &= ~first_on | (c_e - c_s >= batch.lo_stage[c_g, 2])
    lb = (
        alpha[c_g] * (lo_tot[c_x] + c_tau + bd.sum_pre[c_g, c_s])
        + beta[c_g] * np.maximum(c_tau, lo_tmx[c_x])
        + np.maximum(lo_smx[c_x], c_sync)
    )
    bad = lb >= best.value
    cnt.bound += int((ok & bad).sum())
    sel = np.flatnonzero(ok & ~bad)
    if pr.min_recompute and len(sel):
        # the cheapest recompute level that fits, per (group-end, shape, start)
        sel = sel[np.lexsort((batch.level[c_row[sel]], c_s[sel], batch.shape[c_row[sel]], c_x[sel]))]
        kx, ksh, ks = c_x[sel], batch.shape[c_row[sel]], c_s[sel]
        head = np.r_[True, (kx[1:] != kx[:-1]) | (ksh[1:] != ksh[:-1]) | (ks[1:] != ks[:-1])]
        cnt.min_recompute += int((~head).sum())
        sel = sel[head]
    key = c_x[sel] * len(batch.tg_t) + batch.tg[c_row[sel]]
    o = np.argsort(key, kind="stable")
    sel = sel[o]
    return _Cands(c_row[sel], c_g[sel], c_s[sel], c_tau[sel], c_sync[sel], key[o])


def _pairs(
    batch: Batch,
    k: int,
    lv: _Level,
    s_ge: np.ndarray,
    cands: _Cands,
    mins: list[np.ndarray],
    bd: Bounds,
    best: Best,
    cnt: _Counts,
    clock: Clock,
) -> dict[str, np.ndarray] | None:
    """(state, candidate) pairs the inventory and the family rules allow, with the stage time including
    the boundary's p2p and lower bounds on what the layers still to place add; pairs that cannot beat the
    best plan even from their state's best label are dropped.

    Past the first few levels a level can have millions of pairs (0.4 s of work for Qwen3-235B on 32
    devices): they are priced in slices of ``PAIR_SLICE`` with ``clock`` checked between slices (raises
    :class:`~hapmoe_milp.deadline.TimeLimitReached`). Each pair is priced on its own and the counts add
    up, so the slices give the same pairs, in the same order, and the same counts as one pass."""
    inv, node = batch.inv, batch.node
    tt, gg = batch.tg_t[None, :], batch.tg_g[None, :]
    # which (device type, stage size) classes each state may place next
    rem = inv[batch.tg_t][None, :] - lv.used[:, batch.tg_t] - gg
    valid = (rem >= 0) & aligned_vec(np.maximum(rem, 0), np.broadcast_to(gg, rem.shape), node[batch.tg_t][None, :])
    cont = batch.contiguous[lv.grp][:, None]
    if cont.any():  # hetero: a device type's stages are contiguous
        valid &= ~(cont & ((lv.seen[:, None] >> tt) & 1).astype(bool) & (lv.nd[:, None] != tt))
    uni = batch.uniform[lv.grp][:, None]
    if uni.any():  # one stage size per device type
        valid &= ~(uni & (lv.nd[:, None] == tt) & (lv.ng[:, None] != gg))
    si, ti = np.nonzero(valid)
    pkey = s_ge[si] * len(batch.tg_t) + ti
    blo = np.searchsorted(cands.key, pkey, side="left")
    own, off = _ranges(np.searchsorted(cands.key, pkey, side="right") - blo)
    S, c = si[own], blo[own] + off
    parts = []
    for a in range(0, len(S), PAIR_SLICE):
        if a:
            clock.check("searching a level of stages")
        part = _pair_slice(batch, k, lv, cands, mins, bd, best, cnt, S[a : a + PAIR_SLICE], c[a : a + PAIR_SLICE])
        if part is not None:
            parts.append(part)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else {n: np.concatenate([p[n] for p in parts]) for n in parts[0]}


def _pair_slice(
    batch: Batch,
    k: int,
    lv: _Level,
    cands: _Cands,
    mins: list[np.ndarray],
    bd: Bounds,
    best: Best,
    cnt: _Counts,
    S: np.ndarray,
    c: np.ndarray,
) -> dict[str, np.ndarray] | None:
    """:func:`_pairs` for the pairs (state ``S``, candidate ``c``)."""
    pr = batch.subs[0].inst.pruning
    inv, node = batch.inv, batch.node
    row, grp, s = cands.row[c], lv.grp[S], cands.s[c]
    typ, nd = batch.typ[row], lv.nd[S]
    tau, sync = cands.tau[c], cands.sync[c]
    mt, mx, ms = (m[S] for m in mins)
    # Cheaper bounds first, each no more than the full one below: the boundary's p2p only adds to the
    # stage time, and what :func:`_rest` adds is at least ``sum_pre`` to the sum (its rest_sum is the max
    # of that and more; 0 = sum_pre[:, 0] for a first stage) and at least 0 to the max. A pair they put
    # at or past the best plan is dropped below whatever p2p, the rules and _rest say; dropping it now
    # spares their work, and the pairs kept are the same. Cross-type pairs wait for their p2p, which the
    # cross_type_comm rule reads (so that what it removed is counted as before).
    xt = (nd >= 0) & (nd != typ) if pr.cross_type_comm else np.zeros(len(S), dtype=bool)
    pre = ~xt & (batch.pair_bound(grp, mt, mx, ms, tau, sync, bd.sum_pre[grp, s]) >= best.value)
    cnt.bound += int(pre.sum())
    live = np.flatnonzero(~pre)
    S, c, row, grp, s, typ, nd, tau, sync, mt, mx, ms, xt = (
        a[live] for a in (S, c, row, grp, s, typ, nd, tau, sync, mt, mx, ms, xt)
    )
    has = nd >= 0
    p2p = np.zeros(len(S))
    if has.any():
        h = np.flatnonzero(has)
        p2p[h] = batch.p2p_for(row[h], nd[h], (lv.ng[S[h]] < node[nd[h]]).astype(np.int64))
    ok = np.ones(len(S), dtype=bool)
    if pr.cross_type_comm:
        cross = xt & (2 * p2p > pr.eta * tau)
        cnt.cross_type_comm += int(cross.sum())
        ok &= ~cross
    tau = tau + 2 * p2p
    bad0 = ok & (batch.pair_bound(grp, mt, mx, ms, tau, sync, bd.sum_pre[grp, s]) >= best.value)
    cnt.bound += int(bad0.sum())
    live = np.flatnonzero(ok & ~bad0)
    if len(live) == 0:
        return None
    S, row, grp, s, typ, tau, sync, mt, mx, ms = (a[live] for a in (S, row, grp, s, typ, tau, sync, mt, mx, ms))
    gsz = batch.g[row]
    ok = np.ones(len(S), dtype=bool)
    rules = _stage_rules_ok(batch, lv, S, row, grp, s)
    if rules is not None:
        ok &= rules
    rest_sum, rest_max = np.zeros(len(S)), np.zeros(len(S))
    nf = np.flatnonzero(ok & (s > 0))
    if len(nf):
        rem = inv[None, :] - lv.used[S[nf]]
        rem[np.arange(len(nf)), typ[nf]] -= gsz[nf]
        okn, rest_sum[nf], rest_max[nf] = _rest(batch, k, grp[nf], s[nf], rem, gsz[nf], bd, cnt)
        ok[nf] &= okn
    bad = ok & (batch.pair_bound(grp, mt, mx, ms, tau, sync, rest_sum, rest_max) >= best.value)
    cnt.bound += int(bad.sum())
    keep = np.flatnonzero(ok & ~bad)
    if len(keep) == 0:
        return None
    S, row, grp, s, typ, gsz, tau, sync = (a[keep] for a in (S, row, grp, s, typ, gsz, tau, sync))
    used2 = lv.used[S].copy()
    used2[np.arange(len(S)), typ] += gsz
    out = {"S": S, "row": row, "grp": grp, "s": s, "typ": typ, "gsz": gsz, "tau": tau, "sync": sync}
    return out | {"used2": used2, "rest_sum": rest_sum[keep], "rest_max": rest_max[keep]}


def _stage_rules_ok(
    batch: Batch, lv: _Level, S: np.ndarray, row: np.ndarray, grp: np.ndarray, s: np.ndarray
) -> np.ndarray | None:
    """Which (state, stage) pairs keep the runtime's rules between stages (None: no group has any).

    Stages are placed last to first, so a stage of another mesh than the one placed before it closes
    that mesh's run, which is not the first mesh (this stage precedes it) and must hold ``mesh_min``
    stages. A stage that starts at layer 0 is the first: its TP and DP must suit the last stage's."""
    if not ((batch.mesh_min > 1).any() or batch.edge_tp.any() or batch.edge_dp.any()):
        return None
    # each rule is evaluated only on the pairs it constrains: states whose mesh run is still short of
    # its minimum (per state first), and first stages of groups with an edge rule
    ok = np.ones(len(S), dtype=bool)
    mm = batch.mesh_min[lv.grp]
    short = (mm > 1) & (lv.mesh >= 0) & (lv.run < mm)
    r = np.flatnonzero(short[S])
    if len(r):
        ok[r] = batch.mesh[row[r]] == lv.mesh[S[r]]
    f = np.flatnonzero(s == 0)
    et, ed = batch.edge_tp[grp[f]], batch.edge_dp[grp[f]]
    f, et, ed = f[et | ed], et[et | ed], ed[et | ed]
    if len(f):
        sf, rf = S[f], row[f]
        root = lv.nd[sf] < 0  # a one-stage plan: this stage is the last one too
        tp, dp = batch.tp[rf], batch.dp[rf]
        last_tp = np.where(root, tp, lv.etp[sf])
        ldp = np.maximum(np.where(root, dp, lv.edp[sf]), 1)
        bad = et & (tp != last_tp)
        bad |= ed & (dp % ldp != 0) & (ldp % np.maximum(dp, 1) != 0)
        ok[f] &= ~bad
    return ok


def _rest(
    batch: Batch, k: int, grp: np.ndarray, s: np.ndarray, rem: np.ndarray, gsz: np.ndarray, bd: Bounds, cnt: _Counts
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For layers ``[0, s)`` still to place on ``rem`` devices per type: whether it is possible at all,
    and lower bounds on the sum and on the largest of the remaining stages' times.

    A pure function of (group, start, remaining devices, stage size) at this level, and many pairs share
    them: evaluated once per distinct tuple (:func:`_rest_unique`), the counts weighted by how many
    pairs share it."""
    T = rem.shape[1]
    key = pack(
        [grp, s, gsz, *[rem[:, t] for t in range(T)]],
        [batch.n_groups, batch.n_layers + 1, int(batch.g.max()) + 1, *[int(batch.inv[t]) + 1 for t in range(T)]],
    )
    if key is None or len(key) < 2:
        ok, rest_sum, rest_max, n_mem = rest_unique(batch, k, grp, s, rem, gsz, bd)
        cnt.memory_bound += int(n_mem.sum())
        return ok, rest_sum, rest_max
    _uk, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    ok, rest_sum, rest_max, n_mem = rest_unique(batch, k, grp[first], s[first], rem[first], gsz[first], bd)
    cnt.memory_bound += int((n_mem * np.bincount(inverse, minlength=len(first))).sum())
    return ok[inverse], rest_sum[inverse], rest_max[inverse]


def _complete(
    batch: Batch,
    lv: _Level,
    pairs: dict[str, np.ndarray],
    hist: _History,
    best: Best,
) -> None:
    """Offer the plans completed by pairs whose stage starts at layer 0, best first."""
    fi = np.flatnonzero(pairs["s"] == 0)
    if not len(fi):
        return
    l_cnt, l_start = lv.label_runs()
    S = pairs["S"]
    own, off = _ranges(l_cnt[S[fi]])
    pair = fi[own]
    li = l_start[S[pair]] + off
    g = pairs["grp"][pair]
    tau, sync = pairs["tau"][pair], pairs["sync"][pair]
    val = (
        batch.alpha[g] * (lv.tot[li] + tau) + batch.beta[g] * np.maximum(lv.tmx[li], tau) + np.maximum(lv.smx[li], sync)
    )
    for j in np.argsort(val, kind="stable"):
        vj = float(val[j])
        if vj >= best.second_value:
            break
        pj = pair[j]
        stages = [(int(pairs["row"][pj]), 0, int(lv.e[S[pj]])), *hist.walk(int(lv.hist[li[j]]))]
        gidx = int(pairs["grp"][pj])
        chain = Chain(tuple((batch.row_opt[r], s0, e0) for r, s0, e0 in stages), gidx, int(batch.vpp[gidx]))
        best.offer(vj, chain, batch.subs[gidx])


def _extend(
    batch: Batch,
    lv: _Level,
    pairs: dict[str, np.ndarray],
    hist: _History,
    best: Best,
    cnt: _Counts,
    counter: PruneCounter,
) -> _Level | None:
    """Extend every label of each pair's state by the pair's stage (chunk by chunk), keep the labels that
    can still win and each next state's Pareto front: the next level."""
    pr = batch.subs[0].inst.pruning
    l_cnt, l_start = lv.label_runs()
    T, N, G = len(batch.types), batch.n_layers, batch.n_groups
    inv, node = batch.inv, batch.node
    S, row, grp, s, typ, gsz = (pairs[n] for n in ("S", "row", "grp", "s", "typ", "gsz"))
    tau, sync, used2, rest_sum, rest_max = (pairs[n] for n in ("tau", "sync", "used2", "rest_sum", "rest_max"))
    # the state each pair leads to
    gkey = np.where(batch.uniform[grp], gsz, np.where(batch.small[row], 1, node[typ]))
    seen2 = lv.seen[S] | (1 << typ)
    mesh2, run2, etp2, edp2 = _rule_columns(batch, lv, S, row, grp)
    cols = [grp, s, *[used2[:, t] for t in range(T)], typ, gkey, seen2, mesh2 + 1, run2, etp2, edp2]
    radix = [G, N + 1, *[int(inv[t]) + 1 for t in range(T)], T, int(max(batch.g.max(), node.max())) + 1, 1 << T]
    radix += [int(batch.mesh.max()) + 2, int(batch.mesh_min.max()) + 1, int(batch.tp.max()) + 1]
    radix += [int(batch.dp.max()) + 1]
    key = pack(cols, radix)
    if key is None:
        key = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)[1].astype(np.int64).ravel()
    # stage options that lead from the same state to the same next state: one no worse in both stage
    # time and sync gives labels no worse than the other's, which need not be made at all
    keep = pair_front(S, key, tau, sync)
    cnt.pareto += int((~keep).sum())
    S, row, grp, s, typ, gsz, tau, sync = (
        S[keep],
        row[keep],
        grp[keep],
        s[keep],
        typ[keep],
        gsz[keep],
        tau[keep],
        sync[keep],
    )
    used2, rest_sum, rest_max, gkey, seen2, key = (
        used2[keep], rest_sum[keep], rest_max[keep], gkey[keep], seen2[keep], key[keep]
    )  # fmt: skip
    mesh2, run2, etp2, edp2 = mesh2[keep], run2[keep], etp2[keep], edp2[keep]
    nl = l_cnt[S]
    bounds = np.r_[0, np.cumsum(nl)]
    acc: list[tuple[np.ndarray, ...]] = []
    acc_n = pos = 0
    while pos < len(S):
        end = max(int(np.searchsorted(bounds, bounds[pos] + CHUNK, side="right")) - 1, pos + 1)
        cnt_l = nl[pos:end]
        own, off = _ranges(cnt_l)
        pair = pos + own
        pos = end
        li = l_start[S[pair]] + off
        tp, sp = tau[pair], sync[pair]
        # labels of a state are sorted by total: once one with tmax <= tau and smax <= sync is
        # extended, the later such labels only give dominated results
        flag = (lv.tmx[li] <= tp) & (lv.smx[li] <= sp)
        cs = np.cumsum(flag)
        run_start = (np.cumsum(cnt_l) - cnt_l)[own]  # chunk position of the pair's first label
        keep = ~flag | (cs - (cs - flag)[run_start] == 1)
        tot = lv.tot[li] + tp
        tmx = np.maximum(lv.tmx[li], tp)
        smx = np.maximum(lv.smx[li], sp)
        g = grp[pair]
        lb = batch.alpha[g] * (tot + rest_sum[pair]) + batch.beta[g] * np.maximum(tmx, rest_max[pair]) + smx
        bad = keep & (lb >= best.value)
        cnt.bound += int(bad.sum())
        w = np.flatnonzero(keep & ~bad)
        acc.append((key[pair[w]], tot[w], tmx[w], smx[w], rest_max[pair[w]], pair[w], lv.hist[li[w]]))
        acc_n += len(w)
        if acc_n > 4 * CHUNK and len(acc) > 1:
            acc = [label_front(acc, pr.pareto_eps, counter)]
            acc_n = len(acc[0][0])
    if not acc_n:
        return None
    nk, ntot, ntmx, nsmx, _fl, npair, npar = label_front(acc, pr.pareto_eps, counter)
    cnt.pareto += acc_n - len(nk)
    hid = hist.add(row[npair], s[npair], lv.e[S[npair]], npar)
    head = np.r_[True, nk[1:] != nk[:-1]]
    fp = npair[np.flatnonzero(head)]
    return _Level(grp[fp], s[fp], used2[fp], typ[fp], gkey[fp], seen2[fp], mesh2[fp], run2[fp], etp2[fp], edp2[fp],
                  np.cumsum(head) - 1, ntot, ntmx, nsmx, hid)  # fmt: skip


def _rule_columns(
    batch: Batch, lv: _Level, S: np.ndarray, row: np.ndarray, grp: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The next state's rule columns (mesh, run length, last stage's TP and DP); zeros for groups
    without the rule, so their states do not split."""
    mm = batch.mesh_min[grp]
    same = batch.mesh[row] == lv.mesh[S]
    mesh2 = np.where(mm > 1, batch.mesh[row], -1)
    run2 = np.where(mm > 1, np.where(same, np.minimum(lv.run[S] + 1, mm), 1), 0)
    root = lv.nd[S] < 0
    et, ed = batch.edge_tp[grp], batch.edge_dp[grp]
    etp2 = np.where(et, np.where(root, batch.tp[row], lv.etp[S]), 0)
    edp2 = np.where(ed, np.where(root, batch.dp[row], lv.edp[S]), 0)
    return mesh2, run2, etp2, edp2


__all__ = ["Best", "Chain", "pareto_mask", "run_batch"]
