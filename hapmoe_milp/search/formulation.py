"""The exact solvers' shared model description: one sub-problem at one pipeline depth, as arcs.

Both backends (:mod:`hapmoe_milp.search.cpsat`, :mod:`hapmoe_milp.search.milp`) translate the same
:class:`~hapmoe_milp.search.depth_model.DepthModel`; neither reads an :class:`~hapmoe_milp.instance.Instance` or prices anything. This
module reads only the instance's coefficients (per-option prefix sums, edges, capacities, ``p2p``,
``coefficients`` and ``in_flight``) and combines them exactly as ``Instance.evaluate`` does (a test pins
that every arc equals ``evaluate``).

Decomposition. A *sub-problem* is one instance (micro-batch step and schedule: plain 1F1B or ``vpp``
interleaved chunks) and one family group key (the rules that tie stages together,
``instance.group_key``); a :class:`~hapmoe_milp.search.depth_model.DepthModel` fixes its pipeline depth ``P`` too. Slots count from the
end (slot 1 = last stage, slot ``P`` = first), so every slot's in-flight multiplier
``inst.in_flight(k, P)``, whether it carries the embedding (slot ``P``) or the head (slot 1), and which
options may be first (``dp == first_dp``) are constants.

Interleaved (VPP) sub-problems. ``build_instances(..., max_vpp)`` yields, for the megatron family, one
instance per ``vpp = 2..max_vpp`` over the same options; only their coefficients (``alpha = 1/v``,
``beta = M - 1/v``) and in-flight rule differ. Their depths are ``Instance.vpp_depths()`` (``P > 1``,
``M % P == 0``, ``P v <= layers``) within the stage caps (:attr:`SubProblem.depths`), none at all when
the layer pattern's chunks would not price like the stage's range (``vpp_lead`` is None). Interleaved
warm-up grows with ``P`` (``2(k-1) + (v-1)P + 1`` chunks of ``1/v`` of the stage), so arc sets are
built per (slot, depth): memory ``w + in_flight(k, P) a + fixed``. The rules the DP enforces are arc
filters on the layer count ``n`` (:meth:`SubProblem.min_layers`): every stage ``n >= v`` (a layer per
virtual chunk), the last ``n >= v + mtp - 1`` (its MTP layers in its last chunk), the first
``ceil(n / v) >= lead`` (the leading block of another kind in the first chunk). A plan of this space is
exactly one of the DP's (tests/test_search_dp.py brute-forces the DP's VPP space).

Variables (the tight formulation). One binary per *arc* ``x[a]``, ``a = (slot k, option o, layer range)``:
slot ``k`` runs option ``o`` on that range. When every layer has the same kind (Mixtral, Qwen3) a range
is just a layer count ``n`` -- layers of one kind are interchangeable and the stage order fixes positions
(slot ``P`` starts at layer 0, slot ``k`` follows slot ``k+1``) -- and ``sum_a n[a] x[a] = N``. When the
kinds vary by position (dense prefix, MTP, mixed patterns) a range is ``[s, e)`` and flow rows link
consecutive slots (``sum of x ending at p in slot k+1 = sum of x starting at p in slot k``). Either way
an arc's stage time, memory and exposed sync are constants, so:

- *disaggregated per-option counts*: an arc is the product ``n z[k,o]`` of the classic formulation
  resolved into one binary per value, the strongest (convex-hull) form of ``n[k,o] <= N z[k,o]``;
- memory is enforced by which arcs exist: an arc that does not fit its slot's capacity (at the model's
  depth) is never built (exact: its memory is a constant); likewise an arc with fewer layers than its
  slot's minimum, and the other slots' minima bound each arc's position (``s >=`` the layers of the
  slots before it, ``e <= N -`` those after it);
- ``sum_{a in slot k} x[a] = 1``; devices per type ``sum g[a] x[a] <= inventory``; stage time
  ``tau[k] >= sum time[a] x[a] + 2 p[k]``; the p2p ``p[k] >= sum p2p[o(a), j] x[a]`` whenever slot
  ``k-1`` is of link class ``j``; ``tau_max >= tau[k]``; ``sigma >= sum sync[a] x[a]``; objective
  ``alpha sum tau + beta tau_max + sigma`` (``inst.coefficients``);
- hetero layout rules: each device type's stages are contiguous, stages take their type's devices from
  the end without straddling a node (``instance.aligned``), optional one-size-per-type
  (``uniform_stage_size``, ``large_cluster``); megatron groups have one mesh per group key.

The sub-problem's own bound (its depths' reductions and cuts are argued in
:mod:`hapmoe_milp.search.depth_model`, with the same premises):

- *Sub-problem root bound* (before any depth is built): every layer needs at least ``w_t``
  device-seconds on device type ``t`` (the cheapest option there that can hold a layer), so the cluster
  processes at most ``sum_t inv_t / w_t`` layers per second and ``tau_max >= N / sum_t inv_t / w_t``;
  a per-type unbounded knapsack (stage sizes, at most ``min(memory, T / t)`` layers a stage) gives the
  smallest ``T`` at which the inventory can hold every layer at all, another floor on ``tau_max``; and
  ``sum tau`` is at least the fewest device-seconds over the largest stage and the sum of each layer's
  fastest time. Every relaxation there (edges, p2p, slot positions, stage count ignored) only lowers it.
  Memory there uses the fewest micro-batches in flight over every slot of every allowed depth (for VPP
  the smallest depth's last slot, ``in_flight`` grows with both), and the per-slot layer minima are
  ignored: both only enlarge what a stage may hold.
- *Quick root bound* (interleaved copies of a sub-problem, :meth:`SubProblem.for_schedule`): the root
  bound's two floors (on ``sum tau`` and ``tau_max``) read only the options' per-layer costs, sizes and
  capacities, which the copies share, and the fewest micro-batches in flight ``i``; they do not decrease
  as ``i`` grows (fewer options hold a layer and each holds fewer layers, so every minimum is over a
  subset and every knapsack smaller). So the floors of a schedule already priced at ``i0 <= i`` (the
  plain one, ``i0 = 1``), combined with this schedule's ``alpha, beta >= 0``, are a valid bound; the
  search raises it to the full root bound only for a node that comes first (most never do).

Mixed kinds at scale (e.g. DeepSeek-V3's 62 layers on hundreds of options): when ranges are too many to
enumerate, arcs are indexed by count and a middle stage is priced at the cheapest window of that many
layers (each of time, sync and memory minimised separately; the first and last stage's windows are
fixed). That is a relaxation: its bounds are valid, the plans it decodes are re-priced exactly
(``evaluate_assignment``) before they count, and its optimum never closes a depth unless the cutoff does.
The VPP layer minima apply to the count, exactly (they concern counts only; the first stage's window is
fixed, so its leading-block rule is exact too).

CP-SAT scales times to integers and the (interleaved: fractional) pipeline coefficients by their
common denominator ``v`` (see :mod:`hapmoe_milp.search.cpsat`); the MILP uses both as reals.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from hapmoe_milp.deadline import NO_DEADLINE, Deadline
from hapmoe_milp.instance import Instance, Option, groups, in_group, vpp_lead
from hapmoe_milp.plan import Plan, Stage
from hapmoe_milp.search.root_bound import root_floors
from hapmoe_milp.space import stage_rule_problems

SubStatus = Literal["optimal", "feasible", "infeasible", "timeout"]
#: Per stage from first to last: (option position in the sub-problem, first layer, end layer).
Assignment = list[tuple[int, int, int]]

_ARC_CAP = 400_000  # (option, layer range) pairs above which mixed kinds are modelled by count (relaxed)
_COUNT_CAP = 2_000_000  # (option, layer count) pairs above which a sub-problem keeps its root bound only


def option_name(o: Option) -> str:
    """Readable, unique-within-an-instance name for constraint labels (e.g. ``h800_TP2CP1DP1EP2ETP1_none``)."""
    c = o.cfg
    return f"{o.device}_TP{c.tp}CP{c.cp}DP{c.dp}EP{c.ep}ETP{c.etp}_{o.recompute}"


@dataclass
class SubResult:
    """What a backend proved about one :class:`~hapmoe_milp.search.depth_model.DepthModel` (seconds)."""

    status: SubStatus  # "infeasible": nothing at or below the cutoff
    assignment: Assignment | None
    bound_s: float  # valid lower bound on the depth model's optimum among plans at or below the cutoff
    wall_s: float
    stats: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------ arc sets
@dataclass
class ArcSet:
    """The arcs of one slot (after memory and dominance), as parallel arrays."""

    opt: np.ndarray  # option position
    s: np.ndarray  # first layer (count arcs: 0)
    e: np.ndarray  # end layer (count arcs: n)
    time: np.ndarray  # fwd + bwd incl. edges, seconds (no p2p)
    sync: np.ndarray  # exposed DP sync + optimizer, seconds
    #: per bucket (:meth:`SubProblem._dominance`): options, range starts and ends, dropped (option, range)
    #: pairs and the first option beating each; read only to map a plan onto arcs (:attr:`dominated_by`)
    dropped: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)

    @property
    def n(self) -> np.ndarray:
        return self.e - self.s

    @functools.cached_property
    def dominated_by(self) -> dict[tuple[int, int, int], int]:
        """(option, s, e) of a dropped arc -> an undominated option of the same range that replaces it
        (each chain of "beaten by" is followed to its end; the relation is a strict order)."""
        out: dict[tuple[int, int, int], int] = {}
        for ix, s, e, hit, first_dom in self.dropped:
            for a, r in zip(*np.nonzero(hit)):
                b = int(first_dom[a, r])
                while hit[b, r]:
                    b = int(first_dom[b, r])
                out[(int(ix[a]), int(s[r]), int(e[r]))] = int(ix[b])
        return out

    def __len__(self) -> int:
        return len(self.opt)


class SubProblem:
    """One (instance, group keys) sub-problem: options, link classes, layout rules and per-slot arcs.

    Everything here is independent of the cutoff; :meth:`depth_model` builds the model of one depth
    under a cutoff. Arc sets are computed once per slot (interleaved: per slot and depth, whose in-flight
    count they depend on) and cached; per-range coefficients are shared by the interleaved copies
    (:meth:`for_schedule`).
    """

    def __init__(self, inst: Instance, keys: Sequence[tuple], by_key: dict[tuple, list[Option]] | None = None) -> None:
        self.inst = inst
        pr = inst.pruning
        options: list[Option] = []
        gid: list[int] = []
        kept: list[tuple] = []
        for key in keys:
            opts = by_key.get(key, []) if by_key is not None else [o for o in inst.options if in_group(o, key)]
            if opts:
                gid.extend([len(kept)] * len(opts))
                kept.append(key)
                options.extend(opts)
        self.keys = kept
        self.options = options
        self.gid = np.asarray(gid, dtype=np.int64)
        self.O = len(options)
        self.N = inst.num_layers
        kinds = inst.layer_kinds
        self.uniform = len(set(kinds)) == 1
        inv = inst.inventory
        self.types = [t for t in inv if inv[t] > 0]
        tpos = {t: j for j, t in enumerate(self.types)}
        self.inv = [inv[t] for t in self.types]
        cluster = inst.cluster
        self.node = {t: cluster.node_size(t) for t in self.types}
        self.tix = np.asarray([tpos[o.device] for o in options], dtype=np.int64)
        self.size = np.asarray([o.devices for o in options], dtype=np.int64)
        # the covering DPs count devices in units of the gcd of a type's stage sizes (exact: every usage
        # is a multiple of it), which keeps their grids small when all stages are whole nodes
        unit = [0] * len(self.types)
        for j, g in zip(self.tix.tolist(), self.size.tolist()):
            unit[j] = math.gcd(unit[j], g)
        unit = [u or 1 for u in unit]
        self.cinv = [v // u for v, u in zip(self.inv, unit)]
        self.csize = self.size // np.asarray(unit, dtype=np.int64)[self.tix] if self.O else self.size
        self.cap = np.asarray([o.capacity for o in options], dtype=np.float64)
        self.first_ok = np.asarray([o.cfg.dp == inst.first_dp for o in options], dtype=bool)
        #: the runtime's rules between stages (``Instance.stage_rules``): rows over arcs, see
        #: :meth:`DepthModel.rule_rows`; a mesh is a (device type, config) pair
        self.rules = inst.stage_rules
        mesh_ids: dict[tuple, int] = {}
        self.mesh = np.asarray([mesh_ids.setdefault((o.device, o.cfg), len(mesh_ids)) for o in options], dtype=np.int64)
        self.tp = np.asarray([o.cfg.tp for o in options], dtype=np.int64)
        self.dp = np.asarray([o.cfg.dp for o in options], dtype=np.int64)
        classes = sorted({(o.device, o.devices < self.node[o.device]) for o in options})
        cidx = {c: j for j, c in enumerate(classes)}
        self.classes = classes
        self.cls = np.asarray([cidx[(o.device, o.devices < self.node[o.device])] for o in options], dtype=np.int64)
        self.contiguous = (inst.family == "hetero" or inst.stage_rules.types_grouped) and len(self.types) > 1
        total = sum(self.inv)
        self.same_size = pr.uniform_stage_size or (inst.family == "hetero" and 0 < pr.large_cluster < total)
        self.align_types: list[int] = []
        for j, t in enumerate(self.types):
            sizes = {o.devices for o in options if o.device == t}
            node = self.node[t]
            if len(sizes) > 1 or any(node % g and g % node for g in sizes) or self.inv[j] % node:
                self.align_types.append(j)
        # slots: no more stages than layers, devices, the stage cap, or what the inventory can host
        gmin: dict[int, int] = {}
        for o, j in zip(options, self.tix.tolist()):
            gmin[j] = min(gmin.get(j, o.devices), o.devices)
        K = min(self.N, total, sum(self.inv[j] // g for j, g in gmin.items())) if options else 0
        if pr.max_stages > 0:
            K = min(K, pr.max_stages)
        self.K = K
        self.layer_band = pr.layer_band
        self.cross_type = pr.cross_type_comm
        self.eta = pr.eta
        self._pre = {
            attr: np.asarray([o.prefix[attr] for o in options], dtype=np.float64).reshape(self.O, self.N + 1)
            for attr in ("fwd", "bwd", "weights", "act", "rs", "ag", "opt")
        }
        self._edges: dict[str, np.ndarray] = {}
        for side in ("first", "last", "single"):
            for attr in ("fwd", "bwd", "weights", "act", "rs", "ag", "opt", "work"):
                self._edges[f"{side}.{attr}"] = np.asarray(
                    [getattr(getattr(o, side), attr) for o in options], dtype=np.float64
                )
        self._fixed = np.asarray([o.fixed for o in options], dtype=np.float64)
        self._ranges: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._static: dict[str, dict[str, np.ndarray]] = {}  # shared by every schedule's copy
        #: the root bound's schedule-free parts per in-flight count (shared by every schedule's copy)
        self._root_parts: dict[float, tuple[float, float]] = {}
        self._buckets: list[list[np.ndarray]] = []  # :meth:`_dominance_buckets`, set once in place (shared)
        #: mixed layer kinds with too many (option, layer range) pairs to enumerate: arcs are indexed by
        #: layer count and a middle stage is priced at its cheapest window (a relaxation: bounds only)
        self.relaxed = not self.uniform and self.O * (self.N - 1) * (self.N - 2) // 2 > _ARC_CAP
        #: arcs indexed by layer count (positions follow from the stage order) rather than by range
        self.counts = self.uniform or self.relaxed
        #: too many even by count: the sub-problem keeps its root bound only
        self.too_large = self.O * self.N > _COUNT_CAP
        self._set_schedule(inst)

    def _set_schedule(self, inst: Instance) -> None:
        """What depends on the schedule (plain or ``vpp`` chunks): coefficients, boundary transfers, depths,
        the layer minima, arcs (memory at the depth's in-flight count) and the root bound."""
        self.inst = inst
        self.alpha, self.beta = inst.coefficients
        K = self.K
        # interleaved (VPP) schedules: Megatron's depth rule and the rules the DP applies (a layer per
        # virtual chunk, the MTP layers in the last rank's last chunk, the leading block of another kind in
        # the first rank's first chunk); plain 1F1B: every stage holds a layer
        self.vpp = v = inst.vpp
        # boundary transfers, on first use (most copies are closed by their quick bound before any arc)
        self._p2p: np.ndarray | None = None
        self._pmin: np.ndarray | None = None
        self.lo_mid, self.lo_last, self.lo_first = inst.stage_min_layers
        if v <= 1:
            depths = range(1, K + 1)
        elif vpp_lead(inst.model) is None:  # interleaved chunks would not price like the stage's range
            depths = range(0)
        else:
            depths = (P for P in inst.vpp_depths() if P <= K)
        #: the pipeline depths of this sub-problem's plans (VPP: only Megatron's, within the stage caps)
        self.depths: tuple[int, ...] = tuple(P for P in depths if self.min_total(P) <= self.N)
        self._arcs: dict[tuple[int, bool, int], ArcSet] = {}
        self._root: float | None = None
        self.quick_bound = self._quick_bound()

    @property
    def p2p(self) -> np.ndarray:
        """Seconds of the boundary transfer out of each option into each link class (option x class); one
        per virtual chunk when interleaved (``CostModel.boundary_p2p``)."""
        if self._p2p is None:
            inst, node = self.inst, self.node
            self._p2p = np.asarray(
                [[inst.p2p(o, dev, 1 if small else node[dev]) for dev, small in self.classes] for o in self.options],
                dtype=np.float64,
            ).reshape(self.O, len(self.classes))
        return self._p2p

    @property
    def pmin(self) -> np.ndarray:
        """Each option's cheapest boundary transfer (over link classes)."""
        if self._pmin is None:
            self._pmin = self.p2p.min(axis=1) if self.O else np.zeros(0)
        return self._pmin

    @property
    def root_bound(self) -> float:
        """The sub-problem's root bound (:meth:`_root_bound`), computed on first use: most of a Table 1
        space's sub-problems are closed by :attr:`quick_bound` alone and never need it."""
        if self._root is None:
            self._root = max(self._root_bound(), self.quick_bound)
        return self._root

    @property
    def root_exact(self) -> bool:
        """Has :attr:`root_bound` been computed (so :attr:`quick_bound` is no longer the best known)?"""
        return self._root is not None

    def _quick_bound(self) -> float:
        """A valid root bound that costs nothing on an interleaved copy: the floors (``root_floors`` in
        :mod:`hapmoe_milp.search.root_bound`) at any in-flight count ``i0`` at most this schedule's ``infl``,
        combined with this schedule's coefficients. Valid because the floors do not decrease with ``infl``
        (more micro-batches in flight leave fewer options usable and fewer layers per stage in memory, so
        every minimum there is over a subset and every capacity smaller). With no such floors cached it is
        the exact root bound."""
        if self.O == 0 or not self.depths:
            self._root = math.inf
            return math.inf
        infl = self._min_in_flight()
        below = [i for i in self._root_parts if i <= infl]
        if infl in self._root_parts or not below:
            self._root = self._root_bound()
            return self._root
        return self._combine(*self._root_parts[max(below)])

    def _min_in_flight(self) -> float:
        """Fewest micro-batches in flight over every slot of every allowed depth (the root bound's memory)."""
        return min(self.in_flight(k, P) for P in self.depths for k in range(1, P + 1))

    def _combine(self, sum_lb: float, tau_lb: float) -> float:
        if math.isinf(sum_lb):  # no option holds a single layer
            return math.inf
        return self.alpha * max(sum_lb, tau_lb) + self.beta * tau_lb

    def for_schedule(self, inst: Instance) -> SubProblem:
        """This sub-problem for another schedule of the same options (an interleaved copy of its instance,
        ``build_instances``' ``replace(base, vpp=v)``): the options, link classes, layout rules and
        per-range coefficients are shared, so only the schedule's part is rebuilt."""
        if inst.options is not self.inst.options or inst.samples_per_mb != self.inst.samples_per_mb:
            raise ValueError("for_schedule needs an instance over the same options")
        out = copy.copy(self)
        out._set_schedule(inst)
        return out

    # ------------------------------------------------------------------ labels
    def describe(self) -> str:
        inst = self.inst
        keys = ",".join(_key_label(k) for k in self.keys)
        v = f" VPP={self.vpp}" if self.vpp > 1 else ""
        return f"{inst.family} M={inst.num_microbatches}{v} [{keys}] ({self.O} options, up to {self.K} stages)"

    # ------------------------------------------------------------------ schedule rules
    def in_flight(self, k: int, P: int) -> float:
        """In-flight multiplier of slot ``k`` at depth ``P`` (``Instance.in_flight``; plain 1F1B ignores ``P``)."""
        return self.inst.in_flight(k, P) if self.vpp > 1 else self.inst.in_flight(k)

    def in_flight_monotone(self, P: int) -> bool:
        """In-flight multipliers do not decrease towards the front at depth ``P`` (the symmetry cut needs it)."""
        infl = [self.in_flight(k, P) for k in range(1, P + 1)]
        return all(b >= a for a, b in itertools.pairwise(infl))

    def min_layers(self, k: int, first: bool) -> int:
        """Fewest layers slot ``k`` may hold (1; interleaved: ``v``, the last ``v + mtp - 1``, the first
        enough that its first chunk holds the leading block: ``ceil(n / v) >= lead``)."""
        lo = 1
        if k == 1:
            lo = max(lo, self.lo_last)
        if first:
            lo = max(lo, self.lo_first)
        if k != 1 and not first:
            lo = max(lo, self.lo_mid)
        return lo

    def min_total(self, P: int) -> int:
        """Fewest layers a depth-``P`` plan holds (the sum of :meth:`min_layers` over its slots)."""
        return sum(self.min_layers(k, k == P) for k in range(1, P + 1))

    def admissible(self, assignment: Assignment) -> bool:
        """Is a plan of stages (first first) of a depth and with layer counts this sub-problem allows?"""
        P = len(assignment)
        if P not in self.depths:
            return False
        if self.rules.active:
            stages = [Stage(self.options[i].device, self.options[i].cfg, s, e) for i, s, e in assignment]
            if stage_rule_problems(self.rules, stages):
                return False
        return all(e - s >= self.min_layers(P - j, j == 0) for j, (_, s, e) in enumerate(assignment))

    # ------------------------------------------------------------------ cheap group-level bound
    def _root_bound(self) -> float:
        """The DP's root bound, per device type: each layer needs at least ``w_t`` device-seconds on
        type ``t`` (its cheapest usable option there, the layer's cheapest kind), so the cluster
        processes at most ``sum_t inv_t / w_t`` layers per second and ``tau_max >= N / that``;
        ``sum(tau) >= W / g_max`` with ``W`` the fewest device-seconds per layer summed over layers, and
        every layer takes at least its fastest per-layer time. Only options that can hold one layer (its
        lightest kind, at the fewest micro-batches in flight, no edges) count."""
        if self.O == 0 or not self.depths:
            return math.inf
        infl = self._min_in_flight()
        if infl not in self._root_parts:
            self._root_parts[infl] = root_floors(self, infl)
        return self._combine(*self._root_parts[infl])

    # ------------------------------------------------------------------ arcs
    def _range_arrays(self, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) of every layer range a slot of this kind may hold (before depth limits)."""
        if kind not in self._ranges:
            N = self.N
            if self.counts:
                e = np.arange(1, N + 1, dtype=np.int64)
                s = np.zeros_like(e)
            elif kind == "both":
                s, e = np.asarray([0]), np.asarray([N])
            elif kind == "first":
                e = np.arange(1, N, dtype=np.int64)
                s = np.zeros_like(e)
            elif kind == "last":
                s = np.arange(1, N, dtype=np.int64)
                e = np.full_like(s, N)
            else:
                ss, ee = np.triu_indices(N + 1, k=1)
                keep = (ss >= 1) & (ee <= N - 1)
                s, e = ss[keep].astype(np.int64), ee[keep].astype(np.int64)
            self._ranges[kind] = (s, e)
        return self._ranges[kind]

    def _static_values(self, kind: str) -> dict[str, np.ndarray]:
        """Per (option, range): time, sync, and the memory parts, mirroring ``Instance.evaluate``."""
        if kind in self._static:
            return self._static[kind]
        s, e = self._range_arrays(kind)
        pre = self._pre
        N = self.N
        windows: list[tuple[np.ndarray, np.ndarray]] = []  # (start, end) columns, one set per window
        if self.relaxed and kind == "last":
            windows = [(N - e, np.full_like(e, N))]
        elif self.relaxed and kind == "mid":
            # every window [s, s + n) with 1 <= s and s + n <= N - 1; each value minimised separately
            for s0 in range(1, N - 1):
                windows.append((np.full_like(e, s0), np.minimum(s0 + e, N - 1)))
        else:
            windows = [(s, e)]

        def seg(attr: str, ws: np.ndarray, we: np.ndarray) -> np.ndarray:
            return pre[attr][:, we] - pre[attr][:, ws]

        vals: dict[str, np.ndarray] = {}
        for ws, we in windows:
            cur = {attr: seg(attr, ws, we) for attr in ("fwd", "bwd", "weights", "act", "rs", "ag", "opt")}
            cur["sync"] = self._sync_of(cur)
            cur["time"] = cur["fwd"] + cur["bwd"]
            if self.relaxed and kind == "mid":
                short = (ws + e) > N - 1  # the window does not fit (its columns were clipped): never the minimum
                for attr in cur:
                    cur[attr] = np.where(short[None, :], np.inf, cur[attr])
            for attr, v in cur.items():
                vals[attr] = v if attr not in vals else np.minimum(vals[attr], v)
        sides = {"first": ("first",), "last": ("last",), "both": ("single",), "mid": ()}[kind]
        priced = self._with_edges(vals, sides)
        w, a, fixed = priced["w"], priced["a"], priced["fixed"]
        if self.relaxed and kind == "mid":  # no edges in the middle: the per-window minima stand
            time_, sync = vals["time"], vals["sync"]
        else:
            time_, sync = priced["time"], priced["sync"]
        valid = np.isfinite(time_)
        if self.layer_band:
            n = (e - s)[None, :]
            lo = np.asarray([o.band[0] for o in self.options])[:, None]
            hi = np.asarray([o.band[1] for o in self.options])[:, None]
            valid &= (n >= lo) & (n <= hi)
        if kind in ("first", "both"):
            valid &= self.first_ok[:, None]
        out = {"time": time_, "sync": sync, "w": w, "a": a, "fixed": fixed, "valid": valid}
        self._static[kind] = out
        return out

    def _with_edges(self, vals: dict[str, np.ndarray], sides: Sequence[str]) -> dict[str, np.ndarray]:
        """Stage time, exposed sync and memory parts of per-(option, range) sums with the edge stages'
        terms added (``Instance.evaluate``'s order of operations)."""
        fwd, bwd, w, a = vals["fwd"], vals["bwd"], vals["weights"], vals["act"]
        rs, ag, op = vals["rs"], vals["ag"], vals["opt"]
        fixed = np.broadcast_to(self._fixed[:, None], fwd.shape).copy()
        for side in sides:
            ed = self._edges
            fwd = fwd + ed[f"{side}.fwd"][:, None]
            bwd = bwd + ed[f"{side}.bwd"][:, None]
            w = w + ed[f"{side}.weights"][:, None]
            a = a + ed[f"{side}.act"][:, None]
            rs = rs + ed[f"{side}.rs"][:, None]
            ag = ag + ed[f"{side}.ag"][:, None]
            op = op + ed[f"{side}.opt"][:, None]
            fixed = fixed + ed[f"{side}.work"][:, None]
        with np.errstate(invalid="ignore"):  # ranges an option cannot hold (inf) stay inf or nan, never valid
            sync = self._exposed(rs, ag, fwd, bwd, op)
        return {"time": fwd + bwd, "sync": sync, "w": w, "a": a, "fixed": fixed}

    def range_values(self, s: np.ndarray, e: np.ndarray, sides: Sequence[str]) -> dict[str, np.ndarray]:
        """Per (option, range ``[s, e)``) with the ``sides`` edges (``first``, ``last``): stage time, exposed
        sync and the memory parts ``w``, ``a`` (per micro-batch in flight), ``fixed`` -- exactly as
        ``Instance.evaluate`` combines them (so any solver's bound can price ranges of its own)."""
        pre = self._pre
        vals = {attr: pre[attr][:, e] - pre[attr][:, s] for attr in ("fwd", "bwd", "weights", "act", "rs", "ag", "opt")}
        return self._with_edges(vals, sides)

    def _sync_of(self, cur: dict[str, np.ndarray]) -> np.ndarray:
        """Exposed sync + optimizer of a middle window (``Instance.evaluate``'s formula, no edges)."""
        return self._exposed(cur["rs"], cur["ag"], cur["fwd"], cur["bwd"], cur["opt"])

    def _exposed(self, rs: np.ndarray, ag: np.ndarray, fwd: np.ndarray, bwd: np.ndarray, op: np.ndarray) -> np.ndarray:
        """Exposed DP sync + optimizer per (option, range), priced by the cost model per device type
        (:meth:`CostModel.exposed_sync`; its overlap share is the device's)."""
        cm = self.inst.cost_model
        out = np.empty(np.broadcast(rs, ag, fwd, bwd, op).shape)
        for did in {o.device for o in self.options}:
            rows = np.asarray([o.device == did for o in self.options])
            out[rows] = cm.exposed_sync(did, rs[rows], ag[rows], fwd[rows], bwd[rows], op[rows])
        return out

    def arcs(self, k: int, first: bool, P: int) -> ArcSet:
        """Arcs of slot ``k`` (first stage or not) at depth ``P``: memory-feasible, at least
        :meth:`min_layers` layers, dominance-reduced. Plain 1F1B arcs do not depend on ``P``."""
        key = (k, first, P if self.vpp > 1 else 0)
        if key in self._arcs:
            return self._arcs[key]
        kind = ("both" if first else "last") if k == 1 else ("first" if first else "mid")
        sv = self._static_values(kind)
        s, e = self._range_arrays(kind)
        infl = self.in_flight(k, P)
        mem = sv["w"] + infl * sv["a"] + sv["fixed"]  # evaluate: w + infl * a + fixed
        ok = sv["valid"] & (mem <= self.cap[:, None]) & ((e - s) >= self.min_layers(k, first))[None, :]
        dropped: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        if not self.cross_type:
            ok = self._dominance(ok, sv["time"], sv["sync"], s, e, dropped)
        oi, ri = np.nonzero(ok)
        arcs = ArcSet(
            opt=oi.astype(np.int64),
            s=s[ri],
            e=e[ri],
            time=sv["time"][oi, ri],
            sync=sv["sync"][oi, ri],
            dropped=dropped,
        )
        self._arcs[key] = arcs
        return arcs

    def _dominance_buckets(self) -> list[np.ndarray]:
        """Options that may dominate each other (same group, type, size, link class; under rules between
        stages the same mesh too: an arc can stand in only for arcs of its own device and config), two or
        more per bucket. Schedule-free, so computed once and shared by the interleaved copies."""
        if not self._buckets:
            buckets: dict[tuple[int, ...], list[int]] = {}
            mesh = self.mesh if self.rules.active else np.zeros(self.O, dtype=np.int64)
            keys = zip(self.gid.tolist(), self.tix.tolist(), self.size.tolist(), self.cls.tolist(), mesh.tolist())
            for i, key in enumerate(keys):
                buckets.setdefault(key, []).append(i)
            self._buckets.append([np.asarray(b) for b in buckets.values() if len(b) > 1])
        return self._buckets[0]

    def _dominance(
        self,
        ok: np.ndarray,
        time: np.ndarray,
        sync: np.ndarray,
        s: np.ndarray,
        e: np.ndarray,
        out: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    ) -> np.ndarray:
        """Drop arcs another arc of the same type, size, class, group and range beats or ties (see doc)."""
        keep = ok.copy()
        for ix in self._dominance_buckets():
            T, S, M = time[ix], sync[ix], ok[ix]  # m x R
            Pm = self.p2p[ix]  # m x C
            p_le = (Pm[:, None, :] <= Pm[None, :, :]).all(axis=2)  # [b, a]: b's p2p <= a's everywhere
            p_lt = (Pm[:, None, :] < Pm[None, :, :]).any(axis=2)
            m = len(ix)
            order = np.arange(m)
            earlier = order[:, None] < order[None, :]  # b < a
            le = (T[:, None, :] <= T[None, :, :]) & (S[:, None, :] <= S[None, :, :]) & p_le[:, :, None]
            lt = (T[:, None, :] < T[None, :, :]) | (S[:, None, :] < S[None, :, :]) | p_lt[:, :, None]
            dom = le & (lt | earlier[:, :, None]) & M[:, None, :] & M[None, :, :]
            dom[order, order, :] = False
            hit = dom.any(axis=0)  # [a, r]
            if not hit.any():
                continue
            out.append((ix, s, e, hit, dom.argmax(axis=0)))  # ArcSet.dominated_by follows the chains
            keep[ix] &= ~hit
        return keep


def _key_label(key: tuple) -> str:
    if key[0] == "cfg":
        return key[1].label().replace(" ", "")
    return f"CP{key[1]}{'EP' if key[2] else 'noEP'}"


# ------------------------------------------------------------------------------------------ plans
def plan_of(sub: SubProblem, assignment: Assignment) -> Plan:
    stages = tuple(
        Stage(sub.options[i].device, sub.options[i].cfg, s, e, sub.options[i].recompute)  # type: ignore[arg-type]
        for i, s, e in assignment
    )
    return sub.inst.make_plan(stages)


def assignment_of(sub: SubProblem, plan: Plan) -> Assignment | None:
    """Map a plan (e.g. the DP's) onto this sub-problem's options, or None if it is not in it."""
    inst = sub.inst
    if plan.family != inst.family or plan.pp not in sub.depths or not plan.stages:
        return None
    if plan.samples_per_microbatch != inst.samples_per_mb or plan.vpp != inst.vpp:
        return None
    index = {(o.device, o.cfg, o.recompute): i for i, o in enumerate(sub.options)}
    out: Assignment = []
    for s in plan.stages:
        i = index.get((s.device, s.cfg, s.recompute))
        if i is None:
            return None
        out.append((i, s.layer_start, s.layer_end))
    if len({int(sub.gid[i]) for i, _, _ in out}) != 1 or not sub.admissible(out):
        return None
    return out


def evaluate_assignment(sub: SubProblem, assignment: Assignment) -> tuple[float, bool]:
    """(objective, fits) of stages priced exactly as the DP prices them (``Instance.evaluate`` per
    stage, ``Instance.p2p`` towards the next stage's link class, ``Instance.objective``)."""
    inst = sub.inst
    P = len(assignment)
    taus: list[float] = []
    syncs: list[float] = []
    fits = True
    for j, (i, s, e) in enumerate(assignment):
        o = sub.options[i]
        p2p = 0.0
        if j + 1 < P:
            nxt = sub.options[assignment[j + 1][0]]
            node = sub.node[nxt.device]
            p2p = inst.p2p(o, nxt.device, 1 if nxt.devices < node else node)
        ev = inst.evaluate(o, s, e, from_end=P - j, first=j == 0, p2p=p2p, pp=P)
        fits = fits and ev.memory <= o.capacity
        taus.append(ev.tau)
        syncs.append(ev.sync)
    return inst.objective(taus, syncs), fits


def subproblems(
    inst: Instance,
    keys_list: Sequence[Sequence[tuple]],
    shared: dict[tuple, SubProblem] | None = None,
    *,
    deadline: Deadline = NO_DEADLINE,
) -> list[SubProblem]:
    """One sub-problem per entry of ``keys_list`` (options grouped in one pass over the instance).

    ``shared`` (a dict the caller keeps across instances) lets the interleaved copies of an instance
    reuse its sub-problems' schedule-independent data (:meth:`SubProblem.for_schedule`). ``deadline`` is
    checked before each sub-problem is built (raises :class:`~hapmoe_milp.deadline.TimeLimitReached`)."""
    by_key: dict[tuple, list[Option]] | None = None
    out = []
    for keys in keys_list:
        deadline.check("building the sub-problems")
        key = (id(inst.options), inst.samples_per_mb, tuple(keys))
        base = shared.get(key) if shared is not None else None
        if base is not None and base.inst.options is inst.options:
            sp = base.for_schedule(inst)
        else:
            if by_key is None:
                by_key = groups(inst)
            sp = SubProblem(inst, keys, by_key)
            if shared is not None:
                shared[key] = sp
        if sp.O and sp.depths:
            out.append(sp)
    return out


__all__ = [
    "ArcSet",
    "Assignment",
    "SubProblem",
    "SubResult",
    "SubStatus",
    "assignment_of",
    "evaluate_assignment",
    "option_name",
    "plan_of",
    "subproblems",
]
