"""The shared problem instance: every valid stage option with its cost coefficients.

For one (family, micro-batch step) the instance lists each stage option ``c = (device, TP, CP, DP, EP,
ETP, recompute)`` together with prefix sums of its per-layer coefficients over the model's layer
sequence, so the cost of putting layers ``[s, e)`` on ``c`` is a difference of two prefix values. The
DP, CP-SAT and MILP solvers all read these numbers; none of them prices anything itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from hapmoe_milp.config import RECOMPUTE_LEVELS, Family, ParallelConfig, Settings, parse_recompute
from hapmoe_milp.cost.model import CostModel, LayerCost
from hapmoe_milp.cost.pipeline import in_flight, pipeline_coefficients
from hapmoe_milp.deadline import NO_DEADLINE, Checkpoint
from hapmoe_milp.plan import Plan, Stage
from hapmoe_milp.space import PruneCounter, Pruning, StageRules, configs, runtime_allows, stage_rules, stage_sizes
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import LayerKind, ModelSpec

if TYPE_CHECKING:  # the runtime is read through the instance; only its type is named here
    from hapmoe_milp.runtimes import Runtime

ATTRS = ("fwd", "bwd", "weights", "act", "rs", "ag", "opt")
PRICING = "pricing stage options"  # what a deadline names when it stops :func:`build_options`


@dataclass(frozen=True, eq=False)
class Option:
    """One stage option ``(device, TP, CP, DP, EP, ETP, recompute)`` at a micro-batch of ``b`` samples.

    Its coefficients come from the cost model on first use (``per_kind``, ``first``, ``last``, ``fixed``;
    the cost model memoises them): a large cluster has tens of thousands of options and the DP prices
    only those its bounds cannot rule out.
    """

    index: int
    device: str
    cfg: ParallelConfig
    recompute: str
    b: int  # samples per replica per micro-batch on this stage
    capacity: float
    band: tuple[int, int]  # allowed layer counts (inclusive) under the layer-band rule
    layer_kinds: tuple[LayerKind, ...]  # the model's layer sequence (shared, for the prefix sums)
    cost_model: CostModel = field(repr=False, compare=False)

    def kind_cost(self, kind: LayerKind) -> LayerCost:
        """One layer of ``kind`` on this option (priced, and memoised, by the cost model)."""
        return self.cost_model.layer(self.device, self.cfg, self.b, kind, self.recompute)  # type: ignore[arg-type]

    @cached_property
    def per_kind(self) -> dict[LayerKind, LayerCost]:
        return {k: self.kind_cost(k) for k in sorted(set(self.layer_kinds))}

    @cached_property
    def first(self) -> LayerCost:
        return self.cost_model.first_edge(self.device, self.cfg, self.b)

    @cached_property
    def last(self) -> LayerCost:
        return self.cost_model.last_edge(self.device, self.cfg, self.b)

    @cached_property
    def single(self) -> LayerCost:
        """Both edges of a one-stage pipeline, as one term (tied embeddings counted once)."""
        return self.cost_model.single_edge(self.device, self.cfg, self.b)

    def edge(self, first: bool, last: bool) -> LayerCost | None:
        """The edge term of a stage that is the first and/or the last (none for a middle stage)."""
        if first and last:
            return self.single
        return self.first if first else (self.last if last else None)

    @cached_property
    def fixed(self) -> float:
        return self.cost_model.fixed_memory(self.device, self.cfg, self.b)

    @property
    def devices(self) -> int:
        return self.cfg.devices

    @property
    def shape(self) -> tuple[str, ParallelConfig]:
        return (self.device, self.cfg)

    @cached_property
    def prefix(self) -> dict[str, tuple[float, ...]]:
        """Prefix sums of every coefficient over the layer sequence, built on first use: most options of a
        large space are never priced layer by layer (the DP reads ``per_kind`` through arrays)."""
        out: dict[str, tuple[float, ...]] = {}
        for attr in ATTRS:
            vals = [0.0]
            for k in self.layer_kinds:
                vals.append(vals[-1] + getattr(self.per_kind[k], attr))
            out[attr] = tuple(vals)
        return out

    def seg(self, attr: str, s: int, e: int) -> float:
        p = self.prefix[attr]
        return p[e] - p[s]


@dataclass(frozen=True)
class StageEval:
    fwd: float
    bwd: float
    p2p: float
    tau: float
    memory: float
    sync: float  # exposed DP sync + optimizer


@dataclass
class Instance:
    model: ModelSpec
    cluster: ClusterSpec
    settings: Settings
    family: Family
    samples_per_mb: int
    num_microbatches: int
    options: list[Option]
    cost_model: CostModel
    pruning: Pruning
    counter: PruneCounter = field(default_factory=PruneCounter)
    vpp: int = 1  # virtual pipeline chunks per stage (interleaved 1F1B); 1 = plain 1F1B
    #: the runtime whose rules the plans must meet (None: the what-if space, Megatron's per-mesh rules only)
    runtime: Runtime | None = None

    @property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        return self.model.layer_kinds

    @property
    def num_layers(self) -> int:
        return len(self.model.layer_kinds)

    @property
    def first_dp(self) -> int:
        return self.samples_per_mb // self.settings.micro_batch_size

    @property
    def coefficients(self) -> tuple[float, float]:
        return pipeline_coefficients(self.num_microbatches, self.vpp)

    def in_flight(self, from_end: int, pp: int | None = None) -> float:
        """Micro-batches of activations held at peak by the ``from_end``-th stage counted from the last
        (1 = last), in units of the stage's whole layer set. Every solver reads the in-flight multiplier
        here, so the schedule's memory rule lives in one place (:func:`hapmoe_milp.cost.pipeline.in_flight`).

        Plain 1F1B needs only the distance from the end (``min(M, from_end)``). The interleaved schedule's
        warm-up grows with the pipeline depth too (``2(k-1) + (v-1)P + 1`` chunks of ``1/v`` of the rank's
        layers), so a ``vpp > 1`` instance needs ``pp``.
        """
        if self.vpp <= 1:
            return float(min(self.num_microbatches, from_end))
        if pp is None or not 1 <= from_end <= pp:
            raise ValueError(f"interleaved in-flight count needs the pipeline depth (from_end={from_end}, pp={pp})")
        return in_flight(pp - from_end, pp, self.num_microbatches, self.vpp)

    def vpp_depths(self) -> tuple[int, ...]:
        """Pipeline depths an interleaved (``vpp > 1``) plan of this instance may have: Megatron needs
        ``P > 1`` and ``M % P == 0`` (its default micro-batch group is ``P``), and every virtual chunk gets
        at least one layer, the embedding or the loss counting as one in the first and last chunk
        (``P * vpp <= layers + 2``; :attr:`stage_min_layers` has the per-stage rule). Empty for ``vpp == 1``."""
        if self.vpp <= 1:
            return ()
        n, m = self.num_layers, self.num_microbatches
        return tuple(p for p in range(2, (n + 2) // self.vpp + 1) if m % p == 0)

    @property
    def stage_min_layers(self) -> tuple[int, int, int]:
        """Fewest layers a (middle, last, first) stage may hold: 1 under plain 1F1B; interleaved, a layer
        per virtual chunk (``v``), except that the first stage's first chunk may hold only the embedding and
        the last stage's last chunk only the loss (``v - 1``: Megatron's ``E|...|L`` layouts); the last
        stage's MTP layers in its last chunk (``v + mtp - 1``), and the first stage's first chunk holding the
        leading block of another kind (``ceil(n / v) >= lead``, i.e. ``n >= (lead - 1) v + 1``;
        :func:`vpp_lead`). The DP and the exact formulation both read it."""
        v = self.vpp
        mtp = sum(1 for k in self.layer_kinds if k == "mtp")
        # a runtime whose layer split counts decoder layers per stage needs one beside the MTP layers
        last_dec = mtp + 1 if mtp and self.runtime is not None and self.runtime.mtp_with_decoder else 1
        if v <= 1:
            return 1, last_dec, 1
        lead = vpp_lead(self.model) or 0
        last = v + mtp - 1 if mtp else v - 1
        first = max(v, (lead - 1) * v + 1) if lead else v - 1  # a leading block must sit in the first chunk
        return v, max(last, last_dec), first

    @property
    def inventory(self) -> dict[str, int]:
        return self.cluster.inventory

    def objective(self, taus: list[float], syncs: list[float]) -> float:
        a, b = self.coefficients
        return a * sum(taus) + b * max(taus) + max(syncs)

    def make_plan(self, stages: tuple[Stage, ...]) -> Plan:
        """The plan of ``stages`` under this instance's settings: every solver builds its plans here, so
        a plan always carries exactly what it was solved under (all settings, both specs, the runtime)."""
        plan = Plan.from_settings(self.model, self.cluster, self.family, stages, self.settings, vpp=self.vpp)
        return plan.with_runtime(self.runtime)

    @property
    def stage_rules(self) -> StageRules:
        """The runtime rules that tie stages together, which the solvers enforce (options alone cannot)."""
        return stage_rules(self.runtime, self.model, self.settings)

    def p2p(self, src: Option, dst_device: str, dst_devices: int) -> float:
        """The boundary's transfers per micro-batch (per virtual chunk when interleaved)."""
        return self.cost_model.boundary_p2p(src.device, src.cfg, src.b, dst_device, dst_devices, self.vpp)

    def evaluate(
        self, opt: Option, s: int, e: int, *, from_end: int, first: bool, p2p: float = 0.0, pp: int | None = None
    ) -> StageEval:
        """Cost of layers [s, e) on option ``opt`` as the ``from_end``-th stage counted from the last (1 = last);
        ``pp`` (the pipeline depth) is needed for interleaved instances (see :meth:`in_flight`)."""
        last = from_end == 1
        fwd = opt.seg("fwd", s, e)
        bwd = opt.seg("bwd", s, e)
        w = opt.seg("weights", s, e)
        a = opt.seg("act", s, e)
        rs = opt.seg("rs", s, e)
        ag = opt.seg("ag", s, e)
        op = opt.seg("opt", s, e)
        fixed = opt.fixed
        edge = opt.edge(first, last)
        if edge is not None:
            fwd += edge.fwd
            bwd += edge.bwd
            w += edge.weights
            a += edge.act
            rs += edge.rs
            ag += edge.ag
            op += edge.opt
            fixed += edge.work
        infl = self.in_flight(from_end, pp)
        y = self.cost_model.exposed_sync(opt.device, rs, ag, fwd, bwd, op)
        return StageEval(fwd, bwd, p2p, fwd + bwd + 2 * p2p, w + infl * a + fixed, y)


