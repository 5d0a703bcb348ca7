"""Baseline planners on the same cost model and plan types, so comparisons are like for like.

HAPMoE (reference/papers.md §1.7) compares against three kinds of planner on heterogeneous MoE runs. Each
one here is a planner over *our* cost model: it chooses a plan its own way and is then scored with the
same closed-form :func:`~hapmoe_milp.cost.estimate.estimate` our solvers optimise. So a ratio between a
baseline and our plan measures the planning, not a difference between two cost models.

- :func:`megatron_uniform` ("MI"): the best plan upstream Megatron-LM expresses without a pipeline
  layout, by grid search (stronger than the hand tuning the paper's MI stands for).
- :func:`metis_style`: Metis's planner (reference §3): per-stage (DP, TP), layers split in proportion to
  stage speed, MoE-unaware (EP/ETP frozen at the best homogeneous value, EP traffic invisible to its
  estimator); scored truthfully afterwards.
- :func:`hetermoe_style`: HeterMoE's zebra parallelism (reference §2): attention on the faster device
  type, experts on the slower one, with Asym-EA. This lies *outside* our plan space, so it is priced by
  a small model built from the cost model's pieces and carried by a proxy plan (see its docstring).

:func:`compare_against` runs our planner next to the baselines and reports HAPMoE Table 2 ratios.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hapmoe_milp.config import ParallelConfig, Recompute, Settings
from hapmoe_milp.cost.estimate import Estimate, estimate, plan_stage_totals
from hapmoe_milp.cost.model import OVERHEAD_TP1, CostModel
from hapmoe_milp.cost.primitives import BF16, gemm_time, memory_time
from hapmoe_milp.errors import HapmoeError, PlanError
from hapmoe_milp.plan import Plan, Stage, check_config, check_plan
from hapmoe_milp.search.solution import Solution
from hapmoe_milp.space import configs, stage_sizes
from hapmoe_milp.specs.cluster import ClusterSpec, NodeGroup
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.model import ModelSpec

log = logging.getLogger(__name__)

BASELINES = ("megatron", "metis", "hetermoe")
SOLVER_NAMES = {"megatron": "megatron-uniform", "metis": "metis", "hetermoe": "hetermoe"}
_ALIASES = {
    "megatron": "megatron",
    "megatron-uniform": "megatron",
    "mi": "megatron",
    "metis": "metis",
    "metis-style": "metis",
    "hetermoe": "hetermoe",
    "hetermoe-style": "hetermoe",
}
_REC_ORDER: tuple[Recompute, ...] = ("none", "selective", "full")


# ------------------------------------------------------------------------------------------ helpers
def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _make_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    family: str,
    stages: Sequence[Stage],
    vpp: int = 1,
) -> Plan:
    return Plan(
        model=model.name,
        cluster=cluster.name,
        family=family,  # type: ignore[arg-type]
        stages=tuple(stages),
        global_batch_size=settings.global_batch_size,
        seq_length=settings.seq_length,
        micro_batch_size=settings.micro_batch_size,
        vpp=vpp,
        precision=settings.precision,
        imbalance=settings.imbalance,
        dispatcher=settings.dispatcher,
    )


def _valid(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> bool:
    try:
        check_plan(plan, model, cluster)
    except PlanError:
        return False
    return True


def _infeasible(name: str, t0: float, message: str, **stats: Any) -> Solution:
    return Solution(
        name, "infeasible", None, math.inf, math.nan, time.perf_counter() - t0, message=message, stats=dict(stats)
    )


def _finish(
    name: str,
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    plan: Plan,
    t0: float,
    message: str,
    stats: dict[str, Any],
) -> Solution:
    """Score ``plan`` truthfully (fresh cost model, real settings) and attach prediction + certificate."""
    check_plan(plan, model, cluster)
    est = estimate(model, cluster, plan, settings)
    sol = Solution(
        name,
        "feasible",
        plan,
        est.iteration_time_s,
        math.nan,
        time.perf_counter() - t0,
        message=message,
        stats={"fits": est.fits, "maps_to_plan": True, **stats},
    )
    return replace(sol, plan=plan.with_predicted(est.to_dict(), sol.certificate()))


def _sub_cluster(cluster: ClusterSpec, did: str) -> ClusterSpec:
    groups: tuple[NodeGroup, ...] = tuple(g for g in cluster.groups if g.device.id == did)
    return replace(cluster, name=f"{cluster.name}[{did}]", groups=groups)


# ------------------------------------------------------------------------------------------ MI
def megatron_uniform(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    *,
    vpp: bool = True,
    max_vpp: int = 8,
) -> Solution:
    """The fastest plan upstream Megatron-LM expresses with one mesh shape and no pipeline layout.

    Grid search over (TP, CP, EP, ETP, PP, VPP, recompute) with the whole cluster as the world:
    ``PP`` divides the world, each stage gets ``world/PP`` consecutive ranks in the cluster's group order
    (a stage must not span device types, which is what ``torchrun`` rank order gives a mixed cluster),
    decoder layers are split evenly (Megatron's default needs ``num_layers % PP == 0``; MTP layers go to
    the last stage), one recompute setting for every stage, and VPP needs ``num_layers % (PP*VPP) == 0``
    and ``M % PP == 0``. The fastest plan whose memory fits wins. Recompute levels are tried cheapest
    first per mesh because recomputation only ever adds time. This is HAPMoE's "MI" baseline, made
    stronger: a grid search instead of a hand-tuned configuration.
    """
    name = SOLVER_NAMES["megatron"]
    t0 = time.perf_counter()
    world = cluster.world_size
    n_dec = model.num_layers
    n_all = len(model.layer_kinds)
    rank_type = [g.device.id for g in cluster.groups for _ in range(g.devices)]
    cm = CostModel(model, cluster, settings)
    best: tuple[float, Plan] | None = None
    tried = 0
    for pp in _divisors(world):
        if pp > n_dec or n_dec % pp:
            continue
        g = world // pp
        types = [rank_type[i * g] for i in range(pp)]
        if any(len(set(rank_type[i * g : (i + 1) * g])) > 1 for i in range(pp)):
            continue
        node = min(cluster.node_size(t) for t in set(types))
        per = n_dec // pp
        bounds = [(i * per, (i + 1) * per) for i in range(pp)]
        bounds[-1] = (bounds[-1][0], n_all)
        for cfg in configs(model, g, node, settings.seq_length):
            if settings.global_batch_size % (cfg.dp * settings.micro_batch_size):
                continue
            m = settings.global_batch_size // (cfg.dp * settings.micro_batch_size)
            vpps = [1]
            if vpp and pp > 1 and m % pp == 0:
                vpps += [v for v in range(2, max_vpp + 1) if per % v == 0]
            for v in vpps:
                for rec in _REC_ORDER:
                    stages = [Stage(types[i], cfg, s, e, rec) for i, (s, e) in enumerate(bounds)]
                    plan = _make_plan(model, cluster, settings, "megatron", stages, v)
                    tried += 1
                    if not _valid(plan, model, cluster):
                        break
                    est = estimate(model, cluster, plan, settings, cost_model=cm)
                    if not est.fits:
                        continue
                    if best is None or est.iteration_time_s < best[0] - 1e-12:
                        best = (est.iteration_time_s, plan)
                    break  # costlier recompute levels are only slower
    if best is None:
        return _infeasible(name, t0, f"no uniform Megatron plan fits ({tried} candidates)", candidates=tried)
    plan = best[1]
    msg = (
        f"grid search: PP{plan.pp} x {plan.stages[0].cfg.label()} VPP{plan.vpp} recompute={plan.stages[0].recompute}, "
        f"even layer split, {tried} candidates"
    )
    return _finish(name, model, cluster, settings, plan, t0, msg, {"candidates": tried})


# ------------------------------------------------------------------------------------------ Metis
class MoEUnawareCostModel(CostModel):
    """Metis's view of an MoE layer: per-layer times as profiled on one device/TP group, so the EP
    dispatch/combine traffic is invisible to its estimator (reference §3.4 has no EP term). Memory is
    unaffected (dispatch buffers are activations), so only the plan *choice* changes."""

    def _ep_comm(self, dev: DeviceSpec, did: str, cfg: ParallelConfig, ts: float) -> float:
        return 0.0


def _partitions(total: int, sizes: Sequence[int], max_parts: int) -> list[tuple[int, ...]]:
    """Non-increasing tuples of allowed sizes summing to ``total`` with at most ``max_parts`` parts."""
    out: list[tuple[int, ...]] = []
    desc = sorted(set(sizes), reverse=True)

    def rec(rem: int, cap: int, acc: tuple[int, ...]) -> None:
        if rem == 0:
            out.append(acc)
            return
        if len(acc) >= max_parts:
            return
        for s in desc:
            if s <= cap and s <= rem:
                rec(rem - s, s, (*acc, s))

    rec(total, total, ())
    return out


def _fixed_expert_layout(
    model: ModelSpec, cluster: ClusterSpec, settings: Settings
) -> tuple[dict[str, tuple[int, int]], str]:
    """EP/ETP per device type "from homogeneous profiling": the best uniform Megatron plan on a
    cluster made of that type alone. FlagScale's "EP on in all meshes or none" is then enforced by
    giving every type the fastest type's value where they disagree."""
    if not model.is_moe:
        return {t: (1, 1) for t in cluster.device_types}, "dense model"
    found: dict[str, tuple[int, int]] = {}
    for did in cluster.device_types:
        sub = _sub_cluster(cluster, did)
        sol = megatron_uniform(model, sub, settings, vpp=False)
        if sol.plan is None and not settings.optimizer_offload:
            sol = megatron_uniform(model, sub, replace(settings, optimizer_offload=True), vpp=False)
        if sol.plan is not None:
            c = sol.plan.stages[0].cfg
            found[did] = (c.ep, c.etp)
    note = "homogeneous profiling per type"
    if not found:
        sol = megatron_uniform(model, cluster, settings, vpp=False)
        if sol.plan is not None:
            c = sol.plan.stages[0].cfg
            ref = (c.ep, c.etp)
            note = "no type fits alone; EP/ETP of the uniform plan on the whole cluster"
        else:
            ref = (math.gcd(model.num_experts or 1, min(cluster.node_size(t) for t in cluster.device_types)), 1)
            note = "no uniform plan fits; EP = experts within a node"
        return {t: ref for t in cluster.device_types}, note
    fastest = max(found, key=lambda t: cluster.device(t).dense_peak_tflops)
    out: dict[str, tuple[int, int]] = {}
    for did in cluster.device_types:
        val = found.get(did, found[fastest])
        if (val[0] > 1) != (found[fastest][0] > 1):
            val = found[fastest]
        out[did] = val
    return out, note


