"""The pruned dynamic program over pipeline stages (the fast search mode).

Stages are placed from the last to the first. A state is (sub-problem, first layer of the placed suffix,
devices used per type, device type and size class of the stage just placed, device types seen). Counting
stages from the end makes the 1F1B in-flight count ``min(M, k)`` known when a stage is placed, so one
pass covers every pipeline depth; an interleaved (VPP) sub-problem fixes its depth ``P`` instead, since
Megatron's interleaved warm-up depends on it (:meth:`hapmoe_milp.instance.Instance.in_flight`).

The objective ``alpha*sum(tau) + beta*max(tau) + max(sync)`` has two max terms, which an additive
recurrence cannot carry; each state keeps the Pareto front of ``(sum, max tau, max sync)`` labels. With
every pruning switch off this is exact over the instance; a global upper bound (best plan so far) and
lower bounds on the layers still to place discard labels that cannot win.

A sub-problem is one family group of one instance (megatron: one mesh and recompute level, and for VPP
one virtual-stage count and depth; hetero: one CP / EP-on setting). Megatron sub-problems are searched
cheapest-bound first and skipped, unpriced, once their bound reaches the best plan; the first batch gives
an incumbent within milliseconds. The label loop is vectorised (:mod:`hapmoe_milp.search.dp_levels`);
the pure-Python original is kept in ``tests/oracles/dp_reference.py`` as the tests' oracle.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from hapmoe_milp.config import Family, Settings
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.deadline import NO_DEADLINE, Checkpoint, TimeLimitReached
from hapmoe_milp.errors import InfeasibleError
from hapmoe_milp.instance import PRICING, Instance, Option, build_instances, groups, micro_batch_steps
from hapmoe_milp.plan import Plan, Stage
from hapmoe_milp.search.dp_levels import Best, Chain, run_batch
from hapmoe_milp.search.dp_tables import Clock, DPScope, RowCache, build_batch, kind_order
from hapmoe_milp.search.solution import Progress, ProgressEvent, Solution
from hapmoe_milp.space import PruneCounter, Pruning
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

if TYPE_CHECKING:  # the runtime is read through the instance; only its type is named here
    from hapmoe_milp.runtimes import Runtime

log = logging.getLogger(__name__)

# megatron sub-problems per vectorised batch (each is a handful of options)
MEGATRON_BATCH = 256
# megatron sub-problems searched at once while there is no plan yet, and past how many queued ones they
# are searched step by step rather than once everything is queued (a count, not a clock: same answer
# on a loaded machine)
EARLY = 64
EARLY_AFTER = 20_000
# share of the time limit after which a search without a plan searches what it has queued before pricing
# more (a clock, so only a search that is slow to find its first plan is reordered)
HURRY_SHARE = 0.1
# pruning rules that can cut the optimum when they fire (the others only remove what cannot win)
INEXACT_RULES = ("min_recompute", "cross_type_comm", "pareto_eps", "max_stages", "large_cluster")


def families(family: str) -> list[Family]:
    if family == "both":
        return ["megatron", "hetero"]
    if family not in ("megatron", "hetero"):
        raise InfeasibleError(f"unknown family {family!r}; use megatron, hetero or both")
    return [family]  # type: ignore[list-item]


def plan_from_chain(chain: Chain, inst: Instance) -> Plan:
    stages = tuple(Stage(o.device, o.cfg, s, e, o.recompute) for o, s, e in chain.stages)  # type: ignore[arg-type]
    return inst.make_plan(stages)


@dataclass
class _Run:
    """State of one solve: the incumbent, counters, the clock and the progress sink."""

    t0: float
    clock: Clock
    limit: float | None
    progress: Progress | None
    cache: RowCache
    best: Best = field(default_factory=Best)
    counter: PruneCounter = field(default_factory=PruneCounter)
    n_inst: int = 0
    batches: int = 0
    last_report: float = -1.0
    phase: str = "build"  # "build" (queueing instances), "dp" (searching), "refine" (band-free pass)
    reported: dict[str, int] = field(default_factory=dict)  # most units reported done per phase

    def out_of_time(self) -> bool:
        return self.clock.passed()

    def report(self, phase: str, done: int, total: int, force: bool = False) -> None:
        """A progress event: ``done`` of ``total`` units of the phase (instances queued, sub-problems
        searched), at most every 0.2 s unless forced. A phase's ``done`` never goes back, though its units
        restart (the megatron queue's sub-problems, then the hetero batch): it is what a bar shows."""
        if self.progress is None or total < 1:
            return
        now = time.perf_counter()
        if not force and now - self.last_report < 0.2:
            return  # a few events per second at most
        self.last_report = now
        done = max(done, self.reported.get(phase, 0))
        self.reported[phase] = done
        event = ProgressEvent(phase, done, max(total, done), self.best.value, now - self.t0, self.limit)
        self.progress(event)


class _MegatronQueue:
    """Megatron sub-problems as arrays (instance, group, depth, lower bound), made into
    :class:`DPScope` s only when searched: with VPP a large cluster has hundreds of thousands.

    A group is one mesh and recompute level with one option per device type. Its bound prices only the
    model's main layer kind, its time without recompute (recompute only adds time), its memory at the
    group's recompute level (recompute only removes activations): the ``n`` main-kind layers take
    at least ``T = n * t_min`` summed over stages, the slowest of at most ``P`` stages at least ``T / P``,
    and at least the time ``T*`` at which the cluster's devices can hold and process them at all (each
    device of type ``t`` takes at most ``min(T / w_t, cap_t / (m_t * g))`` layers, ``w_t`` its
    device-seconds and ``m_t`` its bytes per layer at the in-flight count of the last stage, the least
    any stage holds). The bound is ``alpha*T + beta*max(T/P, T*)``.
    """

    def __init__(self, total_devices: int, types: tuple[str, ...], inventory: dict[str, int]) -> None:
        self.total = total_devices
        self.types = types
        self.inv = np.array([inventory[t] for t in types], dtype=float)
        self.insts: list[Instance] = []
        self.groups: list[tuple[Option, ...]] = []
        self.base_groups: dict[int, tuple] = {}  # id(options) -> group arrays
        self.parts: list[tuple[np.ndarray, ...]] = []

    def priced(self, inst: Instance) -> bool:
        """Whether ``inst``'s options are priced already (its interleaved copies share its options)."""
        return id(inst.options) in self.base_groups

    def _groups_of(self, inst: Instance, deadline: Checkpoint) -> tuple:
        """The instance's groups priced for the bound (memoised per option list). ``deadline`` is checked
        per group: pricing a step's options takes up to 0.4 s on 1,024 devices; stopped part-way, the
        queue is left as it was."""
        key = id(inst.options)
        hit = self.base_groups.get(key)
        if hit is not None:
            return hit
        by: dict[tuple, list[Option]] = {}
        for o in inst.options:
            by.setdefault((o.cfg, o.recompute), []).append(o)
        kinds = inst.model.layer_kinds
        main = max(kind_order(kinds), key=kinds.count)
        n_main = kinds.count(main)
        cm = inst.cost_model
        first = len(self.groups)
        G, T = len(by), len(self.types)
        tt = np.zeros(G)
        gg = np.zeros(G, dtype=np.int64)
        w = np.full((G, T), np.inf)  # device-seconds per main-kind layer, per type
        wt = np.zeros((G, T))  # weights bytes per layer and device
        ac = np.zeros((G, T))  # activation bytes per layer, micro-batch and device
        cap = np.zeros((G, T))
        work = np.zeros((G, T))
        tix = {t: i for i, t in enumerate(self.types)}
        for i, opts in enumerate(by.values()):
            deadline.check(PRICING)
            best = math.inf
            for o in opts:
                c = cm.layer(o.device, o.cfg, o.b, main, "none")  # type: ignore[arg-type]
                best = min(best, c.fwd + c.bwd)
                j = tix[o.device]
                w[i, j] = (c.fwd + c.bwd) * o.devices
                # memory at the group's own recompute level: recompute adds time but keeps fewer
                # activations, so pricing them without it would overstate memory (and the bound)
                r = cm.layer(o.device, o.cfg, o.b, main, o.recompute)  # type: ignore[arg-type]
                wt[i, j], ac[i, j], cap[i, j], work[i, j] = r.weights, r.act, o.capacity, r.work
            tt[i] = n_main * best
            gg[i] = opts[0].devices
        self.groups.extend(tuple(opts) for opts in by.values())
        hit = self.base_groups[key] = (first, tt, gg, w, wt, ac, cap, n_main, work)
        return hit

    def _capacity_time(self, gi: np.ndarray, infl: np.ndarray, base: tuple) -> np.ndarray:
        """``T*`` of the class docstring for groups ``gi`` at in-flight counts ``infl`` (inf: no room)."""
        _first, _tt, gg, w, wt, ac, cap, n_main = base[:8]
        cap = cap - base[8]
        m = wt[gi] + infl[:, None] * ac[gi]
        with np.errstate(divide="ignore", invalid="ignore"):
            lay = np.where(np.isfinite(w[gi]), cap[gi] / m / gg[gi, None], 0.0)  # layers per device
        lay = np.where(np.isnan(lay), np.inf, lay)
        rate = np.where(np.isfinite(w[gi]), 1.0 / w[gi], 0.0)  # layers per device-second
        T = len(self.types)
        out = np.zeros(len(gi))
        for mask in range(1 << T):  # capacity = min over one of (rate*T, lay) per type
            a = np.zeros(len(gi))
            b = np.zeros(len(gi))
            for t in range(T):
                if mask >> t & 1:
                    a += self.inv[t] * rate[:, t]
                else:
                    b += self.inv[t] * np.where(rate[:, t] > 0, lay[:, t], 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                tt = np.where(a > 0, (n_main - b) / np.where(a > 0, a, 1.0), np.where(b < n_main, np.inf, 0.0))
            out = np.maximum(out, tt)
        return out

    def _room(self, inst: Instance, gi: np.ndarray, pdiv: np.ndarray, pp: np.ndarray, base: tuple) -> np.ndarray:
        """How many times the main-kind layers fit at most (< 1: they cannot fit): the k-th stage from the
        end holds at most ``(cap - work) / (w + in_flight(k) * a)`` of them on its best device type, and a
        deeper pipeline only adds stages, so the deepest allowed one holds the most."""
        _first, _tt, _gg, w, wt, ac, cap, n_main = base[:8]
        cap = cap - base[8]  # less the main kind's working set (part of every stage's fixed memory)
        out = np.ones(len(gi))
        for p in np.unique(pdiv):
            sel = np.flatnonzero(pdiv == p)
            fixed_p = int(pp[sel[0]]) if len(sel) else 0
            total = np.zeros(len(sel))
            for k in range(1, int(p) + 1):
                infl = inst.in_flight(k, fixed_p or None) if inst.vpp > 1 else inst.in_flight(k)
                with np.errstate(divide="ignore", invalid="ignore"):
                    per = cap[gi[sel]] / (wt[gi[sel]] + infl * ac[gi[sel]])
                per = np.where(np.isfinite(w[gi[sel]]), np.nan_to_num(per, nan=np.inf), 0.0)
                total += per.max(axis=1)
            out[sel] = total / max(1, n_main)
        return out

    def add(self, inst: Instance, deadline: Checkpoint = NO_DEADLINE) -> np.ndarray:
        """Queue ``inst``'s sub-problems; returns their indices into the queue's arrays, bound-sorted.
        Raises :class:`~hapmoe_milp.deadline.TimeLimitReached` (queue unchanged) if ``deadline`` passes
        while its options are priced."""
        base = self._groups_of(inst, deadline)
        first, tt, gg = base[0], base[1], base[2]
        pr = inst.pruning
        a, b = inst.coefficients
        ii = len(self.insts)
        self.insts.append(inst)
        n = inst.num_layers
        if inst.vpp <= 1:
            pmax = np.minimum(n, self.total // gg)
            if pr.max_stages > 0:
                pmax = np.minimum(pmax, pr.max_stages)
            gi = np.flatnonzero(pmax >= 1)
            pp = np.zeros(len(gi), dtype=np.int64)
            pdiv = pmax[gi]
            infl = np.full(len(gi), inst.in_flight(1))
        else:
            depths = np.array(inst.vpp_depths(), dtype=np.int64)
            if pr.max_stages > 0:
                depths = depths[depths <= pr.max_stages]
            g2, p2 = np.meshgrid(np.arange(len(tt)), depths, indexing="ij")
            g2, p2 = g2.ravel(), p2.ravel()
            ok = p2 * gg[g2] <= self.total
            gi, pp = g2[ok], p2[ok]
            pdiv = pp
            infl = np.array([inst.in_flight(1, int(p)) for p in depths], dtype=float)
            infl = infl[np.searchsorted(depths, pp)] if len(pp) else np.zeros(0)
        t_cap = self._capacity_time(gi, infl, base) if len(gi) else np.zeros(0)
        with np.errstate(invalid="ignore"):
            lb = a * tt[gi] + b * np.maximum(tt[gi] / np.maximum(pdiv, 1), t_cap)
        lb[np.isinf(t_cap)] = np.inf  # the devices cannot hold the layers (even with beta = 0)
        room = self._room(inst, gi, pdiv, pp, base)
        lb[room < 1] = np.inf
        start = sum(len(p[0]) for p in self.parts)
        self.parts.append((np.full(len(gi), ii, dtype=np.int64), first + gi, pp, lb, room))
        idx = np.arange(start, start + len(gi))
        return idx[np.argsort(lb, kind="stable")]

    def arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(np.concatenate(c) for c in zip(*self.parts, strict=True))

    def sorted_all(self) -> np.ndarray:
        return np.argsort(self.arrays()[3], kind="stable")

    def sub(self, i: int, arrs: tuple[np.ndarray, ...]) -> DPScope:
        inst_i, grp, pp, lb = arrs[:4]
        return DPScope(self.insts[int(inst_i[i])], self.groups[int(grp[i])], int(pp[i]), float(lb[i]))


def _search_queue(
    q: _MegatronQueue, idx: np.ndarray, run: _Run, *, band: bool, clock: Clock, skip: set[int] | None = None
) -> bool:
    """Search the queued megatron sub-problems ``idx`` (sorted by bound) in batches until the bound
    reaches the best plan. False if the clock stopped it."""
    arrs = q.arrays()
    lb = arrs[3]
    pos = 0
    size = 32  # small batches first: the incumbent (and with it the bound) improves between them
    while pos < len(idx):
        if clock.passed():
            return False
        if lb[idx[pos]] >= run.best.value:
            run.counter.add("bound", len(idx) - pos)
            break
        chunk = []
        size = min(2 * size, MEGATRON_BATCH)
        while pos < len(idx) and len(chunk) < size and lb[idx[pos]] < run.best.value:
            if skip is None or int(idx[pos]) not in skip:
                chunk.append(q.sub(int(idx[pos]), arrs))
            pos += 1
        if chunk and not _run(chunk, run, band=band, clock=clock):
            return False
        run.report(run.phase, pos, len(idx))
    return True


def _run(subs: list[DPScope], run: _Run, *, band: bool, clock: Clock) -> bool:
    batch = build_batch(subs, run.cache, band=band, clock=clock)
    if batch is None:
        return False
    run.batches += 1
    return run_batch(batch, run.best, run.counter, clock)


def solve_dp(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    *,
    family: str = "both",
    pruning: Pruning | None = None,
    time_limit: float | None = None,
    instances: Iterable[Instance] | None = None,
    name: str = "dp",
    progress: Progress | None = None,
    cost_model: CostModel | None = None,
    runtimes: Mapping[str, Runtime | None] | None = None,
    plan_by: float | None = None,
) -> Solution:
    """Search every plan of the DP's space; anytime: ``time_limit`` covers the whole call, building included.

    ``cost_model``: one already used by another search of this model and cluster (its priced layers are
    reused; settings that differ only in optimizer offload share through :meth:`CostModel.for_settings`).
    ``runtimes`` maps a family to the runtime whose rules its plans must meet (missing or None: the
    what-if space of that family).
    ``plan_by``: seconds (from the call) by which the search must have found a plan, or it stops there
    (status ``timeout``, no plan, ``stats["no_plan_by_s"]``): the caller has a later try for the time
    left (:func:`hapmoe_milp.api.solve`'s optimizer-offload retry). A search with a plan by then runs on.

    The status says how far the answer is proven: ``optimal`` when the search completed and no rule that
    can cut the optimum fired (``stats["cut_by"]`` is empty), ``feasible`` when it completed but such a
    rule fired (``cut_by`` names them), ``timeout`` when the clock stopped it (the best plan so far).
    """
    search = _DPSearch(
        model, cluster, settings, pruning, time_limit, progress, cost_model, instances is None, runtimes, plan_by
    )
    if instances is not None:
        given = sorted(instances, key=lambda i: (i.family != "megatron", -i.samples_per_mb, i.vpp))
        fams: list[tuple[Family, list[Instance] | None]] = [
            (f, [i for i in given if i.family == f]) for f in ("megatron", "hetero")
        ]
    else:
        fams = [(f, None) for f in families(family)]
    complete = all(search.search_family(fam, insts) for fam, insts in fams)
    refined = complete and search.refining and search.refine()
    run = search.run
    sol = _solution(name, run, search.pr, complete, refined, time.perf_counter() - run.t0)
    if not complete and sol.plan is None and search.clock.soft_passed() and plan_by is not None:
        sol.stats["no_plan_by_s"] = plan_by  # stopped early for a later try, not by the limit
    n_done = max(1, run.n_inst)
    run.report(run.phase, n_done, n_done, force=True)  # the last event carries the final best
    return sol


class _DPSearch:
    """One DP solve: the families' instances are queued (megatron sub-problems in a bound-ordered queue,
    hetero ones per group), searched, and -- on small clusters with the layer band on -- searched again
    without the band (:meth:`refine`). Every step returns False when the clock stopped it."""

    def __init__(
        self,
        model: ModelSpec,
        cluster: ClusterSpec,
        settings: Settings,
        pruning: Pruning | None,
        time_limit: float | None,
        progress: Progress | None,
        cost_model: CostModel | None,
        own_instances: bool,
        runtimes: Mapping[str, Runtime | None] | None = None,
        plan_by: float | None = None,
    ) -> None:
        t0 = time.perf_counter()
        self.c0 = time.process_time()
        self.model, self.cluster, self.settings = model, cluster, settings
        self.clock = Clock(
            wall=t0 + time_limit if time_limit else None,
            soft=t0 + plan_by if plan_by is not None else None,
            found=lambda: self.run.best.chain is not None,
        )
        self.pr = pr = pruning or Pruning()
        kinds = kind_order(model.layer_kinds)
        self.run = _Run(t0, self.clock, time_limit, progress, RowCache(kinds, tuple(cluster.inventory)))
        self.cm = cost_model.for_settings(settings) if cost_model is not None else CostModel(model, cluster, settings)
        self.queue = _MegatronQueue(sum(cluster.inventory.values()), tuple(cluster.inventory), cluster.inventory)
        self.hetero: list[DPScope] = []
        self.early: set[int] = set()  # queue entries already searched by :meth:`flush`
        self.queued: list[int] = []  # micro-batch steps queued, in order
        self.n_family = 0  # instances of the family being queued (for progress)
        small = not (0 < pr.large_cluster < cluster.world_size)
        self.refining = small and own_instances and pr.layer_band and pr.band_refine
        self.megatron_free_done = False
        self.price_s = 0.0  # the longest a megatron instance with options not yet priced took to queue
        self.runtimes = runtimes or {}

    def family_instances(self, fam: Family) -> Iterator[Instance]:
        """The family's instances as they are built, largest micro-batch step first (fewest micro-batches,
        usually the fastest plans) and rising VPP within a step, so a hurried search can start on the
        first ones before the rest are priced (:meth:`hurried`). Sets :attr:`n_family` (an upper estimate,
        for progress)."""
        mv = self.pr.max_vpp if fam == "megatron" else 1
        rt = self.runtimes.get(fam)
        cache: dict = {}
        steps = micro_batch_steps(self.model, self.cluster, self.settings, fam, cache)
        self.n_family = self.run.n_inst + len(steps) * mv
        yield from build_instances(
            self.model,
            self.cluster,
            self.settings,
            fam,
            self.pr,
            self.cm,
            max_vpp=mv,
            runtime=rt,
            largest_first=True,
            config_cache=cache,
            deadline=self.clock,
        )

    def hurried(self) -> bool:
        """No plan yet and ``HURRY_SHARE`` of the time limit gone: search what is queued before building
        (pricing) the rest, so a short limit ends with a plan rather than a finished queue."""
        if self.run.best.chain is not None or self.run.limit is None:
            return False
        return time.perf_counter() - self.run.t0 > HURRY_SHARE * self.run.limit

    def no_time_to_price(self) -> bool:
        """With a plan in hand, stop before pricing another micro-batch step's options when less time is
        left than the longest such pricing took so far (0.1-0.4 s per step on 1,024 devices): a pricing cut
        off by the clock (checked per group, :meth:`_MegatronQueue.add`) queues nothing, so starting one
        that cannot finish only spends the time left."""
        wall = self.clock.wall
        if wall is None or self.run.best.chain is None:
            return False
        return wall - time.perf_counter() < self.price_s

    def take(self, inst: Instance) -> bool:
        """Queue one instance's sub-problems (megatron: in the bound-ordered queue; hetero: one per group).
        On a large cluster with no plan yet, each completed micro-batch step is searched early (:meth:`flush`)."""
        run, queue = self.run, self.queue
        run.n_inst += 1
        if inst.vpp <= 1:
            for rule, n in inst.counter.counts.items():
                run.counter.add(rule, n)
        if inst.family == "megatron":
            step_done = bool(self.queued) and self.queued[-1] != inst.samples_per_mb
            # queueing is cheap on small clusters; on large ones (past EARLY_AFTER sub-problems) it takes
            # a while, so without a plan each micro-batch step is searched as soon as it is queued
            if step_done and sum(len(p[0]) for p in queue.parts) > EARLY_AFTER and not self.flush():
                return False
            queue.add(inst, self.clock)
            self.queued.append(inst.samples_per_mb)
            if self.hurried() and not self.flush():
                return False
        else:
            self.hetero.extend(DPScope(inst, tuple(o)) for o in groups(inst).values())
        run.report("build", run.n_inst, self.n_family)
        return True

    def flush(self) -> bool:
        """While there is no plan yet, search the most promising few sub-problems queued so far."""
        run, queue, early = self.run, self.queue, self.early
        if run.best.chain is not None or not queue.parts:
            return True
        arrs = queue.arrays()
        idx = np.flatnonzero(np.isfinite(arrs[3]))
        if early:
            idx = idx[~np.isin(idx, np.fromiter(early, dtype=np.int64))]
        if not len(idx):
            return True
        lb, room = arrs[3][idx], arrs[4][idx]
        # half the most promising by bound, half those with the most memory to spare: a slow plan that
        # fits still bounds everything after it, and the cheapest bounds often belong to plans that do not
        by_lb = idx[np.argsort(lb, kind="stable")[: EARLY // 2]]
        by_room = idx[np.argsort(-room, kind="stable")[: EARLY // 2]]
        first = np.unique(np.concatenate([by_lb, by_room]))
        first = first[np.argsort(arrs[3][first], kind="stable")]
        early.update(int(i) for i in first)
        if not _search_queue(queue, first, run, band=True, clock=self.clock):
            return False
        if run.best.chain is None and self.refining:
            # the band-free pass searches these anyway; their plan bounds the banded search
            return _search_queue(queue, first, run, band=False, clock=self.clock)
        return True

    def search_family(self, fam: Family, insts: list[Instance] | None) -> bool:
        """Queue and search one family: every megatron sub-problem, cheapest bound first, until the bound
        reaches the best plan; all hetero instances in one vectorised batch (each level extends every
        instance's states)."""
        run, queue, clock = self.run, self.queue, self.clock
        run.phase = "build"
        if insts is not None:
            self.n_family = run.n_inst + len(insts)
        try:
            for inst in insts if insts is not None else self.family_instances(fam):
                pricing = inst.family == "megatron" and not queue.priced(inst)
                if run.out_of_time() or (pricing and self.no_time_to_price()):
                    return False
                t = time.perf_counter()
                if not self.take(inst):
                    return False
                if pricing:
                    self.price_s = max(self.price_s, time.perf_counter() - t)
        except TimeLimitReached:  # the clock stopped pricing part-way (build_options, the queue's bounds)
            return False
        run.report("build", run.n_inst, run.n_inst, force=True)
        if not self.flush():
            return False
        run.phase = "dp"
        if fam == "megatron" and queue.parts:
            if not _search_queue(queue, queue.sorted_all(), run, band=True, clock=clock, skip=self.early):
                return False
            if run.best.chain is None and self.refining:
                # nothing inside the band: the band-free megatron pass (due in the refinement anyway) is
                # cheap, and its plan bounds the hetero search, which without any bound searches it all
                if not _search_queue(queue, queue.sorted_all(), run, band=False, clock=clock):
                    return False
                self.megatron_free_done = True
        if fam == "hetero" and self.hetero:
            ok = _run(self.hetero, run, band=True, clock=clock)
            run.report("dp", len(self.hetero), len(self.hetero), force=True)
            return ok
        return True

    def refine(self) -> bool:
        """The band is centred on estimated speeds and can cut the optimum when memory forces slower
        options than the estimate assumed (or cut every plan that fits). Re-search without it, bounded
        by the plan just found (which prunes most of the space) and by as much CPU time again as the
        first pass took (at least a second; CPU time, so that a loaded machine gets the same answer),
        within the time limit. False (and counted) when that budget ran out."""
        run, queue = self.run, self.queue
        spent = time.process_time() - self.c0
        clock = replace(self.clock, cpu=time.process_time() + max(1.0, spent))
        ok = True
        run.phase = "refine"
        if queue.parts and not self.megatron_free_done:
            ok = _search_queue(queue, queue.sorted_all(), run, band=False, clock=clock)
        if ok and self.hetero:
            ok = _run(self.hetero, run, band=False, clock=clock)
        if not ok:
            run.counter.add("refine_timeout")
        return ok


def _solution(name: str, run: _Run, pr: Pruning, complete: bool, refined: bool, wall: float) -> Solution:
    counts = run.counter.counts
    exact_space = pr == replace(Pruning.off(), max_vpp=pr.max_vpp) or (
        not pr.layer_band
        and not pr.min_recompute
        and not pr.cross_type_comm
        and pr.max_stages <= 0
        and not pr.uniform_stage_size
        and pr.large_cluster <= 0
        and pr.pareto_eps == 0
    )
    cut_by = [r for r in INEXACT_RULES if counts.get(r, 0) > 0]
    if pr.layer_band and counts.get("layer_band", 0) > 0 and not refined:
        cut_by.insert(0, "layer_band")
    if pr.uniform_stage_size:
        cut_by.append("uniform_stage_size")
    stats = {"instances": run.n_inst, "batches": run.batches, "exact_space": exact_space, "cut_by": cut_by}
    if not complete:
        stats["stopped_by"] = "time"
    elif cut_by:
        stats["stopped_by"] = "pruning"
    best = run.best
    if best.chain is None or best.sub is None:
        status = "timeout" if not complete else "infeasible"
        return Solution(
            name,
            status,
            None,
            float("inf"),
            float("nan"),
            wall,
            counts,
            stats=stats,
            message="" if not complete else "no plan satisfies memory and inventory",
        )
    plan = plan_from_chain(best.chain, best.sub.inst)
    runner = None
    if best.second_chain is not None and best.second_sub is not None:
        runner = plan_from_chain(best.second_chain, best.second_sub.inst)
    if not complete:
        status = "timeout"
    else:
        status = "optimal" if not cut_by else "feasible"
    bound = best.value if status == "optimal" else float("nan")
    if math.isfinite(bound):
        stats["proof"] = "optimal over the DP's space"
    return Solution(
        name,
        status,  # type: ignore[arg-type]
        plan,
        best.value,
        bound,
        wall,
        counts,
        runner_up=runner,
        runner_up_s=best.second_value if runner else None,
        stats=stats,
    )


__all__ = ["families", "plan_from_chain", "solve_dp"]