def _assign_bands(
    opts: list[Option],
    model: ModelSpec,
    cluster: ClusterSpec,
    delta: float,
    counter: PruneCounter,
    by_peak: bool,
    deadline: Checkpoint = NO_DEADLINE,
) -> None:
    """HAPMoE's load-balance band, generalised: a stage's layer count stays within (1 +/- delta) of its
    share of the cluster's speed.

    Speeds come from the cost model, not from peak FLOPs (peaks misjudge e.g. MI300X vs 910B by ~1.7x on
    MoE layers): ``w_h`` is the fewest device-seconds a layer of the dominant kind needs on type ``h``,
    the cluster processes ``V = sum_h m_h / w_h`` layers per second at best, and option ``c`` processes
    ``1 / tau_c``; its share is ``n_hat = N * (1 / tau_c) / V``.
    """
    kinds_seq = model.layer_kinds
    n = len(kinds_seq)
    main = max(set(kinds_seq), key=kinds_seq.count)
    if by_peak:
        # large clusters: HAPMoE's own rule, shares of the summed dense peak (memory, not speed, limits
        # the feasible options there, and the speed-based centre can exclude every feasible split)
        total = sum(cluster.device(t).dense_peak_tflops * m for t, m in cluster.inventory.items())
        shares = {id(o): n * o.devices * cluster.device(o.device).dense_peak_tflops / total for o in opts}
    else:
        w: dict[str, float] = {}
        for o in opts:
            deadline.check(PRICING)
            lc = o.kind_cost(main)
            w[o.device] = min(w.get(o.device, float("inf")), (lc.fwd + lc.bwd) * o.devices)
        speed = sum(m / w[t] for t, m in cluster.inventory.items() if t in w and w[t] > 0)
        shares = {}
        for o in opts:
            lc = o.kind_cost(main)
            tau = lc.fwd + lc.bwd
            shares[id(o)] = n * (1.0 / tau) / speed if tau > 0 and speed > 0 else n
    for o in opts:
        share = shares[id(o)]
        lo = max(1, math.floor((1 - delta) * share))
        hi = min(n, max(lo, math.ceil((1 + delta) * share)))
        object.__setattr__(o, "band", (lo, hi))
        counter.add("layer_band", n - (hi - lo + 1))