def _stage_cfg(
    model: ModelSpec, g: int, node: int, tp: int, cp: int, ep0: int, etp0: int, seq: int
) -> ParallelConfig | None:
    """The stage mesh Metis would run: its (DP, TP), the shared CP, and the frozen EP/ETP clamped to
    what divides the stage (EP stays on if it was on)."""
    if g % (tp * cp):
        return None
    etp = max(v for v in _pow2_upto(min(etp0, g, node)))
    eps = [d for d in _divisors(ep0) if g % (d * etp) == 0 and (model.num_experts or 1) % d == 0]
    ep = max(eps) if eps else 1
    if model.is_moe and ep0 > 1 and ep == 1:
        return None
    cfg = ParallelConfig(tp=tp, cp=cp, dp=g // (tp * cp), ep=ep, etp=etp)
    try:
        check_config(cfg, model, None, node, "")
    except PlanError:
        return None
    if cp > 1 and seq % (2 * cp):
        return None
    return cfg


def _largest_remainder(n: int, weights: Sequence[float]) -> list[int]:
    """Integer shares of ``n`` proportional to ``weights``, each at least 1 (needs n >= len(weights))."""
    k = len(weights)
    tot = sum(weights)
    raw = [n * w / tot for w in weights]
    base = [max(1, math.floor(r)) for r in raw]
    while sum(base) > n:
        i = max((j for j in range(k) if base[j] > 1), key=lambda j: base[j] - raw[j])
        base[i] -= 1
    order = sorted(range(k), key=lambda j: -(raw[j] - base[j]))
    i = 0
    while sum(base) < n:
        base[order[i % k]] += 1
        i += 1
    return base


@dataclass(frozen=True)
class _MetisCandidate:
    planned_s: float
    plan: Plan


def _metis_balance(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    cm: CostModel,
    devices: Sequence[str],
    cfgs: Sequence[ParallelConfig],
) -> tuple[Plan | None, list[float]]:
    """Metis's LayerComputeBalancer: layers in proportion to stage speed (1 / profiled per-layer time),
    with its memory correction ``c * (capacity/demand) * 0.9`` for overflowing stages (3 attempts).
    A stage still over memory switches to full recompute (FlagScale's per-stage choice) and the split
    is redone with its slower speed. Returns the plan (None if it never fits) and the memory slack per
    stage, which drives the intra-stage (DP, TP) conversion."""
    n = len(model.layer_kinds)
    s_count = len(cfgs)
    if s_count > n:
        return None, []
    kinds = model.layer_kinds
    rec: list[Recompute] = ["none"] * s_count
    dp0 = cfgs[0].dp
    step = dp0 * settings.micro_batch_size
    slack: list[float] = [0.0] * s_count
    for _flip in range(s_count + 1):
        speed = []
        for i, (d, c) in enumerate(zip(devices, cfgs, strict=True)):
            b = step // c.dp
            per = sum(cm.layer(d, c, b, k, rec[i]).fwd + cm.layer(d, c, b, k, rec[i]).bwd for k in kinds) / n
            speed.append(1.0 / per)
        cap = list(speed)
        plan = None
        for _attempt in range(4):
            counts = _largest_remainder(n, cap)
            stages, pos = [], 0
            for i, (d, c) in enumerate(zip(devices, cfgs, strict=True)):
                stages.append(Stage(d, c, pos, pos + counts[i], rec[i]))
                pos += counts[i]
            plan = _make_plan(model, cluster, settings, "hetero", stages)
            totals = plan_stage_totals(cm, plan)
            slack = [t.capacity - t.memory for t in totals]
            over = [i for i, t in enumerate(totals) if t.memory > t.capacity]
            if not over:
                return plan, slack
            for i in over:
                cap[i] *= totals[i].capacity / totals[i].memory * 0.9
        flip = [i for i in range(s_count) if slack[i] < 0 and rec[i] == "none"]
        if not flip:
            break
        for i in flip:
            rec[i] = "full"
    return None, slack


def _metis_intra(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    cm: CostModel,
    devices: Sequence[str],
    sizes: Sequence[int],
    cp: int,
    fixed: dict[str, tuple[int, int]],
) -> Iterator[Plan]:
    """Metis's IntraStagePlanGenerator: start every stage at pure DP and repeatedly convert the stage
    with the least memory slack ``(dp, tp) -> (dp/2, 2 tp)``; every state is a candidate."""
    tps = [1] * len(sizes)
    seen: set[tuple[int, ...]] = set()
    while tuple(tps) not in seen:
        seen.add(tuple(tps))
        cfgs: list[ParallelConfig] = []
        for d, g, tp in zip(devices, sizes, tps, strict=True):
            ep0, etp0 = fixed[d]
            c = _stage_cfg(model, g, cluster.node_size(d), tp, cp, ep0, etp0, settings.seq_length)
            if c is None:
                break
            cfgs.append(c)
        slack: list[float] = [0.0] * len(sizes)
        ok = len(cfgs) == len(sizes)
        if ok:
            step = cfgs[0].dp * settings.micro_batch_size
            ok = settings.global_batch_size % step == 0 and all(step % c.dp == 0 for c in cfgs)
        if ok:
            plan, slack = _metis_balance(model, cluster, settings, cm, devices, cfgs)
            if plan is not None:
                yield plan
        # convert the stage with the least slack that can still grow its TP; while the meshes break
        # the micro-batch rule, first the stages whose DP does not divide the first stage's
        if ok or len(cfgs) != len(sizes):
            order = sorted(range(len(sizes)), key=lambda i: slack[i] if slack else 0.0)
        else:
            step = cfgs[0].dp * settings.micro_batch_size
            order = sorted(range(len(sizes)), key=lambda i: (step % cfgs[i].dp == 0, -cfgs[i].dp, i))
        grown = False
        for i in order:
            nt = tps[i] * 2
            d = devices[i]
            if (
                nt <= cluster.node_size(d)
                and sizes[i] % (nt * cp) == 0
                and model.num_attention_heads % nt == 0
                and (model.groups % nt == 0 or nt % model.groups == 0)
            ):
                tps[i] = nt
                grown = True
                break
        if not grown:
            return


def metis_style(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    *,
    max_stages: int = 8,
    max_stages_per_type: int = 4,
) -> Solution:
    """Metis (USENIX ATC'24) as HAPMoE adapts it: heterogeneous PP/DP/TP search, MoE-unaware.

    - inter-stage: every order of the device types; each type's devices cut into stages of allowed
      sizes (powers of two up to a node, whole nodes; non-increasing, <= ``max_stages_per_type``),
      all devices used, at most ``max_stages`` stages (Metis bounds its permutations the same way);
    - intra-stage: Metis's pure-DP-first conversion towards TP on the stage with least memory slack;
      no CP (Metis has none, and FlagScale's heterogeneous meshes reject it);
    - layers: Metis's speed-proportional balancer with its memory correction (not an optimal split);
    - MoE-unaware: EP/ETP frozen at the best homogeneous value per type ("EP/TPE fixed from
      homogeneous profiling", HAPMoE §5), and plans are *chosen* with :class:`MoEUnawareCostModel`
      (EP all-to-all invisible, as in Metis's estimator);
    - hetero family semantics: ``(dp0*mbs) % dp_i == 0``, EP on in every stage or none, no VPP;
      recompute is none, or full on a stage that cannot fit otherwise.
    The chosen plan is then scored truthfully with :func:`estimate`.
    """
    name = SOLVER_NAMES["metis"]
    t0 = time.perf_counter()
    fixed, note = _fixed_expert_layout(model, cluster, settings)
    planning = MoEUnawareCostModel(model, cluster, settings)
    inv = cluster.inventory
    per_type: dict[str, list[tuple[int, ...]]] = {
        t: _partitions(inv[t], stage_sizes(cluster, t), max_stages_per_type) for t in cluster.device_types
    }
    n = len(model.layer_kinds)
    best: _MetisCandidate | None = None
    considered = 0
    for order in itertools.permutations(cluster.device_types):
        for parts in itertools.product(*(per_type[t] for t in order)):
            devices = [t for t, p in zip(order, parts, strict=True) for _ in p]
            sizes = [g for p in parts for g in p]
            if not sizes or len(sizes) > min(max_stages, n):
                continue
            # CP = 1: FlagScale's heterogeneous meshes reject context parallelism (as in our hetero family)
            for plan in _metis_intra(model, cluster, settings, planning, devices, sizes, 1, fixed):
                if not _valid(plan, model, cluster):
                    continue
                considered += 1
                est = estimate(model, cluster, plan, settings, cost_model=planning)
                if est.fits and (best is None or est.iteration_time_s < best.planned_s - 1e-12):
                    best = _MetisCandidate(est.iteration_time_s, plan)
    if best is None:
        return _infeasible(name, t0, f"no Metis-style plan fits ({considered} candidates; EP/ETP: {note})")
    p = best.plan
    eps = ",".join(f"{d}:EP{e}/ETP{t}" for d, (e, t) in fixed.items())
    msg = (
        f"{p.pp} stages, speed-proportional layers {p.layer_counts()}, EP/ETP frozen ({eps}; {note}); "
        f"chosen with EP traffic invisible (planned {best.planned_s:.4g} s), scored with the full cost model"
    )
    return _finish(name, model, cluster, settings, p, t0, msg, {"candidates": considered, "planned_s": best.planned_s})


# ------------------------------------------------------------------------------------------ HeterMoE
@dataclass(frozen=True)
class ZebraPlan:
    """One zebra-parallel layout (ZP + DP, as the HeterMoE prototype implements it)."""

    attention_device: str
    expert_device: str
    zp_groups: int  # data-parallel replicas of the ZP group
    attention_devices: int  # per group (HeterMoE's M)
    expert_devices: int  # per group (N)
    attention_tp: int
    ep: int
    etp: int
    edp: int
    micro_batches: int  # R zebra micro-batches per accumulation step
    accumulation_steps: int
    offloaded_experts: int  # Asym-EA: (layer, expert) units moved to the attention devices, of E*L
    recompute: Recompute
    iteration_time_s: float
    step_time_s: float
    sync_s: float
    attention_memory_gib: float
    expert_memory_gib: float
    attention_capacity_gib: float
    expert_capacity_gib: float
    layer_times: dict[str, float]

    @property
    def fits(self) -> bool:
        return (
            self.attention_memory_gib <= self.attention_capacity_gib
            and self.expert_memory_gib <= self.expert_capacity_gib
        )

    def label(self) -> str:
        return (
            f"{self.zp_groups}x ZP[{self.attention_devices} {self.attention_device} attention TP{self.attention_tp} | "
            f"{self.expert_devices} {self.expert_device} experts EP{self.ep} ETP{self.etp} EDP{self.edp}] "
            f"R={self.micro_batches} x{self.accumulation_steps} Asym-EA {self.offloaded_experts} expert-layers, "
            f"recompute={self.recompute}"
        )

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["fits"] = self.fits
        return d


def _expert_gemms(cm: CostModel, did: str, rows_per_expert: float, local: int, etp: int) -> float:
    """Forward of ``local`` experts with ``rows_per_expert`` routed rows each at width F/ETP; mirrors the
    routed-expert term of :meth:`CostModel._layer` (two grouped GEMMs + the activation function)."""
    m, dev = cm.model, cm.device(did)
    fe, h, prec = m.expert_ffn, m.hidden_size, cm.settings.precision
    t = gemm_time(dev, rows_per_expert, (m.glu - 1) * fe / etp, h, prec, groups=local)
    t += gemm_time(dev, rows_per_expert, h, fe / etp, prec, groups=local)
    t += memory_time(dev, 3 * rows_per_expert * local * fe / etp * BF16)
    return t


def _largest_ep(experts: int, n: int) -> int:
    return max(d for d in _divisors(n) if experts % d == 0)


@dataclass(frozen=True)
class _ZebraSides:
    """f-independent pieces of one ZP layout, per layer and zebra micro-batch (seconds / bytes)."""

    a_f: float  # attention side, forward (incl. router, permute, norms, TP comm, shared experts)
    a_b: float
    x_f: float  # all of the layer's expert work if it ran on the attention devices
    e_f: float  # all expert work on the expert devices (incl. ETP comm)
    e_b: float
    etp_comm: float
    cross: float  # one dispatch (or combine) transfer of all routed tokens, seconds
    cross_latency: float
    act_a: float  # stored bytes per layer and micro-batch, attention device (without offloaded experts)
    act_x: float  # ... extra on an attention device if all experts ran there (scaled by f)
    act_e: float  # ... on an expert device (scaled by 1-f)
    work_e: float  # transient bytes on an expert device while a layer runs (scaled by 1-f)
    dense_a_f: float  # dense (non-MoE) layers run entirely on the attention devices
    dense_a_b: float
    dense_act: float


def hetermoe_style(model: ModelSpec, cluster: ClusterSpec, settings: Settings) -> Solution:
    """HeterMoE (arXiv 2504.03871): zebra parallelism with Asym-EA, priced with our cost model's pieces.

    What is modelled: a ZP group is ``M`` attention devices of the faster type (faster attention per
    device, by the cost model) and ``N`` expert devices of the other type; attention, router, norms,
    shared experts, embedding and head run data-parallel (optionally TP) on the attention devices; the
    routed experts are spread over the expert devices (EP x ETP x EDP); ZP groups are data-parallel
    replicas (ZP + DP, as the prototype). Per layer, ``R`` micro-batches circulate through four
    resources -- attention compute, dispatch link, expert compute, combine link -- so a layer takes
    ``max(R * bottleneck, one micro-batch's round trip)`` forward and again backward (a closed loop with
    ``R`` jobs; dispatch and combine use opposite directions of the cross-type link, so zebra overlap
    hides all but that). Asym-EA moves ``u`` (layer, expert) units to the attention devices, scaling the
    expert work and cross traffic by ``1 - u/(E*L)`` and adding that share to the attention devices,
    bounded by both sides' memory (HeterMoE's alpha/beta). Zebra's order runs all ``R`` forwards
    before the backwards, so activations of ``R`` micro-batches x all layers are held per step.

    What is approximated (also in ``Solution.message``):
    - the layer-internal attention/expert split is not a :class:`Plan`; the returned plan is a *proxy*
      (one stage on the attention devices with the attention mesh), valid for ``check_plan`` but with
      its prediction overridden by the zebra model. ``objective_s`` is the zebra model's time, not an
      :func:`estimate` of the proxy (``stats['maps_to_plan']`` is False);
    - attention-side times are the cost model's layer time with all experts local minus the routed
      expert GEMMs (which are re-priced with the same formula on the expert devices);
    - Asym-EA offload is spread evenly over layers (the paper's per-layer ``o_l`` averaged), and the
      offloaded experts' token exchange among attention devices is assumed hidden (intra-type links);
    - MTP layers are priced as MoE layers; only two device types are supported (else, and on
      homogeneous clusters, the Megatron-uniform plan is returned).
    """
    name = SOLVER_NAMES["hetermoe"]
    t0 = time.perf_counter()
    types = cluster.device_types
    if len(types) != 2 or not model.is_moe:
        sol = megatron_uniform(model, cluster, settings)
        why = "homogeneous cluster" if len(types) == 1 else ("dense model" if not model.is_moe else ">2 device types")
        return replace(
            sol, solver=name, message=f"{why}: zebra parallelism does not apply; Megatron-uniform plan. " + sol.message
        )
    cm = CostModel(model, cluster, settings)
    speed = {t: _attention_probe(cm, t) for t in types}
    att, exp = sorted(types, key=lambda t: speed[t])
    best: ZebraPlan | None = None
    evaluated = 0
    for zp in _zebra_layouts(model, cluster, settings, att, exp):
        evaluated += 1
        if zp.fits and (best is None or zp.iteration_time_s < best.iteration_time_s - 1e-12):
            best = zp
    if best is None:
        return _infeasible(name, t0, f"no zebra layout fits ({evaluated} candidates)", candidates=evaluated)
    proxy = _zebra_proxy(model, cluster, settings, best)
    devices = best.zp_groups * (best.attention_devices + best.expert_devices)
    tokens = settings.global_batch_size * settings.seq_length
    peak = (
        cluster.device(att).dense_peak_tflops * best.zp_groups * best.attention_devices
        + cluster.device(exp).dense_peak_tflops * best.zp_groups * best.expert_devices
    )
    flops = model.flops_per_token(settings.seq_length) * tokens
    proxy_est = estimate(model, cluster, proxy, settings)
    t = best.iteration_time_s
    predicted = {
        "iteration_time_s": t,
        "tokens_per_s": tokens / t,
        "tokens_per_s_per_device": tokens / t / devices,
        "model_tflops_per_device": flops / t / devices / 1e12,
        "mfu": flops / (t * peak * 1e12),
        "fits": best.fits,
        "devices": devices,
        "zebra": best.to_dict(),
        "zebra_label": best.label(),
        "proxy": True,
        "proxy_estimate": {"iteration_time_s": proxy_est.iteration_time_s, "fits": proxy_est.fits},
    }
    msg = (
        f"zebra model (outside the plan space): {best.label()}; the plan is a proxy (attention mesh on "
        f"{att}) whose prediction is overridden; approximated: attention/expert split by differencing the "
        f"layer cost, Asym-EA averaged over layers, offloaded experts' intra-type traffic hidden"
    )
    sol = Solution(
        name,
        "feasible",
        proxy,
        t,
        math.nan,
        time.perf_counter() - t0,
        message=msg,
        stats={"fits": best.fits, "maps_to_plan": False, "candidates": evaluated, "mfu": predicted["mfu"]},
    )
    return replace(sol, plan=proxy.with_predicted(predicted, sol.certificate()))


def _attention_probe(cm: CostModel, did: str) -> float:
    """Seconds of one MoE layer's attention side for one sample on one device (fwd + bwd)."""
    s = _zebra_sides(
        cm, did, did, tp=1, b=1, tokens=cm.settings.seq_length, ep=1, etp=1, edp=1, m_att=1, n_exp=1, recompute="none"
    )
    return s.a_f + s.a_b


def _zebra_sides(
    cm: CostModel,
    att: str,
    exp: str,
    *,
    tp: int,
    b: int,
    tokens: float,
    ep: int,
    etp: int,
    edp: int,
    m_att: int,
    n_exp: int,
    recompute: Recompute,
) -> _ZebraSides:
    m, st = cm.model, cm.settings
    h, k, E = m.hidden_size, m.moe_router_topk, m.num_experts or 1
    imb = st.imbalance
    glu_out = 2 if m.swiglu else 1
    fe = m.expert_ffn
    cfg = ParallelConfig(tp=tp, dp=1, ep=1, etp=1)
    full = recompute == "full"
    # attention side: the whole MoE layer with every expert local (EP = ETP = 1, so no EP traffic), minus
    # the routed-expert GEMMs, which the zebra model places elsewhere
    lay = cm.layer(att, cfg, b, "moe", recompute)
    t_rank = b * st.seq_length
    ts = t_rank / tp
    rpe_local = k * ts / E  # rows per expert on this rank with every expert local
    g_local = imb * _expert_gemms(cm, att, rpe_local, E, 1)
    a_f = lay.fwd - g_local
    a_b = lay.bwd - 2 * g_local - (g_local if full else 0.0)
    act_routed_local = k * ts * imb * (2 * h + 2 * glu_out * fe + 2 * fe)
    act_a = lay.act - (0.0 if full else act_routed_local)
    # all of the layer's expert work on the attention devices (EP over them, replicas share tokens)
    ep_x = _largest_ep(E, m_att)
    edp_x = m_att // ep_x
    rpe_x = k * tokens / (E * edp_x)
    x_f = imb * _expert_gemms(cm, att, rpe_x, E // ep_x, 1)
    rows_x = k * tokens / (ep_x * edp_x) * imb
    act_x = rows_x * (2 * h if full else (2 * h + 2 * glu_out * fe + 2 * fe))
    # expert side
    rpe = k * tokens / (E * edp)
    e_g = imb * _expert_gemms(cm, exp, rpe, E // ep, etp)
    rows_e = k * tokens / (ep * edp)
    etp_comm = 0.0
    if etp > 1:
        size = rows_e * h * BF16
        etp_comm = cm.collective(cm.device(exp), exp, "all_gather", size, etp, etp) + cm.collective(
            cm.device(exp), exp, "reduce_scatter", size, etp, etp
        )
    e_f = e_g + etp_comm
    e_b = 2 * e_g + etp_comm + (e_f if full else 0.0)
    act_e = rows_e * imb * (2 * h if full else (2 * h + 2 * glu_out * fe / etp + 2 * fe / etp))
    # working set while a layer runs: its full activations plus dispatch/combine buffers
    work_e = rows_e * imb * (2 * h + 2 * glu_out * fe / etp + 2 * fe / etp) + 2 * rows_e * imb * h * BF16
    # cross-type dispatch (or combine): all routed tokens between the two sides, bipartite
    bw = cm.cluster.cross.bandwidth(cm.device(att), cm.device(exp)) * 1e9
    total = k * tokens * h * BF16
    cross = max(total / m_att, total / n_exp) / bw
    lat = cm.cluster.cross.latency_us * 1e-6
    dense_f = dense_b = dense_act = 0.0
    if "dense" in m.layer_kinds:
        dl = cm.layer(att, cfg, b, "dense", recompute)
        dense_f, dense_b, dense_act = dl.fwd, dl.bwd, dl.act
    return _ZebraSides(
        a_f, a_b, x_f, e_f, e_b, etp_comm, cross, lat, act_a, act_x, act_e, work_e, dense_f, dense_b, dense_act
    )


def _zebra_layouts(
    model: ModelSpec, cluster: ClusterSpec, settings: Settings, att: str, exp: str
) -> Iterator[ZebraPlan]:
    cm = CostModel(model, cluster, settings)
    st = settings
    inv = cluster.inventory
    E = model.num_experts or 1
    L_moe = sum(1 for kd in model.layer_kinds if kd != "dense")
    L_dense = len(model.layer_kinds) - L_moe
    b = st.micro_batch_size
    gib = 1024**3
    cap_a, cap_e = cm.capacity(att), cm.capacity(exp)
    p_moe = model.layer_params("moe")
    p_dense = model.layer_params("dense") if L_dense else {"tp": 0, "replicated": 0, "expert": 0}
    for G in _divisors(math.gcd(inv[att], inv[exp])):
        M, N = inv[att] // G, inv[exp] // G
        for tp in _pow2_upto(min(M, cluster.node_size(att))):
            if M % tp or model.num_attention_heads % tp or (model.groups % tp and tp % model.groups):
                continue
            dp_a = M // tp
            ep_x = _largest_ep(E, M)
            for ep in (d for d in _divisors(N) if E % d == 0):
                for etp in _pow2_upto(min(N // ep, cluster.node_size(exp))):
                    if N % (ep * etp):
                        continue
                    edp = N // (ep * etp)
                    for R in _pow2_upto(min(st.global_batch_size, 32)):
                        per_step = G * dp_a * b * R
                        if st.global_batch_size % per_step:
                            continue
                        K = st.global_batch_size // per_step
                        tokens = dp_a * b * st.seq_length  # per group micro-batch
                        for rec in ("none", "full"):
                            sides = _zebra_sides(
                                cm,
                                att,
                                exp,
                                tp=tp,
                                b=b,
                                tokens=tokens,
                                ep=ep,
                                etp=etp,
                                edp=edp,
                                m_att=M,
                                n_exp=N,
                                recompute=rec,
                            )  # type: ignore[arg-type]
                            yield from _zebra_best_offload(
                                cm,
                                model,
                                settings,
                                att,
                                exp,
                                sides,
                                G=G,
                                M=M,
                                N=N,
                                tp=tp,
                                dp_a=dp_a,
                                ep=ep,
                                etp=etp,
                                edp=edp,
                                ep_x=ep_x,
                                R=R,
                                K=K,
                                rec=rec,
                                L_moe=L_moe,
                                L_dense=L_dense,
                                p_moe=p_moe,
                                p_dense=p_dense,
                                cap_a=cap_a,
                                cap_e=cap_e,
                                gib=gib,
                            )


def _zebra_best_offload(
    cm: CostModel,
    model: ModelSpec,
    st: Settings,
    att: str,
    exp: str,
    s: _ZebraSides,
    *,
    G: int,
    M: int,
    N: int,
    tp: int,
    dp_a: int,
    ep: int,
    etp: int,
    edp: int,
    ep_x: int,
    R: int,
    K: int,
    rec: str,
    L_moe: int,
    L_dense: int,
    p_moe: dict[str, int],
    p_dense: dict[str, int],
    cap_a: float,
    cap_e: float,
    gib: int,
) -> Iterator[ZebraPlan]:
    """Asym-EA: the fastest offload ``u`` of (layer, expert) units that both sides can hold."""
    E = model.num_experts or 1
    units = E * L_moe
    b = st.micro_batch_size
    dev_a, dev_e = cm.device(att), cm.device(exp)
    cfg_a = ParallelConfig(tp=tp, dp=dp_a * G)
    first = cm.first_edge(att, cfg_a, b)
    last = cm.last_edge(att, cfg_a, b)
    edge_f = R * (first.fwd + last.fwd)
    edge_b = R * (first.bwd + last.bwd)
    dense_local = L_moe * (p_moe["tp"] / tp + p_moe["replicated"]) + L_dense * (
        p_dense["tp"] / tp + p_dense["replicated"]
    )
    # transient working set: the attention layer's (the cost model's, all experts local) plus the
    # logits of the head, and the framework overhead
    fixed_a = cm.fixed_memory(att, ParallelConfig(tp=tp, dp=1), b) + last.work

    # weights, gradient RS / param AG and the optimizer step are linear in the parameters a device holds
    # (collectives are priced at the fixed gradient-bucket size), so price both sides once at f = 0 and
    # for all experts, and interpolate
    cfg_ax = ParallelConfig(tp=tp, dp=dp_a * G, ep=ep_x, etp=1)
    cfg_e = ParallelConfig(tp=1, dp=N * G, ep=ep, etp=etp)
    all_x = units * model.expert_params
    a0 = cm.state_and_sync(dev_a, att, cfg_ax, dense_local, 0.0)
    a1 = cm.state_and_sync(dev_a, att, cfg_ax, 0.0, all_x / ep_x)
    e1 = cm.state_and_sync(dev_e, exp, cfg_e, 0.0, all_x / (ep * etp))
    edge = (first.weights + last.weights, first.rs + last.rs, first.ag + last.ag, first.opt + last.opt)

    def side_a(f: float) -> tuple[float, float, float, float]:
        return tuple(x0 + f * x1 + xe for x0, x1, xe in zip(a0, a1, edge, strict=True))  # type: ignore[return-value]

    def side_e(f: float) -> tuple[float, float, float, float]:
        return tuple((1 - f) * x for x in e1)  # type: ignore[return-value]

    def mem_a(f: float) -> float:
        return side_a(f)[0] + R * (L_moe * (s.act_a + f * s.act_x) + L_dense * s.dense_act) + fixed_a

    def mem_e(f: float) -> float:
        return side_e(f)[0] + R * L_moe * (1 - f) * s.act_e + OVERHEAD_TP1 + (1 - f) * s.work_e

    # feasible offload interval: memory is linear in f, rising on the attention side, falling on the
    # expert side (HeterMoE's alpha and beta)
    lo_f = _linear_root(mem_e, cap_e, rising=False)
    hi_f = _linear_root(mem_a, cap_a, rising=True)
    if lo_f is None or hi_f is None or lo_f > hi_f:
        return
    u_lo, u_hi = math.ceil(lo_f * units - 1e-9), math.floor(hi_f * units + 1e-9)
    if units == 0:
        u_lo, u_hi = 0, 0

    def at(u: int) -> ZebraPlan | None:
        f = u / units if units else 0.0
        m_a, m_e = mem_a(f), mem_e(f)
        if m_a > cap_a or m_e > cap_e:
            return None
        af = s.a_f + f * s.x_f
        ab = s.a_b + f * 2 * s.x_f + (f * s.x_f if rec == "full" else 0.0)
        ef = (1 - f) * s.e_f
        eb = (1 - f) * s.e_b
        c = (1 - f) * s.cross + (s.cross_latency if f < 1 else 0.0)
        fwd_layer = max(R * max(af, ef, c), af + c + ef + c)
        bwd_layer = max(R * max(ab, eb, c), ab + c + eb + c)
        step_f = L_moe * fwd_layer + L_dense * R * s.dense_a_f + edge_f
        step_b = L_moe * bwd_layer + L_dense * R * s.dense_a_b + edge_b
        step = step_f + step_b
        sync = 0.0
        for _w, rs, ag, opt in (side_a(f), side_e(f)):
            y = (max(0.0, rs - step_b) if st.overlap_grad_reduce else rs) + (
                max(0.0, ag - step_f) if st.overlap_param_gather else ag
            )
            sync = max(sync, y + opt)
        t_iter = K * step + sync
        return ZebraPlan(
            attention_device=att,
            expert_device=exp,
            zp_groups=G,
            attention_devices=M,
            expert_devices=N,
            attention_tp=tp,
            ep=ep,
            etp=etp,
            edp=edp,
            micro_batches=R,
            accumulation_steps=K,
            offloaded_experts=u,
            recompute=rec,  # type: ignore[arg-type]
            iteration_time_s=t_iter,
            step_time_s=step,
            sync_s=sync,
            attention_memory_gib=m_a / gib,
            expert_memory_gib=m_e / gib,
            attention_capacity_gib=cap_a / gib,
            expert_capacity_gib=cap_e / gib,
            layer_times={
                "attention_f": af,
                "attention_b": ab,
                "expert_f": ef,
                "expert_b": eb,
                "cross": c,
                "layer_f": fwd_layer,
                "layer_b": bwd_layer,
            },
        )

    # time is piecewise linear and (nearly) convex in the offload share: scan a coarse grid over the
    # feasible interval, then every unit around the best coarse point
    step = max(1, (u_hi - u_lo) // 32)
    best: ZebraPlan | None = None
    for u in [*range(u_lo, u_hi + 1, step), u_hi]:
        r = at(u)
        if r is not None and (best is None or r.iteration_time_s < best.iteration_time_s - 1e-12):
            best = r
    if best is not None and step > 1:
        c0 = best.offloaded_experts
        for u in range(max(u_lo, c0 - step + 1), min(u_hi, c0 + step - 1) + 1):
            r = at(u)
            if r is not None and r.iteration_time_s < best.iteration_time_s - 1e-12:
                best = r
    if best is not None:
        yield best


def _linear_root(fn: Callable[[float], float], cap: float, *, rising: bool) -> float | None:
    """For ``fn`` linear on [0, 1]: the largest f with fn(f) <= cap (rising) or the smallest (falling);
    None when no f in [0, 1] qualifies."""
    y0, y1 = fn(0.0), fn(1.0)
    if rising:
        if y0 > cap:
            return None
        return 1.0 if y1 <= cap else (cap - y0) / (y1 - y0)
    if y1 > cap:
        return None
    return 0.0 if y0 <= cap else (y0 - cap) / (y0 - y1)


def _zebra_proxy(model: ModelSpec, cluster: ClusterSpec, settings: Settings, zp: ZebraPlan) -> Plan:
    """The closest :class:`Plan`: one stage on all attention devices with the attention mesh (TP, DP over
    every ZP group) and EP over them; its own estimate is *not* the zebra time."""
    g = zp.zp_groups * zp.attention_devices
    dp = g // zp.attention_tp
    ep = max(d for d in _divisors(dp) if (model.num_experts or 1) % d == 0) if model.is_moe else 1
    cfg = ParallelConfig(tp=zp.attention_tp, cp=1, dp=dp, ep=ep, etp=1)
    stage = Stage(zp.attention_device, cfg, 0, len(model.layer_kinds), zp.recompute)
    plan = _make_plan(model, cluster, settings, "hetero", [stage])
    check_plan(plan, model, cluster)
    return plan


# ------------------------------------------------------------------------------------------ dispatch
_RUNNERS: dict[str, Callable[[ModelSpec, ClusterSpec, Settings], Solution]] = {
    "megatron": megatron_uniform,
    "metis": metis_style,
    "hetermoe": hetermoe_style,
}


def canonical(name: str) -> str:
    key = _ALIASES.get(name.lower())
    if key is None:
        raise HapmoeError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}", field="--against")
    return key


def run_baseline(name: str, model: ModelSpec, cluster: ClusterSpec, settings: Settings) -> Solution:
    """Run one baseline by name (``megatron``, ``metis``, ``hetermoe`` or their solver names)."""
    return _RUNNERS[canonical(name)](model, cluster, settings)


def _with_offload_fallback(fn: Callable[[], Solution], retry: Callable[[], Solution] | None) -> tuple[Solution, bool]:
    sol = fn()
    if sol.plan is None and retry is not None:
        sol2 = retry()
        if sol2.plan is not None:
            return sol2, True
    return sol, False


def _row(method: str, sol: Solution | None, offload: bool, devices_total: int, **extra: Any) -> dict[str, Any]:
    if sol is None or sol.plan is None:
        return {
            "method": method,
            "solver": sol.solver if sol else method,
            "status": sol.status if sol else "error",
            "iteration_time_s": None,
            "tokens_per_s": None,
            "mfu": None,
            "optimizer_offload": offload,
            "message": sol.message if sol else "",
            **extra,
        }
    pred = sol.plan.predicted
    t = sol.objective_s
    return {
        "method": method,
        "solver": sol.solver,
        "status": sol.status,
        "iteration_time_s": t,
        "tokens_per_s": pred.get("tokens_per_s"),
        "tokens_per_s_per_cluster_device": (pred.get("tokens_per_s") or 0.0) / devices_total,
        "mfu": pred.get("mfu"),
        "devices_used": pred.get("devices"),
        "optimizer_offload": offload,
        "maps_to_plan": sol.stats.get("maps_to_plan", True),
        "fits": pred.get("fits"),
        "wall_s": sol.wall_s,
        "plan": plan_summary(sol.plan),
        "message": sol.message,
        **extra,
    }


def plan_summary(plan: Plan) -> str:
    """One line: stages as ``device xg [TP/CP/DP/EP/ETP] rec layers``."""
    zebra = plan.predicted.get("zebra") if plan.predicted else None
    if zebra:
        return "zebra " + str(plan.predicted.get("zebra_label", "")) + " (proxy plan)"
    parts = []
    for s in plan.stages:
        c = s.cfg
        rec = {"none": "", "selective": " sel", "full": " full"}[s.recompute]
        parts.append(f"{s.device}x{s.devices}[{c.tp}/{c.cp}/{c.dp}/{c.ep}/{c.etp}]{rec}:{s.num_layers}")
    v = f" vpp{plan.vpp}" if plan.vpp > 1 else ""
    return f"{plan.family}{v} " + " | ".join(parts)


def compare_against(
    model: ModelSpec | str,
    cluster: ClusterSpec | str,
    settings: Settings | None = None,
    against: Sequence[str] = BASELINES,
    solver: str = "dp",
    *,
    time_limit: float | None = None,
    optimizer_offload: bool | str = "auto",
) -> dict[str, Any]:
    """Our planner's plan next to each baseline's, HAPMoE Table 2 style (ratios vs Megatron-uniform).

    Ratios: ``throughput`` = tokens/s ratio (all planners process the same ``GBS*S`` tokens, so this is
    the inverse latency ratio), ``mfu`` = MFU ratio (MFU over the peak of the devices a plan uses),
    ``latency`` = iteration-time ratio. Megatron-uniform is always run as the reference. Where a
    baseline fits only with optimizer states offloaded to host memory, it is rerun that way (HAPMoE
    offloads for Mixtral-L on its small clusters) and the row says so; ``optimizer_offload='auto'``
    does the same for our planner.

    Returns a dict: ``model``, ``cluster``, ``devices``, ``settings`` and ``reference`` (plain values);
    ``rows`` (one JSON-safe dict per method, ours first: iteration time, tokens/s, MFU, the three ratios,
    offload flag, ``maps_to_plan``, a one-line plan summary, message); ``notes`` (search gaps: our plan
    slower than an in-space baseline under the same offload setting); ``solutions`` (the
    :class:`Solution` objects, for export -- not JSON-serialisable).
    """
    from hapmoe_milp import api

    m, c = api.resolve(model, cluster)
    st = api.make_settings(m, settings)
    names = [canonical(a) for a in against]
    allow_retry = optimizer_offload == "auto" and not st.optimizer_offload
    if optimizer_offload not in ("auto", None):
        st = replace(st, optimizer_offload=bool(optimizer_offload))
    off = replace(st, optimizer_offload=True)
    rows: list[dict[str, Any]] = []
    sols: dict[str, Solution] = {}
    offl: dict[str, bool] = {}
    for key in ["megatron", *[n for n in names if n != "megatron"]]:
        fn = _RUNNERS[key]
        t = time.perf_counter()
        sol, used_off = _with_offload_fallback(
            lambda fn=fn: fn(m, c, st), (lambda fn=fn: fn(m, c, off)) if allow_retry else None
        )
        log.info("%s on %s x %s: %s in %.1f s", key, m.name, c.name, sol.status, time.perf_counter() - t)
        sols[key], offl[key] = sol, used_off or st.optimizer_offload
    ours: Solution | None
    ours_off = False
    try:
        ours = api.solve(m, c, solver, settings=st, time_limit=time_limit, optimizer_offload=optimizer_offload)
        ours_off = _plan_offloaded(ours, m, c, st)
    except HapmoeError as err:
        ours = Solution(solver, "infeasible", None, math.inf, math.nan, 0.0, message=str(err))
    ref = sols["megatron"]
    world = c.world_size
    ref_t = ref.objective_s if ref.plan is not None else None
    ref_mfu = ref.plan.predicted.get("mfu") if ref.plan is not None else None

    def ratios(sol: Solution | None) -> dict[str, float | None]:
        if sol is None or sol.plan is None or ref_t is None:
            return {"throughput_ratio": None, "mfu_ratio": None, "latency_ratio": None}
        mfu = sol.plan.predicted.get("mfu")
        return {
            "throughput_ratio": ref_t / sol.objective_s,
            "mfu_ratio": (mfu / ref_mfu) if (mfu and ref_mfu) else None,
            "latency_ratio": sol.objective_s / ref_t,
        }

    rows.append(_row(f"ours ({solver})", ours, ours_off, world, **ratios(ours)))
    for key in ["megatron", *[n for n in names if n != "megatron"]]:
        if key == "megatron" and "megatron" not in names:
            continue
        rows.append(_row(SOLVER_NAMES[key], sols[key], offl[key], world, **ratios(sols[key])))
    notes = []
    if ours is not None and ours.plan is not None:
        for key, sol in sols.items():
            if sol.plan is None or not sol.stats.get("maps_to_plan", True):
                continue
            if ours.objective_s > sol.objective_s * (1 + 1e-9) and offl[key] == ours_off:
                notes.append(
                    f"our {solver} plan ({ours.objective_s:.4g} s) is slower than {SOLVER_NAMES[key]} "
                    f"({sol.objective_s:.4g} s) on the same space: a search gap"
                )
    return {
        "model": m.name,
        "cluster": c.name,
        "devices": world,
        "settings": {
            "seq_length": st.seq_length,
            "global_batch_size": st.global_batch_size,
            "micro_batch_size": st.micro_batch_size,
            "dispatcher": st.dispatcher,
            "optimizer_offload": optimizer_offload,
        },
        "reference": SOLVER_NAMES["megatron"],
        "rows": rows,
        "notes": notes,
        "solutions": {"ours": ours, **{SOLVER_NAMES[k]: v for k, v in sols.items()}},
    }


def _plan_offloaded(sol: Solution, model: ModelSpec, cluster: ClusterSpec, st: Settings) -> bool:
    """Whether ``api.solve`` had to offload: the plan's prediction matches the offloaded settings."""
    if st.optimizer_offload or sol.plan is None:
        return st.optimizer_offload
    est: Estimate = estimate(model, cluster, sol.plan, st)
    return not (est.fits and abs(est.iteration_time_s - sol.objective_s) <= 1e-9 * max(1.0, sol.objective_s))


__all__ = [
    "BASELINES",
    "MoEUnawareCostModel",
    "ZebraPlan",
    "canonical",
    "compare_against",
    "hetermoe_style",
    "megatron_uniform",
    "metis_style",
    "plan_summary",
    "run_baseline",
]
