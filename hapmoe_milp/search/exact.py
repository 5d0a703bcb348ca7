"""Exact solvers over the shared instance: the model data both CP-SAT and the MILP read, the
decomposition into sub-problems, and the certificate.

Why a decomposition: an instance (one micro-batch step) ties stages together through its family's
group key (one mesh for ``megatron``; the same CP and "EP on or off" for ``hetero``). Solving one model
per (instance, group) keeps every model small, lets a sub-problem whose cheap lower bound already
exceeds the incumbent be skipped outright, and lets each later model carry the incumbent as an
objective cutoff -- a sub-problem that is infeasible under the cutoff is *proven* no better. The overall
bound is the minimum over sub-problems of what each proved (its root bound when it was skipped or
stopped early), so it stays a valid lower bound whatever the time limit.

The model (both backends), for one sub-problem with options ``O`` and ``K`` stage slots counted from the
end (slot 1 = last stage, as in the DP, so the 1F1B in-flight count ``min(M, k)`` is a constant):

- ``used[k]`` (slot 1 always, monotone), ``z[k,o]`` one option per used slot;
- ``c[k,l]`` = "layer l lies in slots >= k", monotone in k and l, so slot k holds the contiguous range
  ``[sum_l c[k+1,l], sum_l c[k,l])`` and its per-kind layer counts ``n[k,kind]`` are exact by position;
- the first stage is the highest used slot: ``first[k] = used[k] - used[k+1]``; it must have
  ``dp == inst.first_dp`` and carries the embedding edge; slot 1 carries the head edge;
- stage time ``tau[k] = sum_kind (fwd+bwd)[o,kind] n[k,kind] + edges + 2 p2p[k]``, where ``p2p[k]`` is the
  boundary to slot k-1, priced by ``inst.p2p`` from slot k's option and slot k-1's (device, smaller than
  a node) link class;
- memory ``sum_kind (weights + min(M,k) act)[o,kind] n[k,kind] + fixed + edges <= capacity``;
- exposed sync ``sigma >= max(0, RS - BWD) + max(0, AG - FWD) + OPT`` written as one linear "piece" per
  choice of each max (with the default overlap settings: four pieces, dominated ones dropped);
- ``tau_max >= tau[k]``; device inventory per type; layer band ``n[k] in o.band`` when that switch is on;
  the cross-type rule ``2 p2p <= eta (fwd+bwd)`` when ``cross_type_comm`` is on (as the DP applies it);
- objective ``alpha sum tau + beta tau_max + sigma``.
``min_recompute`` and ``pareto_eps`` are DP heuristics and are ignored: the exact models consider every
recompute level. ``uniform_stage_size`` (and ``large_cluster`` above its size) is the DP's rule that
adjacent stages of one device type have one size; the models state it as a constraint. The DP's layout
rules are constraints too: a hetero plan keeps each device type's stages contiguous, and stages take
their type's devices from the end without straddling a node (``instance.aligned``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from hapmoe_milp.config import Settings
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.cost.model import LayerCost
from hapmoe_milp.errors import SolverError
from hapmoe_milp.instance import Instance, Option, build_instances, group_keys, in_group
from hapmoe_milp.plan import Plan, Stage
from hapmoe_milp.search.solution import Progress, ProgressEvent, Solution
from hapmoe_milp.space import PruneCounter, Pruning
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import LayerKind, ModelSpec

log = logging.getLogger(__name__)

#: The exact solvers' default space: every pruning switch off except option dominance, which only drops
#: an option that another option of the same device, size, CP, EP-on/off, DP and recompute level beats
#: or ties in every coefficient (so it never changes the optimum; tests/test_search_dp.py pins that).
EXACT_PRUNING = replace(Pruning.off(), dominance=True)

SubStatus = Literal["optimal", "feasible", "infeasible", "timeout"]
Piece = tuple[tuple[str, float], ...]


# ------------------------------------------------------------------------------------------ model data
@dataclass
class SubModel:
    """Everything a backend needs for one (instance, group keys) sub-problem, in seconds and bytes."""

    inst: Instance
    keys: list[tuple]
    options: list[Option]
    groups: list[list[int]]  # option positions per group key; >1 group -> group-selection booleans
    K: int  # stage slots
    kinds: list[LayerKind]  # distinct layer kinds, sorted
    kind_layers: dict[LayerKind, list[int]]  # positions of each kind
    uniform: bool  # one layer kind only (enables the symmetry cut)
    types: list[str]  # device types with inventory
    classes: list[tuple[str, bool]]  # link classes (device, smaller than a node) a stage can have
    cls_of: list[int]  # per option: its class index
    p2p: list[list[float]]  # per option, per destination class: seconds per transfer
    allowed: list[list[bool]]  # [k-1][i]: option i may sit in slot k
    pieces: list[Piece]
    root_bound: float
    group_root: list[float]
    alpha: float
    beta: float
    contiguous: bool = False  # hetero: each device type's stages form one contiguous block
    node: dict[str, int] = field(default_factory=dict)
    align_types: list[str] = field(default_factory=list)  # types whose stages could straddle a node
    tau_floor: float = 0.0  # covering lower bound on tau_max (seconds), see covering_bound
    same_size: bool = False  # adjacent stages of one type have one size (uniform_stage_size, large_cluster)
    group_parts: list[list[float]] = field(default_factory=list)  # per group: [sum tau lb, W/D, tau_max lb]
    tightened: bool = False

    @property
    def N(self) -> int:
        return self.inst.num_layers

    @property
    def M(self) -> int:
        return self.inst.num_microbatches

    def infl(self, k: int) -> float:
        return self.inst.in_flight(k)

    # per-option coefficients (floats; backends scale/round them) --------------------------------
    def time_kind(self, i: int, kind: LayerKind) -> float:
        c = self.options[i].per_kind[kind]
        return c.fwd + c.bwd

    def time_first(self, i: int) -> float:
        e = self.options[i].first
        return e.fwd + e.bwd

    def time_last(self, i: int) -> float:
        e = self.options[i].last
        return e.fwd + e.bwd

    def mem_kind(self, i: int, kind: LayerKind, k: int) -> float:
        c = self.options[i].per_kind[kind]
        return c.weights + self.infl(k) * c.act

    def mem_first(self, i: int, k: int) -> float:
        e = self.options[i].first
        return e.weights + self.infl(k) * e.act + e.work

    def mem_fixed(self, i: int, k: int) -> float:
        """Memory that does not depend on the layer count: fixed, plus the head edge on slot 1."""
        o = self.options[i]
        v = o.fixed
        if k == 1:
            e = o.last
            v += e.weights + self.infl(1) * e.act + e.work
        return v

    def piece_coef(self, piece: Piece, lc: LayerCost, i: int) -> float:
        # compute terms (fwd/bwd) hide sync only to the device's dp_overlap share (CostModel.exposed_sync)
        k = self.inst.cost_model.device(self.options[i].device).runtime.dp_overlap
        return sum(sign * (k if attr in ("fwd", "bwd") else 1.0) * getattr(lc, attr) for attr, sign in piece) + lc.opt

    def piece_kind(self, p: Piece, i: int, kind: LayerKind) -> float:
        return self.piece_coef(p, self.options[i].per_kind[kind], i)

    def piece_first(self, p: Piece, i: int) -> float:
        return self.piece_coef(p, self.options[i].first, i)

    def piece_last(self, p: Piece, i: int) -> float:
        return self.piece_coef(p, self.options[i].last, i)

    def counts(self, s: int, e: int) -> dict[LayerKind, int]:
        kinds = self.inst.layer_kinds
        out = dict.fromkeys(self.kinds, 0)
        for l in range(s, e):
            out[kinds[l]] += 1
        return out

    def describe(self) -> str:
        inst = self.inst
        keys = ",".join(_key_label(k) for k in self.keys)
        return f"{inst.family} M={inst.num_microbatches} [{keys}] ({len(self.options)} options, K={self.K})"


def _key_label(key: tuple) -> str:
    if key[0] == "cfg":
        return key[1].label().replace(" ", "")
    return f"CP{key[1]}{'EP' if key[2] else 'noEP'}"


def option_name(o: Option) -> str:
    """Readable, unique-within-an-instance name for constraint labels (e.g. ``h800_TP2CP1DP1EP2ETP1_none``)."""
    c = o.cfg
    return f"{o.device}_TP{c.tp}CP{c.cp}DP{c.dp}EP{c.ep}ETP{c.etp}_{o.recompute}"


def sync_pieces(st: Settings) -> list[Piece]:
    """Linear pieces whose maximum is ``max(0, rs - k*bwd) + max(0, ag - k*fwd) + opt`` (evaluate's sync,
    :meth:`CostModel.exposed_sync`; ``k`` is the option's device's ``dp_overlap``, applied in piece_coef)."""
    grad: list[Piece] = [(("rs", 1.0), ("bwd", -1.0)), ()] if st.overlap_grad_reduce else [(("rs", 1.0),)]
    param: list[Piece] = [(("ag", 1.0), ("fwd", -1.0)), ()] if st.overlap_param_gather else [(("ag", 1.0),)]
    return [g + p for g in grad for p in param]


def build_submodel(inst: Instance, keys: Sequence[tuple]) -> SubModel | None:
    """Collect the options of ``keys`` and every coefficient; None when no option can hold a stage."""
    pr = inst.pruning
    n = inst.num_layers
    groups_opts = [[o for o in inst.options if in_group(o, key)] for key in keys]
    options: list[Option] = []
    groups: list[list[int]] = []
    kept_keys: list[tuple] = []
    for key, opts in zip(keys, groups_opts):
        if not opts:
            continue
        kept_keys.append(key)
        groups.append(list(range(len(options), len(options) + len(opts))))
        options.extend(opts)
    if not options:
        return None
    inv = inst.inventory
    types = [t for t in inv if inv[t] > 0]
    kinds = sorted(set(inst.layer_kinds))
    kind_layers = {k: [l for l, kk in enumerate(inst.layer_kinds) if kk == k] for k in kinds}
    # slot count: no more stages than layers, devices, the stage cap, or what the inventory can host
    gmin: dict[str, int] = {}
    for o in options:
        gmin[o.device] = min(gmin.get(o.device, o.devices), o.devices)
    by_inv = sum(inv[t] // g for t, g in gmin.items())
    K = min(n, sum(inv.values()), by_inv)
    if pr.max_stages > 0:
        K = min(K, pr.max_stages)
    if K < 1:
        return None
    cluster = inst.cluster
    classes = sorted({(o.device, o.devices < cluster.node_size(o.device)) for o in options})
    cidx = {c: j for j, c in enumerate(classes)}
    cls_of = [cidx[(o.device, o.devices < cluster.node_size(o.device))] for o in options]
    node = {t: cluster.node_size(t) for t in types}
    p2p = [[inst.p2p(o, dev, 1 if small else node[dev]) for dev, small in classes] for o in options]
    sub = SubModel(
        inst=inst,
        keys=kept_keys,
        options=options,
        groups=groups,
        K=K,
        kinds=kinds,
        kind_layers=kind_layers,
        uniform=len(kinds) == 1,
        types=types,
        classes=classes,
        cls_of=cls_of,
        p2p=p2p,
        allowed=[],
        pieces=[],
        root_bound=0.0,
        group_root=[],
        alpha=inst.coefficients[0],
        beta=inst.coefficients[1],
    )
    sub.pieces = sync_pieces(inst.settings)
    sub.contiguous = inst.family == "hetero"
    sub.same_size = pr.uniform_stage_size or (sub.contiguous and 0 < pr.large_cluster < sum(inv.values()))
    sub.node = node
    for t in types:
        sizes = {o.devices for o in options if o.device == t}
        # one size that divides the node (and a whole number of nodes per type) can never straddle
        if len(sizes) > 1 or any(node[t] % g and g % node[t] for g in sizes) or inv[t] % node[t]:
            sub.align_types.append(t)
    first_dp = inst.first_dp
    allowed: list[list[bool]] = []
    for k in range(1, K + 1):
        row = []
        for i, o in enumerate(options):
            ok = True
            if k == K and o.cfg.dp != first_dp:
                ok = False  # the highest slot, when used, is the first stage
            elif o.band[0] > n - (k - 1):
                ok = False
            else:
                # smallest memory this option can need here: one layer of its lightest kind
                must_first = k == K
                m1 = sub.mem_fixed(i, k) + min(sub.mem_kind(i, kd, k) for kd in kinds)
                if must_first:
                    m1 += sub.mem_first(i, k)
                ok = m1 <= o.capacity
            row.append(ok)
        allowed.append(row)
    sub.allowed = allowed
    if not any(allowed[0]):
        return None
    # root lower bound per group: the DP's (each layer needs >= w_l device-seconds on any option, so
    # sum(tau) >= W / g_max and tau_max >= W / (devices in the cluster)) and the covering bound on
    # tau_max; edges, p2p and sync are >= 0
    D = sum(inv.values())
    for grp in groups:
        W = sum(min(sub.time_kind(i, kd) * options[i].devices for i in grp) for kd in inst.layer_kinds)
        gmax = max(options[i].devices for i in grp)
        # every layer runs somewhere: sum(tau) >= the fastest per-layer time of each layer
        fastest = sum(min(sub.time_kind(i, kd) for i in grp) for kd in inst.layer_kinds)
        sub.group_parts.append([max(W / gmax, fastest), W / D, covering_bound(sub, grp)])
    _update_roots(sub)
    return sub


def _update_roots(sub: SubModel) -> None:
    roots = []
    for sum_lb, wd, tf in sub.group_parts:
        if math.isinf(tf):
            roots.append(math.inf)  # no plan in this group at all (and 0 * inf would be nan when M = 1)
        else:
            roots.append(sub.alpha * max(sum_lb, tf) + sub.beta * max(wd, tf))
    sub.group_root = roots
    sub.root_bound = min(roots)
    sub.tau_floor = min(p[2] for p in sub.group_parts)


def tighten(sub: SubModel, incumbent: float) -> None:
    """Raise the sub-problem's covering bound with the layout rules, in the window an improvement needs.

    Any plan of a group that beats ``incumbent`` has ``tau_max <= (incumbent - alpha sum_lb) / beta``, so
    the exact covering (:func:`covering_bound` with ``layout=True``) only has to bisect between the plain
    covering bound and that limit -- a handful of candidate stage times. Called lazily, right before a
    sub-problem is first solved, so sub-problems the cheap bound already excludes never pay for it.
    """
    if sub.tightened or sub.beta <= 0 or not math.isfinite(incumbent):
        return
    for g, part in enumerate(sub.group_parts):
        sum_lb, _, tf = part
        if math.isinf(tf) or sub.group_root[g] >= incumbent:
            continue
        hi = (incumbent - sub.alpha * sum_lb) / sub.beta
        part[2] = max(tf, covering_bound(sub, sub.groups[g], layout=True, lo=tf, hi=hi))
    sub.tightened = True
    _update_roots(sub)


def covering_bound(
    sub: SubModel, grp: Sequence[int], *, layout: bool = False, lo: float = 0.0, hi: float = math.inf
) -> float:
    """Smallest bottleneck t for which stages of time <= t, placed slot by slot, can hold every layer.

    Why it is valid (a relaxation of the model): a stage of option o with n layers in slot k takes at
    least ``n x (o's fastest layer kind)``, plus the head on slot 1, the embedding on the first stage and
    the option's cheapest p2p elsewhere, and needs at least ``n x (o's lightest layer at min(M, k)
    micro-batches in flight)`` + fixed memory (+ the edges it holds). So under a bottleneck t, slot k with
    option o holds at most ``n_max(o, k, t)`` layers, and the first stage must also have ``dp ==
    first_dp``. A DP over slots 1, 2, ... (from the end) and devices used per type gives the most layers
    any pipeline can hold; if that is below N at every depth, every plan's bottleneck exceeds t. With
    ``layout=True`` the state also carries the next stage's device type (so the p2p is the cheapest one
    towards that type) and, for hetero, the types already placed (contiguity), and a stage must not
    straddle a node (``instance.aligned``) -- slower, so :func:`tighten` runs it lazily in a window.
    The sync is left out. Returns the smallest candidate stage time in ``[lo, hi]`` that holds; if none
    does, the smallest candidate above ``hi`` (or ``inf``): every plan's bottleneck is at least that.
    """
    import numpy as np

    from hapmoe_milp.instance import aligned

    inst = sub.inst
    N, K = inst.num_layers, sub.K
    first_dp = inst.first_dp
    T = len(sub.types)
    inv = [inst.inventory[t] for t in sub.types]
    tpos = {t: j for j, t in enumerate(sub.types)}
    contiguous = layout and sub.contiguous and T > 1
    nlt = T + 1 if layout else 1  # next stage's type (T = none: slot 1), only tracked with layout
    nmask = 2**T if contiguous else 1
    shape = (*(v + 1 for v in inv), nlt, nmask)
    # per slot, for a middle and for a first stage: (type, size, time per layer, fixed time per next type,
    # max layers by memory)
    Item = tuple[int, int, float, tuple[float, ...], int]
    mids: list[list[Item]] = []
    firsts: list[list[Item]] = []
    cands: set[float] = set()
    for k in range(1, K + 1):
        mid_row: list[Item] = []
        first_row: list[Item] = []
        for i in grp:
            if not sub.allowed[k - 1][i]:
                continue
            o = sub.options[i]
            t = min(sub.time_kind(i, kd) for kd in sub.kinds)
            if k == 1:
                base = [sub.time_last(i)] * nlt
            elif layout:
                base = [
                    2 * min((v for (d, _), v in zip(sub.classes, sub.p2p[i]) if d == typ), default=math.inf)
                    for typ in sub.types
                ] + [math.inf]
            else:
                base = [2 * min(sub.p2p[i])]
            mem = min(sub.mem_kind(i, kd, k) for kd in sub.kinds)
            room = o.capacity - sub.mem_fixed(i, k)
            for is_first in (False, True):
                if is_first and o.cfg.dp != first_dp:
                    continue
                ft = tuple(b + (sub.time_first(i) if is_first else 0.0) for b in base)
                r = room - (sub.mem_first(i, k) if is_first else 0.0)
                nmem = N if mem <= 0 else min(N, int(r // mem))
                if nmem < 1:
                    continue
                (first_row if is_first else mid_row).append((tpos[o.device], o.devices, t, ft, nmem))
                for f in ft:
                    if math.isfinite(f):
                        cands.update(f + t * n for n in range(1, nmem + 1))
        mids.append(mid_row)
        firsts.append(first_row)
    if not cands:
        return math.inf
    order = sorted(cands)
    neg = -(10**9)
    node = [sub.node.get(t, inst.cluster.node_size(t)) for t in sub.types]
    # alignment: a stage of size g of type j may follow u devices of j already used by later stages
    ok_cache: dict[tuple[int, int], Any] = {}

    def ok_mask(j: int, g: int) -> Any:
        """Over the devices of type j already used by later stages: may a size-g stage come next?"""
        key = (j, g)
        if key not in ok_cache:
            m = np.array([u + g <= inv[j] and aligned(inv[j] - u - g, g, node[j]) for u in range(inv[j] + 1)])
            shp = [1] * (T + 1)
            shp[j] = inv[j] + 1
            ok_cache[key] = m.reshape(shp)
        return ok_cache[key]

    def transitions(j: int) -> list[tuple[int, Any, Any]]:
        """(next stage's type, source masks, destination masks) for a stage of type j; each entry maps
        masks one to one, so a fancy-indexed update never writes one cell twice."""
        if not layout:
            return [(0, np.array([0]), np.array([0]))]
        out = []
        for lt in range(nlt):
            if not contiguous:
                out.append((lt, np.array([0]), np.array([0])))
                continue
            bit = 1 << j
            if lt == T:
                groups = [[0]]  # nothing placed yet
            else:
                groups = [[m for m in range(nmask) if m & bit and lt == j], [m for m in range(nmask) if not m & bit]]
            for src in groups:
                if src:
                    out.append((lt, np.array(src), np.array([m | bit for m in src])))
        return out

    trans = [transitions(j) for j in range(T)]

    def layers(t: float, ft: float, nm: int, tt: float) -> int:
        if not math.isfinite(ft):
            return 0
        return nm if t <= 0 else min(nm, int((tt - ft) / t * (1 + 1e-12)))

    def holds(tt: float) -> bool:
        best = np.full(shape, neg, dtype=np.int64)
        best[(*(0 for _ in inv), nlt - 1, 0)] = 0  # nothing placed yet ("next type" = none)
        for k in range(K):
            for ax, g, t, fts, nm in firsts[k]:  # the pipeline starts here
                sl = [slice(None)] * T
                sl[ax] = slice(0, inv[ax] + 1 - g)
                for lt, src_m, _ in trans[ax]:
                    n = layers(t, fts[lt], nm, tt)
                    if n < 1:
                        continue
                    b = best[(*sl, lt)][..., src_m]
                    if layout:
                        b = np.where(ok_mask(ax, g)[tuple(sl)], b, neg)
                    if b.size and int(b.max()) + n >= N:
                        return True
            if k == K - 1:
                break
            new = np.full(shape, neg, dtype=np.int64)
            for ax, g, t, fts, nm in mids[k]:  # a stage between this slot and the first
                sl = [slice(None)] * T
                dl = [slice(None)] * T
                sl[ax] = slice(0, inv[ax] + 1 - g)
                dl[ax] = slice(g, inv[ax] + 1)
                view = new[(*dl, ax if layout else 0)]
                for lt, src_m, dst_m in trans[ax]:
                    n = layers(t, fts[lt], nm, tt)
                    if n < 1:
                        continue
                    b = best[(*sl, lt)][..., src_m]
                    if layout:
                        b = np.where(ok_mask(ax, g)[tuple(sl)], b, neg)
                    view[..., dst_m] = np.maximum(view[..., dst_m], b + n)
            best = new
            if int(best.max()) < 0:
                return False
        return False

    window = [c for c in order if lo * (1 - 1e-12) <= c <= hi]
    above = [c for c in order if c > hi]
    if not window:
        return above[0] if above else math.inf
    if not holds(window[-1]):
        return above[0] if above else math.inf  # nothing up to hi holds: every plan is slower than that
    a, b = 0, len(window) - 1
    while a < b:
        mid = (a + b) // 2
        if holds(window[mid]):
            b = mid
        else:
            a = mid + 1
    return window[a]


def submodels(inst: Instance, split: str = "group") -> list[SubModel]:
    """``split='group'``: one model per group key; ``'instance'``: one per instance with group booleans."""
    keys = group_keys(inst)
    parts = [[k] for k in keys] if split == "group" else [keys]
    out = []
    for p in parts:
        sub = build_submodel(inst, p)
        if sub is not None:
            out.append(sub)
    return out


# ------------------------------------------------------------------------------------------ assignments
Assignment = list[tuple[int, int, int]]  # per stage from first to last: (option position, start, end)


def plan_of(sub: SubModel, assignment: Assignment) -> Plan:
    stages = tuple(
        Stage(sub.options[i].device, sub.options[i].cfg, s, e, sub.options[i].recompute)  # type: ignore[arg-type]
        for i, s, e in assignment
    )
    return sub.inst.make_plan(stages)


def assignment_of(sub: SubModel, plan: Plan) -> Assignment | None:
    """Map a plan (e.g. the DP's) onto this sub-problem's options, or None if it is not in it."""
    inst = sub.inst
    if plan.family != inst.family or plan.pp > sub.K or not plan.stages:
        return None
    if plan.samples_per_microbatch != inst.samples_per_mb:
        return None
    index = {(o.device, o.cfg, o.recompute): i for i, o in enumerate(sub.options)}
    out: Assignment = []
    P = plan.pp
    for j, s in enumerate(plan.stages):
        i = index.get((s.device, s.cfg, s.recompute))
        if i is None or not sub.allowed[P - j - 1][i]:
            return None
        out.append((i, s.layer_start, s.layer_end))
    gsets = [set(g) for g in sub.groups]
    if not any(all(i in g for i, _, _ in out) for g in gsets):
        return None
    return out


def extra_hint_values(sub: SubModel, hint: Assignment, keys: Iterable[tuple]) -> dict[tuple, int]:
    """Values of the contiguity and node-alignment helpers on a hinted plan (both backends)."""
    P = len(hint)
    dev = {P - j: sub.options[i].device for j, (i, _, _) in enumerate(hint)}
    size = {P - j: sub.options[i].devices for j, (i, _, _) in enumerate(hint)}
    inv = sub.inst.inventory
    out: dict[tuple, int] = {}
    for key in keys:
        what, k, t = key
        if what == "start":
            out[key] = int(dev.get(k) == t and dev.get(k - 1) != t)
        else:
            off = inv[t] - sum(size[j] for j in range(1, k + 1) if dev.get(j) == t)
            q, r = divmod(off, sub.node[t])
            out[key] = q if what == "q" else r
    return out


def evaluate_plan(inst: Instance, plan: Plan) -> tuple[float, bool]:
    """(closed-form iteration time, fits) by ``cost.estimate`` -- the reported objective."""
    est = estimate(inst.model, inst.cluster, plan, inst.settings, cost_model=inst.cost_model)
    return est.iteration_time_s, est.fits


# ------------------------------------------------------------------------------------------ results
@dataclass
class SubResult:
    status: SubStatus
    assignment: Assignment | None
    bound_s: float  # valid lower bound (seconds) on this sub-problem's optimum among plans below the cutoff
    wall_s: float
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Record:
    sub: SubModel
    result: SubResult | None = None
    skipped: bool = False
    bound: float = 0.0
    complete: bool = False


def _families(family: str) -> list[str]:
    from hapmoe_milp.search.dp import families

    return list(families(family))


def _backend(solver: str):  # type: ignore[no-untyped-def]
    if solver == "cpsat":
        from hapmoe_milp.search import cpsat

        return cpsat
    if solver == "milp":
        from hapmoe_milp.search import milp

        return milp
    raise SolverError(f"unknown exact solver {solver!r}; use cpsat, milp or auto", field="--solver")


def solve(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    *,
    solver: str = "cpsat",
    family: str = "both",
    pruning: Pruning | None = None,
    time_limit: float | None = None,
    threads: int | None = None,
    relative_gap: float | None = None,
    backend: str | None = None,
    hint: Plan | Solution | None = None,
    instances: Iterable[Instance] | None = None,
    split: str | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> Solution:
    """Solve every instance x group exactly and keep the best plan, with a proven bound.

    ``solver='auto'`` runs the pruned DP first (``pruning`` applies to it) and then ``backend`` (CP-SAT
    by default) over the exact space, warm-started from the DP plan, within what is left of the time
    limit. ``pruning`` defaults to :data:`EXACT_PRUNING` for the exact solvers. ``backend`` selects the
    MILP solver (``highs`` default, ``cbc``) for ``solver='milp'``. ``split`` is ``'group'`` (default:
    one model per group key) or ``'instance'`` (one model per instance with group-selection booleans).
    Extra ``options`` go to the backend (e.g. ``resolution_s`` for CP-SAT).
    """
    if solver == "auto":
        return _solve_auto(
            model,
            cluster,
            settings,
            family=family,
            pruning=pruning,
            time_limit=time_limit,
            threads=threads,
            relative_gap=relative_gap,
            backend=backend,
            split=split,
            progress=progress,
            **options,
        )
    mod = _backend(solver)
    t0 = time.perf_counter()
    deadline = t0 + time_limit if time_limit else None
    pr = pruning or EXACT_PRUNING
    fams = _families(family)
    insts = (
        list(instances)
        if instances is not None
        else [
            i
            for fam in fams
            for i in build_instances(model, cluster, settings, fam, pr)  # type: ignore[arg-type]
        ]
    )
    counter = PruneCounter()
    records: list[_Record] = []
    for inst in insts:
        for rule, cnt in inst.counter.counts.items():
            counter.add(rule, cnt)
        for sub in submodels(inst, split or "group"):
            records.append(_Record(sub, bound=sub.root_bound))
    records.sort(key=lambda r: r.sub.root_bound)
    best_val = math.inf
    best_plan: Plan | None = None
    best_inst: Instance | None = None
    hint_plan = hint.plan if isinstance(hint, Solution) else hint
    hinted: dict[int, Assignment] = {}
    if hint_plan is not None:
        for ri, rec in enumerate(records):
            a = assignment_of(rec.sub, hint_plan)
            if a is not None:
                val, fits = evaluate_plan(rec.sub.inst, plan_of(rec.sub, a))
                if fits:
                    hinted[ri] = a
                    if val < best_val:
                        best_val, best_plan, best_inst = val, plan_of(rec.sub, a), rec.sub.inst
                break
        if not hinted:
            log.info("warm start: the hint plan is not in the %s space; solving without it", solver)
    # hinted sub-problem first: it turns the incumbent into a proof soonest
    order = sorted(range(len(records)), key=lambda r: (r not in hinted, records[r].sub.root_bound))
    n_vars = n_cons = 0
    tol_s = 0.0
    res_s = 0.0
    solved = 0

    def run(ri: int, limit: float | None, start: Assignment | None) -> None:
        nonlocal best_val, best_plan, best_inst, n_vars, n_cons, tol_s, res_s, solved
        rec = records[ri]
        cutoff = best_val
        res = mod.solve_sub(
            rec.sub,
            time_limit=limit,
            cutoff_s=cutoff,
            hint=start,
            threads=threads,
            relative_gap=relative_gap,
            backend=backend,
            **options,
        )
        solved += 1
        rec.result = res
        n_vars = max(n_vars, int(res.stats.get("variables", 0)))
        n_cons = max(n_cons, int(res.stats.get("constraints", 0)))
        tol_s = max(tol_s, float(res.stats.get("tolerance_s", 0.0)))
        res_s = max(res_s, float(res.stats.get("resolution_s", 0.0)))
        if res.assignment is not None:
            plan = plan_of(rec.sub, res.assignment)
            val, fits = evaluate_plan(rec.sub.inst, plan)
            if not fits:  # cannot happen with conservative memory rounding; never return a plan that OOMs
                log.warning("%s: decoded plan does not fit memory; discarded", solver)
            elif val < best_val:
                best_val, best_plan, best_inst = val, plan, rec.sub.inst
        if res.status == "infeasible":
            # nothing in this sub-problem beats the cutoff it was given (or nothing fits at all)
            rec.bound = max(rec.bound, cutoff)
            rec.complete = True
        else:
            rec.bound = max(rec.bound, res.bound_s)
            rec.complete = res.status == "optimal"
        log.debug("%s %s: %s bound %.6g (%.2fs)", solver, rec.sub.describe(), res.status, rec.bound, res.wall_s)
        if progress is not None:
            lb = min((r.bound for r in records), default=math.nan)
            progress(ProgressEvent(solver, solved, len(records), best_val, time.perf_counter() - t0, time_limit, lb))

    if deadline is None:
        # no limit: every sub-problem to the end, most promising first (the incumbent prunes the rest)
        for ri in order:
            rec = records[ri]
            if rec.bound < best_val:
                tighten(rec.sub, best_val)
                rec.bound = max(rec.bound, rec.sub.root_bound)
            if rec.bound >= best_val:
                rec.skipped = rec.complete = True
                continue
            run(ri, None, hinted.get(ri))
    else:
        # best-bound first with doubling time slices: the sub-problem holding the global bound down gets
        # the next slice; a re-run restarts from its best plan as a hint (CP-SAT keeps no state between
        # calls, so doubling bounds the repeated work by a factor of two)
        active = [ri for ri in order if records[ri].bound < best_val]
        for ri in order:
            if records[ri].bound >= best_val:
                records[ri].skipped = records[ri].complete = True
        base = max(0.5, (deadline - time.perf_counter()) / max(1, 2 * len(active)))
        tries: dict[int, int] = {}
        while True:
            left = deadline - time.perf_counter()
            cand = [ri for ri in order if not records[ri].complete and records[ri].bound < best_val]
            if not cand or left <= 0.2:
                break
            ri = min(cand, key=lambda r: (tries.get(r, 0) > 0, records[r].bound, tries.get(r, 0)))
            rec = records[ri]
            if not rec.sub.tightened and math.isfinite(best_val):
                tighten(rec.sub, best_val)
                rec.bound = max(rec.bound, rec.sub.root_bound)
                if rec.bound >= best_val:
                    rec.skipped = rec.complete = True
                    continue
            n_try = tries.get(ri, 0)
            tries[ri] = n_try + 1
            limit = min(left, base * 2**n_try)
            rec = records[ri]
            start = rec.result.assignment if rec.result and rec.result.assignment else hinted.get(ri)
            run(ri, limit, start)
    for rec in records:
        if not rec.complete and rec.bound >= best_val:
            rec.complete = True  # its bound already proves it cannot beat the incumbent
    wall = time.perf_counter() - t0
    complete = all(r.complete for r in records)
    bound = min((r.bound for r in records), default=math.inf)
    stats: dict[str, Any] = {
        "instances": len(insts),
        "subproblems": len(records),
        "solved": solved,
        "skipped_by_bound": sum(1 for r in records if r.skipped),
        "max_variables": n_vars,
        "max_constraints": n_cons,
        "pruning": pr.to_dict(),
        "warm_start": bool(hinted),
    }
    stats.update(mod.describe_scaling(options))
    if tol_s:
        stats["tolerance_s"] = tol_s  # worst-case scaling error of a returned "optimal" plan
    if res_s:
        stats["time_resolution_s"] = res_s
    if best_plan is None:
        status = "infeasible" if complete else "timeout"
        msg = (
            _infeasible_message(model, cluster, settings, fams)
            if complete
            else (f"{solver} found no plan within the time limit ({time_limit} s)")
        )
        return Solution(
            solver,
            status,
            None,
            math.inf,
            math.inf if complete else bound,
            wall,
            counter.counts,  # type: ignore[arg-type]
            stats=stats,
            message=msg,
        )
    assert best_inst is not None
    bound = min(bound, best_val)
    status = "optimal" if complete else "feasible"
    return Solution(solver, status, best_plan, best_val, bound, wall, counter.counts, stats=stats)  # type: ignore[arg-type]


def _infeasible_message(model: ModelSpec, cluster: ClusterSpec, settings: Settings, fams: list[str]) -> str:
    """The same message the DP path gives (``diagnose``), so every solver explains infeasibility alike."""
    from hapmoe_milp.search.diagnose import diagnose

    return str(diagnose(model, cluster, settings, fams))  # type: ignore[arg-type]


def _solve_auto(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    *,
    family: str,
    pruning: Pruning | None,
    time_limit: float | None,
    threads: int | None,
    relative_gap: float | None,
    backend: str | None,
    split: str | None,
    progress: Progress | None = None,
    **options: Any,
) -> Solution:
    """Pruned DP for a fast good plan, then the exact backend warm-started from it for the proof."""
    from hapmoe_milp.search.dp import solve_dp

    t0 = time.perf_counter()
    # warm start in the exact backends' space: plain 1F1B plans (they build no VPP instances yet)
    dp = solve_dp(
        model,
        cluster,
        settings,
        family=family,
        pruning=replace(pruning or Pruning(), max_vpp=1),
        time_limit=time_limit,
        progress=progress,
    )
    left = None if time_limit is None else time_limit - (time.perf_counter() - t0)
    exact_solver = backend if backend in ("cpsat", "milp") else "cpsat"
    dp_stats = {"dp_status": dp.status, "dp_objective_s": dp.objective_s, "dp_wall_s": dp.wall_s}
    if left is not None and left <= 0.5:
        wall = time.perf_counter() - t0
        status = dp.status if dp.plan is None else "feasible"
        return replace(
            dp,
            solver="auto",
            status=status,
            bound_s=float("nan"),
            wall_s=wall,  # type: ignore[arg-type]
            stats={**dp.stats, **dp_stats, "exact": "no time left"},
        )
    ex = solve(
        model,
        cluster,
        settings,
        solver=exact_solver,
        family=family,
        pruning=EXACT_PRUNING,
        time_limit=left,
        threads=threads,
        relative_gap=relative_gap,
        backend=None if backend in ("cpsat", "milp") else backend,
        hint=dp.plan,
        split=split,
        progress=progress,
        **options,
    )
    wall = time.perf_counter() - t0
    stats = {**ex.stats, **dp_stats, "exact_solver": exact_solver, "exact_wall_s": ex.wall_s}
    if ex.plan is None and dp.plan is not None:  # exact ran out of time before reading the hint
        return replace(dp, solver="auto", status="feasible", bound_s=ex.bound_s, wall_s=wall, stats=stats)
    pruned = {**dp.pruned}
    return replace(ex, solver="auto", wall_s=wall, stats=stats, pruned=pruned)


__all__ = [
    "EXACT_PRUNING",
    "Assignment",
    "SubModel",
    "SubResult",
    "assignment_of",
    "build_submodel",
    "evaluate_plan",
    "option_name",
    "plan_of",
    "solve",
    "submodels",
    "sync_pieces",
]