def _dominated(a: Option, b: Option, kinds: list[LayerKind]) -> bool:
    """True when ``a`` is no better than ``b`` in every coefficient (``b`` can replace ``a``)."""
    for k in kinds:
        ca, cb = a.per_kind[k], b.per_kind[k]
        for attr in ATTRS:
            if getattr(ca, attr) < getattr(cb, attr):
                return False
    for ea, eb in ((a.first, b.first), (a.last, b.last), (a.single, b.single)):
        for attr in (*ATTRS, "work"):
            if getattr(ea, attr) < getattr(eb, attr):
                return False
    if a.fixed < b.fixed:
        return False
    # p2p bytes scale with 1/(TP*CP); memory-band and CP ring differences are inside the coefficients
    return a.cfg.tp * a.cfg.cp <= b.cfg.tp * b.cfg.cp


def _dominated_in(grp: list[Option], kinds: list[LayerKind]) -> np.ndarray:
    """Which options of ``grp`` another one can replace (:func:`_dominated`, all pairs at once); of
    options equal in every coefficient the first is kept."""
    vec = np.array(
        [
            [getattr(o.per_kind[k], a) for k in kinds for a in ATTRS]
            + [getattr(e, a) for e in (o.first, o.last, o.single) for a in (*ATTRS, "work")]
            + [o.fixed]
            for o in grp
        ]
    )
    tpcp = np.array([o.cfg.tp * o.cfg.cp for o in grp])
    # dom[i, j]: option i is no better than option j in every coefficient (j can replace i)
    dom = (vec[:, None, :] >= vec[None, :, :]).all(axis=2) & (tpcp[:, None] <= tpcp[None, :])
    n = len(grp)
    later = np.arange(n)[None, :] > np.arange(n)[:, None]
    return (dom & ~np.eye(n, dtype=bool) & ~(dom.T & later)).any(axis=1)


