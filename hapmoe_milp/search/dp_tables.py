"""The numbers the vectorised DP reads, as arrays: stage options of a batch of sub-problems, and bounds.

Nothing is priced here: every coefficient is copied from the instance's options (which the cost model
filled), so the DP optimises exactly what :func:`hapmoe_milp.cost.estimate.estimate` reports. What this
module adds are *lower bounds* derived from those coefficients (the least time and memory any option of
a sub-problem needs for the layers still to place), which the DP uses to discard labels early.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hapmoe_milp.config import RECOMPUTE_LEVELS
from hapmoe_milp.deadline import TimeLimitReached
from hapmoe_milp.instance import ATTRS, Instance, Option, aligned
from hapmoe_milp.search.dp_fronts import pack

# columns of the per-kind coefficient block (ATTRS order) and of the edge block (ATTRS + work)
F, B, W, A, RS, AG, OP, WORK = range(8)
N_ATTR = len(ATTRS)
LEVEL = {lv: i for i, lv in enumerate(RECOMPUTE_LEVELS)}  # the recompute ladder, cheapest first
SHAPE_STRIDE = 1 << 24  # shape ids of different groups never collide


@dataclass(frozen=True)
class Clock:
    """When a search must stop: a wall-clock deadline (``perf_counter``, the user's time limit) and/or a
    CPU-time one (``process_time``: a budget that does not shrink when other jobs load the machine).

    ``soft`` (``perf_counter``) stops it earlier only while ``found()`` is false: a search that has no
    plan by then gives the rest of the limit to a later try (the optimizer-offload retry) rather than
    ending the whole solve with nothing; one that has a plan runs on to ``wall``."""

    wall: float | None = None
    cpu: float | None = None
    soft: float | None = None
    found: Callable[[], bool] | None = None

    def passed(self) -> bool:
        now = time.perf_counter()
        return (
            (self.wall is not None and now > self.wall)
            or (self.cpu is not None and time.process_time() > self.cpu)
            or self.soft_passed(now)
        )

    def soft_passed(self, now: float | None = None) -> bool:
        """Past ``soft`` with nothing found."""
        if self.soft is None or self.found is None:
            return False
        return (time.perf_counter() if now is None else now) > self.soft and not self.found()

    def check(self, what: str) -> None:
        """Raise :class:`~hapmoe_milp.deadline.TimeLimitReached` naming ``what`` once :meth:`passed`
        (the :class:`~hapmoe_milp.deadline.Checkpoint` the option builders call between pricing units)."""
        if self.passed():
            raise TimeLimitReached(what)


@dataclass(frozen=True)
class DPScope:
    """The scope of one DP run: an instance, the options that may share a plan (one family group, see
    :func:`hapmoe_milp.instance.group_key`), and for an interleaved instance the fixed pipeline depth.

    ``lb`` is a lower bound on the iteration time of any plan of the sub-problem, used to order
    sub-problems and to skip those that cannot beat the best plan found.
    """

    inst: Instance
    options: tuple[Option, ...]
    pp: int = 0
    lb: float = 0.0


class RowCache:
    """Coefficient rows of options, extracted once per option (pricing it on first use)."""

    def __init__(self, kinds: Sequence[str], types: Sequence[str]) -> None:
        self.kinds = tuple(kinds)
        self.tidx = {t: i for i, t in enumerate(types)}
        self.rows: dict[int, tuple[Option, np.ndarray]] = {}
        self.shapes: dict[tuple, int] = {}

    def row(self, o: Option) -> np.ndarray:
        hit = self.rows.get(id(o))
        if hit is not None:
            return hit[1]
        vals = []
        for kind in self.kinds:
            c = o.per_kind[kind]  # type: ignore[index]
            vals += (c.fwd, c.bwd, c.weights, c.act, c.rs, c.ag, c.opt)
        for e in (o.first, o.last, o.single):
            vals += (e.fwd, e.bwd, e.weights, e.act, e.rs, e.ag, e.opt, e.work)
        sid = self.shapes.setdefault((o.device, o.cfg, o.b), len(self.shapes))
        vals += (o.fixed, o.capacity, self.tidx[o.device], o.devices, o.cfg.dp, LEVEL[o.recompute], sid)
        vals += (o.band[0], o.band[1])
        r = np.array(vals, dtype=float)
        self.rows[id(o)] = (o, r)  # the option is kept alive so its id stays unique
        return r


@dataclass
class Batch:
    """Options (rows) of several sub-problems (groups) stacked into arrays, plus per-group bounds."""

    subs: list[DPScope]
    types: tuple[str, ...]
    inv: np.ndarray  # (T,)
    node: np.ndarray  # (T,)
    kind_count: np.ndarray  # (K, N+1) layers of each kind in [0, x)
    n_layers: int
    # rows
    row_grp: np.ndarray
    row_opt: list[Option]
    coef: np.ndarray
    first: np.ndarray
    last: np.ndarray
    single: np.ndarray  # the edge of a stage that is first and last (CostModel.single_edge)
    fixed: np.ndarray
    cap: np.ndarray
    typ: np.ndarray
    g: np.ndarray
    small: np.ndarray  # stage smaller than a node: its boundaries are link class "small"
    dp: np.ndarray
    level: np.ndarray
    shape: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    tmin: np.ndarray  # least per-layer fwd+bwd over the layer kinds (a time prefilter)
    tg: np.ndarray  # index of the row's (device type, stage size) class
    tg_t: np.ndarray  # per class: device type
    tg_g: np.ndarray  # per class: stage size
    grp_lo: np.ndarray  # rows of group i are grp_lo[i]:grp_hi[i]
    grp_hi: np.ndarray
    # groups
    alpha: np.ndarray
    beta: np.ndarray
    vpp: np.ndarray
    pp: np.ndarray  # fixed depth, 0 = free
    kmax: np.ndarray
    capped: np.ndarray  # the max_stages cap is below what the layers and devices would allow
    first_dp: np.ndarray
    contiguous: np.ndarray
    uniform: np.ndarray
    gmax: np.ndarray
    lo_stage: np.ndarray  # (G, 3) fewest layers of a middle, last and first stage (Instance.stage_min_layers)
    # the runtime's rules between stages (Instance.stage_rules): per group, and the row values they read
    edge_tp: np.ndarray  # (G,) first and last stage one TP
    edge_dp: np.ndarray  # (G,) first and last stage DPs divide one another
    mesh_min: np.ndarray  # (G,) stages every mesh after the first holds (1: no rule)
    tp: np.ndarray  # (rows,) TP of the row's config
    mesh: np.ndarray  # (rows,) mesh identity (device type and config) of the row
    infl: np.ndarray  # (G, Kmax+1) in-flight multiplier of the k-th stage from the end
    kind_ix: np.ndarray  # (N,) kind index of every layer
    present: np.ndarray  # kind indices that occur
    p2p: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (rows, T, 2) filled lazily (nan = unknown)
    _bounds: dict[int, Bounds] = field(default_factory=dict)

    def bounds(self, pos: int) -> Bounds:
        """Lower bounds on placing layers ``[0, s)`` on stages that all sit ``pos`` or more from the end.

        Only options that can hold one layer next to their fixed memory at that position's in-flight
        count take part (in-flight counts only grow towards the first stage), so memory-starved options
        do not weaken the bounds: per layer, the least stage time (``sum_pre``: the stages' times add up
        to at least this), the least device-seconds (``w_pre``: the slowest stage takes at least this
        over the devices that can absorb it) and the least bytes summed over devices (``m_pre``, with the
        first stage's embedding and one stage's fixed memory). ``inv_r[g, t]``: how much less a device of
        type ``t`` does per second than the fastest option, at best; ``cap_t``: a type's largest capacity.
        """
        hit = self._bounds.get(pos)
        if hit is None:
            hit = self._bounds[pos] = _level_bounds(self, pos)
        return hit

    @property
    def n_groups(self) -> int:
        return len(self.subs)

    def pair_bound(
        self,
        grp: np.ndarray,
        mt: np.ndarray,
        mx: np.ndarray,
        ms: np.ndarray,
        tau: np.ndarray,
        sync: np.ndarray,
        rest_sum: np.ndarray,
        rest_max: np.ndarray | None = None,
    ) -> np.ndarray:
        """Least objective a (state, stage) pair can reach from its state's least label (``mt, mx, ms``):
        its stage (``tau``, ``sync``) plus at least ``rest_sum`` summed and ``rest_max`` as the slowest
        stage for the layers still to place."""
        tmax = np.maximum(mx, tau) if rest_max is None else np.maximum(np.maximum(mx, tau), rest_max)
        return self.alpha[grp] * (mt + tau + rest_sum) + self.beta[grp] * tmax + np.maximum(ms, sync)

    def p2p_for(self, rows: np.ndarray, nd: np.ndarray, small: np.ndarray) -> np.ndarray:
        """p2p time of the boundary out of option ``rows`` into a next stage of type ``nd`` (small or not),
        priced by the cost model on first use."""
        val = self.p2p[rows, nd, small]
        miss = np.isnan(val)
        if miss.any():
            for r, t, sm in set(zip(rows[miss].tolist(), nd[miss].tolist(), small[miss].tolist(), strict=True)):
                o = self.row_opt[r]
                inst = self.subs[int(self.row_grp[r])].inst
                dst = self.types[t]
                self.p2p[r, t, sm] = inst.p2p(o, dst, 1 if sm else int(self.node[t]))
            val = self.p2p[rows, nd, small]
        return val


@dataclass(frozen=True)
class Bounds:
    sum_pre: np.ndarray  # (G, N+1)
    w_pre: np.ndarray  # (G, N+1)
    m_pre: np.ndarray  # (G, N+1)
    cap_t: np.ndarray  # (G, T)
    inv_r: np.ndarray  # (G, T)
    gmax_t: np.ndarray  # (G, T) largest stage of a type
    line_a: np.ndarray  # (G, T, HULL_LINES) per device of a type: layers at stage time T <= min_j(a T + b)
    line_b: np.ndarray


def _level_bounds(b: Batch, pos: int) -> Bounds:
    G, T, n = b.n_groups, len(b.types), b.n_layers
    col = min(pos, b.infl.shape[1] - 1)
    infl = b.infl[b.row_grp, col]  # (R,) least in-flight count of any remaining stage
    pk = b.present
    mem_k = b.coef[:, :, W] + infl[:, None] * b.coef[:, :, A]  # (R, K)
    usable = (b.cap - b.fixed) >= mem_k[:, pk].min(axis=1)
    inf = np.inf
    tb = b.coef[:, :, F] + b.coef[:, :, B]
    gcol = b.g[:, None].astype(float)
    t_row = np.where(usable[:, None], tb, inf)
    w_row = t_row * gcol
    m_row = np.where(usable[:, None], mem_k * gcol, inf)
    fe = b.first[:, F] + b.first[:, B]
    fe_t = np.where(usable, fe, inf)
    fe_w = fe_t * b.g
    fe_m = np.where(usable, (b.first[:, W] + infl * b.first[:, A] + b.fixed) * b.g, inf)
    lo = b.grp_lo
    t_k = np.minimum.reduceat(t_row, lo, axis=0)  # (G, K)
    w_k = np.minimum.reduceat(w_row, lo, axis=0)
    m_k = np.minimum.reduceat(m_row, lo, axis=0)
    e_t = np.minimum.reduceat(fe_t, lo)
    e_w = np.minimum.reduceat(fe_w, lo)
    e_m = np.minimum.reduceat(fe_m, lo)
    sum_pre = np.zeros((G, n + 1))
    w_pre = np.zeros((G, n + 1))
    m_pre = np.zeros((G, n + 1))
    with np.errstate(invalid="ignore"):
        sum_pre[:, 1:] = np.cumsum(t_k[:, b.kind_ix], axis=1) + e_t[:, None]
        w_pre[:, 1:] = np.cumsum(w_k[:, b.kind_ix], axis=1) + e_w[:, None]
        m_pre[:, 1:] = np.cumsum(m_k[:, b.kind_ix], axis=1) + e_m[:, None]
    cap_t = np.zeros((G, T))
    inv_r = np.zeros((G, T))
    gmax_t = np.zeros((G, T))
    for t in range(T):
        sel = usable & (b.typ == t)
        cap_t[:, t] = np.maximum.reduceat(np.where(sel, b.cap, 0.0), lo)
        gmax_t[:, t] = np.maximum.reduceat(np.where(sel, b.g, 0), lo)
        wt = np.minimum.reduceat(np.where(sel[:, None], w_row, inf), lo, axis=0)  # (G, K)
        et = np.minimum.reduceat(np.where(sel, fe_w, inf), lo)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratios = np.concatenate([wt[:, pk] / w_k[:, pk], (et / e_w)[:, None]], axis=1)
        ratios = np.where(np.isnan(ratios), inf, ratios)
        r = np.maximum(ratios.min(axis=1), 1.0)
        inv_r[:, t] = np.where(np.isfinite(r), 1.0 / r, 0.0)
    # Per device of a type, the layers it can take when no stage may exceed time T: with option o, a
    # stage of g_o devices holding n layers needs n * t_o <= T and n * m_o <= cap - fixed_o (m_o: the
    # least bytes per layer and device at this in-flight count), so n / g_o <= min(T / w_o, L_o). The
    # best option per T is the upper envelope of these ramps; its concave hull (lines through the points
    # (w_o * L_o, L_o) from the origin, then flat at the largest L_o) is a concave upper bound, kept as
    # the lines whose minimum it is.
    mem_min = mem_k[:, pk].min(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        L = (b.cap - b.fixed) / np.where(mem_min > 0, mem_min, np.nan) / b.g
    L = np.where(np.isnan(L), 1e18, np.minimum(L, 1e18))
    w_min = (tb[:, pk] * gcol).min(axis=1)
    ok = usable & (L > 0) & (w_min > 0)
    la = np.zeros((G, T, HULL_LINES))
    lb_ = np.full((G, T, HULL_LINES), NO_LINE)
    for t in range(T):
        sel = ok & (b.typ == t)
        cnt = np.add.reduceat(sel.astype(np.int64), lo)
        # one option of the type (every megatron group): its ramp is already concave
        one = np.flatnonzero(cnt == 1)
        if len(one):
            r1 = np.flatnonzero(sel)
            r1 = r1[np.isin(b.row_grp[r1], one)]
            g1 = b.row_grp[r1]
            la[g1, t, 0] = 1.0 / w_min[r1]
            lb_[g1, t, 0] = 0.0
            la[g1, t, 1] = 0.0
            lb_[g1, t, 1] = L[r1]
        for gi in np.flatnonzero(cnt > 1):
            rows = np.flatnonzero(sel[lo[gi] : b.grp_hi[gi]]) + lo[gi]
            lines = _hull_lines(w_min[rows] * L[rows], L[rows])
            la[gi, t, : len(lines)] = [a for a, _ in lines]
            lb_[gi, t, : len(lines)] = [c for _, c in lines]
    return Bounds(sum_pre, w_pre, m_pre, cap_t, inv_r, gmax_t, la, lb_)


HULL_LINES = 6  # lines kept per concave bound (fewer lines: a looser, still valid bound)
NO_LINE = 1e300  # intercept of a padding line: never the minimum


def _hull_lines(x: np.ndarray, y: np.ndarray) -> list[tuple[float, float]]:
    """Lines (slope, intercept) whose minimum is the upper concave hull of ``(0, 0)`` and the points, then
    flat at the largest ``y``; at most HULL_LINES of them (a subset of the lines bounds from above too)."""
    top = float(y.max())
    xt = float(x[y >= top].min())
    pts = sorted({(float(a), float(c)) for a, c in zip(x, y, strict=True) if a <= xt})
    hull: list[tuple[float, float]] = [(0.0, 0.0)]
    for p in pts:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) >= 0:  # hull[-1] under the chord
                hull.pop()
            else:
                break
        hull.append(p)
    lines = []
    for (x1, y1), (x2, y2) in itertools.pairwise(hull):
        if x2 > x1:
            a = (y2 - y1) / (x2 - x1)
            lines.append((a, y1 - a * x1))
    if len(lines) > HULL_LINES - 1:
        keep = np.unique(np.linspace(0, len(lines) - 1, HULL_LINES - 1).round().astype(int))
        lines = [lines[i] for i in keep]
    lines.append((0.0, top))
    return lines


def capacity_bound(bd: Bounds, grp: np.ndarray, s: np.ndarray, rem: np.ndarray) -> np.ndarray:
    """Least possible slowest-stage time for placing ``s`` layers on ``rem`` remaining devices per type
    (inf when they cannot hold the layers at all).

    Capacity at stage time T is at most ``C(T) = sum_t rem_t * min_j (a_tj T + b_tj)`` (the concave
    bounds of :class:`Bounds`), a sum of minima, i.e. the minimum over one line per type; so
    ``C(T) >= s`` needs ``T >= (s - sum b) / sum a`` for every such choice, and the bound is the largest.
    """
    n = len(s)
    out = np.zeros(n)
    if n == 0:
        return out
    remf = rem.astype(float)
    T = remf.shape[1]
    nl = bd.line_a.shape[2]
    A = bd.line_a[grp] * remf[:, :, None]  # (n, T, NL)
    Bv = np.where(remf[:, :, None] > 0, bd.line_b[grp] * remf[:, :, None], 0.0)
    need = s.astype(float)
    best = np.zeros(n)
    for combo in itertools.product(range(nl), repeat=T):
        sa = np.zeros(n)
        sb = np.zeros(n)
        for t, j in enumerate(combo):
            sa += A[:, t, j]
            sb += Bv[:, t, j]
        with np.errstate(divide="ignore", invalid="ignore"):
            tt = np.where(sa > 0, (need - sb) / np.where(sa > 0, sa, 1.0), np.where(sb < need, np.inf, 0.0))
        best = np.maximum(best, tt)
    out[:] = np.where(s > 0, best * (1.0 - 1e-9), 0.0)
    return out


def _capacity_unique(
    bd: Bounds, grp: np.ndarray, s: np.ndarray, rem: np.ndarray, G: int, N: int, inv: np.ndarray
) -> np.ndarray:
    """:func:`capacity_bound` evaluated once per distinct (group, start, remaining devices)."""
    T = rem.shape[1]
    key = pack([grp, s, *[rem[:, t] for t in range(T)]], [G, N + 1, *[int(inv[t]) + 1 for t in range(T)]])
    if key is None:
        return capacity_bound(bd, grp, s, rem)
    _uk, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    vals = capacity_bound(bd, grp[first], s[first], rem[first])
    return vals[inverse.ravel()]


def rest_unique(
    batch: Batch, k: int, grp: np.ndarray, s: np.ndarray, rem: np.ndarray, gsz: np.ndarray, bd: Bounds
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``dp_levels._rest`` for each row, plus per row how many memory rules removed it (0 or 1, for the
    count): for layers ``[0, s)`` still to place on ``rem`` devices per type at level ``k``, whether it
    is possible at all, and lower bounds on the sum and on the largest of the remaining stages' times."""
    ok = rem.sum(axis=1) > 0
    memb = bd.m_pre[grp, s] > (rem * bd.cap_t[grp]).sum(axis=1)  # bytes needed vs capacity left
    n_mem = (ok & memb).astype(np.int64)
    ok &= ~memb
    fpp = batch.pp[grp]
    left = np.where(fpp > 0, fpp - k, batch.kmax[grp] - k)
    # device-seconds per second the rest can absorb: all remaining devices at their best rate, and no
    # more than `left` stages of at most the largest stage each
    big = (np.minimum(rem, bd.gmax_t[grp]) * bd.inv_r[grp]).max(axis=1)
    eff = np.minimum((rem * bd.inv_r[grp]).sum(axis=1), left * big)
    ok &= (left > 0) & (eff > 0)
    fixed_g = fpp > 0
    if fixed_g.any():  # a fixed-depth (megatron) plan needs room for its remaining stages of this size
        ok &= ~fixed_g | ((rem // np.maximum(gsz, 1)[:, None]).sum(axis=1) >= left)
    t_cap = _capacity_unique(bd, grp, s, rem, batch.n_groups, batch.n_layers, batch.inv)
    memc = ~np.isfinite(t_cap)
    n_mem += ok & memc
    ok &= ~memc
    w = bd.w_pre[grp, s]
    with np.errstate(divide="ignore", invalid="ignore"):
        rest_max = np.maximum(np.where(eff > 0, w / np.where(eff > 0, eff, 1.0), 0.0), np.where(memc, 0.0, t_cap))
        # the stages' times add up to at least the per-layer least times, and to at least the work
        # over the largest stage the remaining devices can still form
        rest_sum = np.maximum(bd.sum_pre[grp, s], np.where(big > 0, w / np.where(big > 0, big, 1.0), 0.0))
    return ok, rest_sum, rest_max, n_mem


def kind_order(kinds_seq: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted(set(kinds_seq)))


def build_batch(subs: list[DPScope], cache: RowCache, *, band: bool = True, clock: Clock | None = None) -> Batch | None:
    """Stack the options of ``subs`` (each sub-problem is one group of rows) into arrays.

    ``cache`` keeps each option's row (its coefficients, priced on first use). With ``band=False`` every
    option may hold any number of layers (the refinement pass). None when ``clock`` ran out while the
    options were being priced.
    """
    inst0 = subs[0].inst
    model, cluster = inst0.model, inst0.cluster
    kinds_seq = model.layer_kinds
    kinds = kind_order(kinds_seq)
    types = tuple(cluster.inventory)
    n = len(kinds_seq)
    kc = np.zeros((len(kinds), n + 1), dtype=np.int64)
    for j, k in enumerate(kinds):
        kc[j, 1:] = np.cumsum([1 if x == k else 0 for x in kinds_seq])
    inv = np.array([cluster.inventory[t] for t in types], dtype=np.int64)
    node = np.array([cluster.node_size(t) for t in types], dtype=np.int64)
    rows = _rows(subs, cache, band, n, len(kinds), clock)
    if rows is None:
        return None
    # layer kinds present decide the least per-layer time of a row
    present = [kinds.index(k) for k in set(kinds_seq)]
    coef, g, typ = rows["coef"], rows["g"], rows["typ"]
    tmin = (coef[:, :, F] + coef[:, :, B])[:, present].min(axis=1)
    tg_keys, tg = np.unique(typ * (int(g.max()) + 1) + g, return_inverse=True)
    tg_t, tg_g = np.divmod(tg_keys, int(g.max()) + 1)
    groups = _group_arrays(subs, g, rows["grp_lo"], rows["grp_hi"], n, int(inv.sum()))
    batch = Batch(
        subs=subs,
        types=types,
        inv=inv,
        node=node,
        kind_count=kc,
        n_layers=n,
        **rows,
        small=g < node[typ],
        tmin=tmin,
        tg=tg.astype(np.int64),
        tg_t=tg_t.astype(np.int64),
        tg_g=tg_g.astype(np.int64),
        **groups,
        kind_ix=np.array([kinds.index(k) for k in kinds_seq], dtype=np.int64),
        present=np.array(present, dtype=np.int64),
    )
    batch.p2p = np.full((len(batch.row_opt), len(types), 2), np.nan)
    return batch


def _rows(
    subs: list[DPScope], cache: RowCache, band: bool, n: int, K: int, clock: Clock | None
) -> dict[str, Any] | None:
    """The rows of every sub-problem's options (coefficients, edges, capacity, type, size, DP degree,
    recompute level, shape id, layer band), groups one after another; None if the clock ran out."""
    row_opt: list[Option] = []
    grp_sizes = []
    for sub in subs:
        row_opt.extend(sub.options)
        grp_sizes.append(len(sub.options))
    rows = []
    for i, o in enumerate(row_opt):
        if clock is not None and i % 64 == 0 and clock.passed():
            return None  # pricing the options took the time that was left
        rows.append(cache.row(o))
    mat = np.stack(rows)
    c0 = K * N_ATTR
    rest = mat[:, c0 + 3 * (N_ATTR + 1) :]
    typ, g, dp, level, shape0, lo, hi = (rest[:, i].astype(np.int64) for i in range(2, 9))
    row_grp = np.repeat(np.arange(len(subs)), grp_sizes)
    # shape ids must be unique across groups: offset them
    shape = shape0 + row_grp * SHAPE_STRIDE
    if not band:
        lo = np.ones_like(lo)
        hi = np.full_like(hi, n)
    else:
        # a shape's recompute levels share the band of its cheapest level (centred on the speed without
        # recompute): memory may force a costlier level, not a different layer share
        order = np.lexsort((level, shape))
        head = np.r_[True, shape[order][1:] != shape[order][:-1]]
        owner = order[np.flatnonzero(head)[np.cumsum(head) - 1]]
        lo_s, hi_s = lo.copy(), hi.copy()
        lo[order], hi[order] = lo_s[owner], hi_s[owner]
    grp_hi = np.cumsum(grp_sizes)
    return {
        "row_grp": row_grp,
        "row_opt": row_opt,
        "coef": mat[:, :c0].reshape(len(row_opt), K, N_ATTR),
        "first": mat[:, c0 : c0 + N_ATTR + 1],
        "last": mat[:, c0 + N_ATTR + 1 : c0 + 2 * (N_ATTR + 1)],
        "single": mat[:, c0 + 2 * (N_ATTR + 1) : c0 + 3 * (N_ATTR + 1)],  # first and last at once (PP = 1)
        "fixed": rest[:, 0],
        "cap": rest[:, 1],
        "typ": typ,
        "g": g,
        "dp": dp,
        "level": level,
        "shape": shape,
        "lo": lo,
        "hi": hi,
        "grp_lo": grp_hi - np.array(grp_sizes),
        "grp_hi": grp_hi,
        "tp": np.array([o.cfg.tp for o in row_opt], dtype=np.int64),
        "mesh": shape0,  # mesh identity (device type and config) across groups, for the runtime's stage rules
    }


def _group_arrays(
    subs: list[DPScope], g: np.ndarray, grp_lo: np.ndarray, grp_hi: np.ndarray, n: int, total_inv: int
) -> dict[str, np.ndarray]:
    """Per sub-problem (group): pipeline coefficients, schedule, depth caps, the family's rules, the
    stage minima and the in-flight multiplier of every position from the end."""
    G = len(subs)
    out = {
        "alpha": np.zeros(G),
        "beta": np.zeros(G),
        "vpp": np.ones(G, dtype=np.int64),
        "pp": np.zeros(G, dtype=np.int64),
        "kmax": np.zeros(G, dtype=np.int64),
        "capped": np.zeros(G, dtype=bool),
        "first_dp": np.zeros(G, dtype=np.int64),
        "contiguous": np.zeros(G, dtype=bool),
        "uniform": np.zeros(G, dtype=bool),
        "gmax": np.zeros(G, dtype=np.int64),
        "lo_stage": np.ones((G, 3), dtype=np.int64),
        "edge_tp": np.zeros(G, dtype=bool),
        "edge_dp": np.zeros(G, dtype=bool),
        "mesh_min": np.ones(G, dtype=np.int64),
    }
    for i, sub in enumerate(subs):
        inst = sub.inst
        pr = inst.pruning
        out["alpha"][i], out["beta"][i] = inst.coefficients
        out["vpp"][i] = inst.vpp
        out["pp"][i] = sub.pp
        out["gmax"][i] = int(g[grp_lo[i] : grp_hi[i]].max())
        km = n if pr.max_stages <= 0 else min(n, pr.max_stages)
        km = min(km, total_inv)
        out["kmax"][i] = sub.pp if sub.pp else km
        out["capped"][i] = not sub.pp and pr.max_stages > 0 and pr.max_stages < min(n, total_inv)
        out["first_dp"][i] = inst.first_dp
        out["contiguous"][i] = inst.family == "hetero" or inst.stage_rules.types_grouped
        out["uniform"][i] = pr.uniform_stage_size or (bool(out["contiguous"][i]) and 0 < pr.large_cluster < total_inv)
        out["lo_stage"][i] = inst.stage_min_layers
        rules = inst.stage_rules
        out["edge_tp"][i], out["edge_dp"][i] = rules.edge_tp, rules.edge_dp
        out["mesh_min"][i] = rules.mesh_min_stages
    kmax = out["kmax"]
    kk = int(kmax.max())
    infl = np.zeros((G, kk + 1))
    cache: dict[tuple, np.ndarray] = {}
    for i, sub in enumerate(subs):
        key = (id(sub.inst), sub.pp, int(kmax[i]))
        row = cache.get(key)
        if row is None:
            row = np.zeros(kk + 1)
            for k in range(1, int(kmax[i]) + 1):
                row[k] = sub.inst.in_flight(k, sub.pp or None)
            cache[key] = row
        infl[i] = row
    out["infl"] = infl
    return out


def aligned_vec(start: np.ndarray, g: np.ndarray, node: np.ndarray) -> np.ndarray:
    """Vector form of :func:`hapmoe_milp.instance.aligned`."""
    inside = (start // node) == ((start + g - 1) // node)
    return np.where(g <= node, inside, start % node == 0)


__all__ = [
    "Batch",
    "Clock",
    "DPScope",
    "RowCache",
    "aligned",
    "aligned_vec",
    "build_batch",
    "capacity_bound",
    "rest_unique",
]