def build_options(
    model: ModelSpec,
    cluster: ClusterSpec,
    cm: CostModel,
    family: Family,
    samples_per_mb: int,
    pruning: Pruning,
    counter: PruneCounter,
    config_cache: dict[tuple[int, int], list[ParallelConfig]] | None = None,
    runtime: Runtime | None = None,
    deadline: Checkpoint = NO_DEADLINE,
) -> list[Option]:
    """The options of one family and micro-batch step, banded and pruned as ``pruning`` says. Options are
    priced here only as far as a rule needs (bands: the main kind; hetero dominance: every coefficient),
    which on a large cluster takes up to a second: ``deadline`` is checked between options and groups
    (raises :class:`~hapmoe_milp.deadline.TimeLimitReached`), so a search past its limit stops here
    instead of finishing the pass."""
    st = cm.settings
    kinds_seq = model.layer_kinds
    kinds = sorted(set(kinds_seq))
    n = len(kinds_seq)
    cache = config_cache if config_cache is not None else {}
    opts: list[Option] = []
    large = family == "hetero" and 0 < pruning.large_cluster < cluster.world_size
    # FlagScale expresses per-stage recompute only as none/full (per stage and micro-batch)
    levels = search_levels(model) if family == "megatron" else ("none", "full")
    if runtime is not None:
        levels = tuple(lv for lv in levels if lv in runtime.recompute)
    for did in cluster.device_types:
        node = cluster.node_size(did)
        for g in stage_sizes(cluster, did):
            if large and g < node:
                counter.add("large_cluster")
                continue
            cfgs = cache.get((g, node))
            if cfgs is None:
                cfgs = cache[(g, node)] = configs(model, g, node, st.seq_length)
            for cfg in cfgs:
                deadline.check(PRICING)
                if samples_per_mb % cfg.dp:
                    continue
                if family == "megatron" and cfg.dp * st.micro_batch_size != samples_per_mb:
                    continue
                if family == "hetero" and cfg.cp > 1:
                    continue  # FlagScale's heterogeneous ParallelContext rejects context parallelism
                if runtime is not None and not runtime_allows(runtime, cfg):
                    counter.add("runtime")
                    continue
                b = samples_per_mb // cfg.dp
                band = (1, n)  # narrowed below when the layer-band rule is on
                cap = cm.capacity(did, cfg)
                for r in levels:
                    opts.append(Option(-1, did, cfg, r, b, cap, band, kinds_seq, cm))
    if pruning.layer_band and opts:
        by_peak = 0 < pruning.large_cluster < cluster.world_size
        _assign_bands(opts, model, cluster, pruning.delta, counter, by_peak, deadline)
    if pruning.dominance and family == "hetero":
        keep: list[Option] = []
        groups: dict[tuple, list[Option]] = {}
        for o in opts:
            groups.setdefault((o.device, o.devices, o.cfg.cp, o.cfg.ep > 1, o.cfg.dp, o.recompute), []).append(o)
        for grp in groups.values():
            deadline.check(PRICING)
            dropped = _dominated_in(grp, kinds)
            counter.add("dominance", int(dropped.sum()))
            keep.extend(o for o, d in zip(grp, dropped, strict=True) if not d)
        opts = keep
    if large and pruning.large_cluster_top_k > 0:
        # per (device, size, CP, EP on/off, DP, recompute): the options on the (time, memory) front of
        # the model's dominant layer kind, at most k of them, fastest first
        main = max(kinds, key=kinds_seq.count)
        groups_: dict[tuple, list[Option]] = {}
        for o in opts:
            groups_.setdefault((o.device, o.devices, o.cfg.cp, o.cfg.ep > 1, o.cfg.dp, o.recompute), []).append(o)
        keep2: list[Option] = []
        for grp in groups_.values():
            deadline.check(PRICING)
            scored = sorted(
                grp,
                key=lambda o: (
                    o.kind_cost(main).fwd + o.kind_cost(main).bwd,
                    o.kind_cost(main).weights + o.kind_cost(main).act,
                ),
            )
            front: list[Option] = []
            best_mem = float("inf")
            for o in scored:
                mem = o.kind_cost(main).weights + o.kind_cost(main).act
                if mem < best_mem:
                    front.append(o)
                    best_mem = mem
            kept = front[: pruning.large_cluster_top_k]
            counter.add("large_cluster", len(grp) - len(kept))
            keep2.extend(kept)
        opts = keep2
    out = []
    for i, o in enumerate(opts):
        object.__setattr__(o, "index", i)
        out.append(o)
    return out


def search_levels(model: ModelSpec) -> tuple[str, ...]:
    """The recompute ladder (config.RECOMPUTE_LEVELS, argued in cost/recompute.py) without the rungs that
    are no-ops for this model: ``sel-mlp`` needs a dense MLP, shared experts or MLA to recompute; ``sel-moe`` needs
    MoE layers."""
    out = []
    for lv in RECOMPUTE_LEVELS:
        if lv == "sel-mlp" and not (
            "dense" in model.layer_kinds or model.moe_shared_expert_intermediate_size or model.multi_latent_attention
        ):
            continue
        if lv == "sel-moe" and not model.is_moe:
            continue
        out.append(lv)
    return tuple(out)


def micro_batch_steps(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    family: Family,
    config_cache: dict[tuple[int, int], list[ParallelConfig]] | None = None,
) -> list[int]:
    """Samples per pipeline micro-batch step ``mbs * dp_0`` that divide the global batch."""
    cache = config_cache if config_cache is not None else {}
    dps: set[int] = set()
    for did in cluster.device_types:
        node = cluster.node_size(did)
        for g in stage_sizes(cluster, did):
            cfgs = cache.get((g, node))
            if cfgs is None:
                cfgs = cache[(g, node)] = configs(model, g, node, settings.seq_length)
            for cfg in cfgs:
                dps.add(cfg.dp)
    out = []
    for dp in sorted(dps):
        step = dp * settings.micro_batch_size
        if settings.global_batch_size % step == 0:
            out.append(step)
    return out


def build_instances(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    family: Family,
    pruning: Pruning | None = None,
    cost_model: CostModel | None = None,
    *,
    max_vpp: int = 1,
    runtime: Runtime | None = None,
    largest_first: bool = False,
    config_cache: dict[tuple[int, int], list[ParallelConfig]] | None = None,
    deadline: Checkpoint = NO_DEADLINE,
) -> Iterator[Instance]:
    """The instances of one family, one per micro-batch step (smallest step first, or with
    ``largest_first`` largest first: the order the DP searches them in, so it can search while building).

    With ``max_vpp > 1`` the megatron family also yields, after each step's plain instance, interleaved
    instances (``vpp`` = 2..max_vpp) over the same options: the layer costs do not depend on the schedule,
    only the pipeline coefficients and the in-flight rule do. Only instances with a valid depth
    (:meth:`Instance.vpp_depths`) and a layer sequence whose interleaved chunks price like the stage's
    contiguous range (:func:`vpp_lead`) are yielded.

    ``deadline`` is handed to :func:`build_options` (it stops a step's pricing part-way).

    ``runtime`` restricts the space to what that runtime runs (its option rules here, its VPP support, and
    the rules tying stages together, :attr:`Instance.stage_rules`, which the solvers enforce).
    """
    pr = pruning or Pruning()
    if runtime is not None and (not runtime.vpp or model.is_hybrid):
        max_vpp = 1  # the runtime has none, or Megatron's hybrid (Mamba) stack has none
    cm = cost_model or CostModel(model, cluster, settings)
    cache = config_cache if config_cache is not None else {}
    lead = vpp_lead(model)
    overlap = settings.overlap_ep_comm and model.is_moe
    steps = micro_batch_steps(model, cluster, settings, family, cache)
    for step in reversed(steps) if largest_first else steps:
        counter = PruneCounter()
        opts = build_options(model, cluster, cm, family, step, pr, counter, cache, runtime, deadline)
        plain = opts
        if overlap:
            opts, plain = _ep_overlap_options(opts, model, cluster.world_size, counter)
        if not opts:
            continue
        base = Instance(
            model=model,
            cluster=cluster,
            settings=settings,
            family=family,
            samples_per_mb=step,
            num_microbatches=settings.global_batch_size // step,
            options=plain,
            cost_model=cm,
            pruning=pr,
            counter=counter,
            runtime=runtime,
        )
        if plain:
            yield base
        if family != "megatron" or lead is None:
            continue
        for v in range(2, max_vpp + 1):
            inst = replace(base, vpp=v, options=opts, counter=PruneCounter())
            if inst.vpp_depths():
                yield inst


def _ep_overlap_options(
    opts: list[Option], model: ModelSpec, world: int, counter: PruneCounter
) -> tuple[list[Option], list[Option]]:
    """The options Megatron's EP-communication overlap can run (``--overlap-moe-expert-parallel-comm``,
    export rule ``rule_ep_overlap_requirements``; TransformerConfig at core_v0.16.0): EP > 1 and no full
    recompute of any method; no ``moe`` recompute module either (refused by core_v0.19's check, kept out
    here so a plan runs on both). With PP > 1 it needs virtual stages, so the plain 1F1B instance keeps only
    whole-cluster stages (a single-stage plan), and none for a model with an MTP layer (which needs PP > 1).
    Returns (options for interleaved instances, options for the plain instance), each indexed from 0."""

    def runs(o: Option) -> bool:
        spec = parse_recompute(o.recompute)
        return o.cfg.ep > 1 and spec.granularity != "full" and "moe" not in spec.modules

    ok = [o for o in opts if runs(o)]
    counter.add("ep_overlap", len(opts) - len(ok))
    whole = [o for o in ok if o.devices == world] if model.mtp_num_layers == 0 else []

    def indexed(xs: list[Option]) -> list[Option]:
        return [replace(o, index=i) for i, o in enumerate(xs)]

    return indexed(ok), indexed(whole)


def vpp_lead(model: ModelSpec) -> int | None:
    """How many leading decoder layers differ in kind from the rest, if interleaving may be searched.

    The cost model prices a stage from the kinds of its contiguous layer range ``[s, e)``; under an
    interleaved schedule the rank really holds ``vpp`` chunks spread over the model (the canonical
    chunking, :func:`hapmoe_milp.export.common.plan_chunks`). The two agree when the decoder layers are
    one kind after a leading block of ``a`` layers that fits in the first rank's first chunk (then MTP
    layers, always in the last rank's last chunk): e.g. DeepSeek-V3's 3 dense layers, ``a = 3``. Returns
    ``a`` (0 for a uniform model), or None when the pattern is more mixed (no interleaving searched).
    """
    dec = [k for k in model.layer_kinds if k != "mtp"]
    if not dec:
        return None
    tail = dec[-1]
    a = len(dec)
    while a > 0 and dec[a - 1] == tail:
        a -= 1
    if a and len(set(dec[:a])) > 1:
        return None
    return a


def group_key(o: Option, family: Family) -> tuple:
    """Family rules that tie stages together.

    megatron: one mesh shape and one recompute setting for every stage (Megatron's recompute flags are
    global); hetero: FlagScale's same CP everywhere and EP on in all meshes or none.
    """
    if family == "megatron":
        return ("cfg", o.cfg, o.recompute)
    return ("cp-ep", o.cfg.cp, o.cfg.ep > 1)


def groups(inst: Instance) -> dict[tuple, list[Option]]:
    out: dict[tuple, list[Option]] = {}
    for o in inst.options:
        out.setdefault(group_key(o, inst.family), []).append(o)
    return dict(sorted(out.items(), key=lambda kv: repr(kv[0])))


def group_keys(inst: Instance) -> list[tuple]:
    return list(groups(inst))


def in_group(o: Option, key: tuple) -> bool:
    if key[0] == "cfg":
        return o.cfg == key[1] and o.recompute == key[2]
    return o.cfg.cp == key[1] and (o.cfg.ep > 1) == key[2]


def aligned(start: int, g: int, node: int) -> bool:
    """A stage's device block must not straddle nodes (TP/ETP stay inside a node): a block smaller than
    a node sits inside one node, a larger one starts on a node boundary."""
    if g <= node:
        return start // node == (start + g - 1) // node
    return start % node == 0


__all__ = [
    "ATTRS",
    "Instance",
    "Option",
    "StageEval",
    "aligned",
    "build_instances",
    "build_options",
    "group_key",
    "group_keys",
    "groups",
    "in_flight",
    "in_group",
    "micro_batch_steps",
    "search_levels",
    "vpp_lead",
]
