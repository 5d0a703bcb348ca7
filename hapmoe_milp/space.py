"""The plan space: which stage shapes and parallel configs are valid, and the pruning rules.

Validity (always on) mirrors Megatron-Core's checks (reference/megatron.md §2.7) plus two of ours: TP
and ETP stay inside a node, and every stage is one device type (so EP groups never span device types
by construction). Pruning rules are switches; with all of them off the search is exact over this space.

A runtime (:mod:`hapmoe_milp.runtimes`) narrows the space: :func:`runtime_allows` is its per-stage rule
(options), :class:`StageRules` the rules that tie stages together, which the solvers enforce and
``validate`` checks with the same functions (:func:`stage_rule_problems`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from hapmoe_milp.config import ParallelConfig, Settings, check_bool, check_float, check_int
from hapmoe_milp.errors import PlanError
from hapmoe_milp.limits import MAX_DEVICES, MAX_VPP
from hapmoe_milp.plan import Stage, check_config
from hapmoe_milp.runtimes import Runtime, shared_embedding
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec


@dataclass(frozen=True)
class Pruning:
    """Pruning switches. Each one trades exactness for speed and is counted when it cuts something.

    - ``layer_band``: HAPMoE's load-balance rule, layers of a stage within (1 +/- delta) of its share of
      the cluster's compute, ``n_hat = N * g * P_h / sum_t(m_t * P_t)`` (generalised to several stages
      per type, reference/papers.md §13.3).
      With ``band_refine`` the DP then searches once more without the band, bounded by the plan found
      and by as much CPU time again as the first pass took, at least a second (clusters up to
      ``large_cluster`` devices).
    - ``min_recompute``: take the cheapest recompute level that fits memory; never a costlier one.
    - ``cross_type_comm``: drop a cross-type boundary whose p2p exceeds ``eta`` x the stage's compute.
    - ``ep_within_type``: EP groups never span device types. Structural in this space (a stage is one
      device type), so it never has anything left to cut; kept as a named rule for reporting.
    - ``dominance``: drop an option no better in any coefficient than another of the same shape.
    - ``max_stages``: cap on the number of pipeline stages (0 = no cap).
    - ``uniform_stage_size``: hetero family only, one stage size per device type (large clusters).
    - ``pareto_eps``: DP labels within this relative distance of a kept label are merged.
    - ``large_cluster``: above this many devices the hetero family uses whole-node stages of one size
      per device type (0 = never), keeping per stage shape at most ``large_cluster_top_k`` options on the
      time/memory front of the dominant layer kind; the per-stage space grows too fast otherwise.

    Not a pruning rule but a bound of the space: ``max_vpp`` is the most virtual pipeline chunks per stage
    (Megatron's interleaved 1F1B) the megatron family searches; 1 searches plain 1F1B only. It stays in
    :meth:`off`, which is exact over the space it describes.
    """

    layer_band: bool = True
    delta: float = 0.2
    band_refine: bool = True
    min_recompute: bool = True
    cross_type_comm: bool = True
    eta: float = 2.0
    ep_within_type: bool = True
    dominance: bool = True
    max_stages: int = 16
    uniform_stage_size: bool = False
    pareto_eps: float = 0.002
    large_cluster: int = 64
    large_cluster_top_k: int = 4
    max_vpp: int = 8

    def __post_init__(self) -> None:
        # checked once, here, whoever builds it (preset YAML, Python API): errors name the switch
        for name, v in _checked_pruning(self).items():
            if v is not getattr(self, name):
                object.__setattr__(self, name, v)

    @classmethod
    def off(cls) -> Pruning:
        return cls(
            layer_band=False,
            min_recompute=False,
            cross_type_comm=False,
            ep_within_type=False,
            dominance=False,
            max_stages=0,
            pareto_eps=0.0,
            large_cluster=0,
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Pruning:
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise PlanError(f"unknown pruning switch {sorted(unknown)[0]!r}; known: {', '.join(sorted(names))}")
        return replace(cls(), **d)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: The physical range of each numeric switch: what it means, not what a test happens to use.
PRUNING_RANGES: dict[str, tuple[float, float]] = {
    "delta": (0.0, 100.0),  # band half-width as a fraction of a stage's share (>1 leaves no lower bound)
    "eta": (0.0, 1e6),  # p2p / compute ratio; 0 drops every cross-type boundary with any transfer
    "max_stages": (0, MAX_DEVICES),  # 0 = no cap; never more stages than devices
    "pareto_eps": (0.0, 1.0),  # relative distance between merged DP labels
    "large_cluster": (0, MAX_DEVICES),  # 0 = never
    "large_cluster_top_k": (0, 1 << 16),  # 0 = keep every option
    "max_vpp": (1, MAX_VPP),
}


def _checked_pruning(p: Pruning) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(p):
        v = getattr(p, f.name)
        if f.type in ("bool", bool):
            out[f.name] = check_bool(f.name, v)
        elif f.type in ("int", int):
            lo, hi = PRUNING_RANGES[f.name]
            out[f.name] = check_int(f.name, v, int(lo), int(hi))
        else:
            lo, hi = PRUNING_RANGES[f.name]
            out[f.name] = check_float(f.name, v, lo, hi)
    return out


@dataclass
class PruneCounter:
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, rule: str, n: int = 1) -> None:
        self.counts[rule] = self.counts.get(rule, 0) + n


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def stage_sizes(cluster: ClusterSpec, did: str) -> list[int]:
    """Device counts a stage of type ``did`` may have: powers of two up to a node, then whole nodes
    (every count up to 8 nodes, powers of two beyond)."""
    node = cluster.node_size(did)
    inv = cluster.inventory[did]
    sizes = [g for g in _pow2_upto(node) if g <= inv]
    nodes = inv // node
    for k in range(2, nodes + 1):
        if k <= 8 or (k & (k - 1)) == 0:
            sizes.append(k * node)
    if node not in sizes and node <= inv:
        sizes.append(node)
    return sorted(set(sizes))


def configs(model: ModelSpec, g: int, node_size: int, seq_length: int) -> list[ParallelConfig]:
    """All Megatron-valid (TP, CP, DP, EP, ETP) for a stage of ``g`` devices."""
    out: list[ParallelConfig] = []
    for tp in _pow2_upto(min(g, node_size)):
        if g % tp:
            continue
        for cp in _pow2_upto(g // tp):
            if (g // tp) % cp:
                continue
            dp = g // (tp * cp)
            eps = [1]
            etps = [1]
            if model.is_moe:
                eps = [e for e in range(1, g + 1) if g % e == 0 and (model.num_experts or 0) % e == 0]
                etps = _pow2_upto(min(g, node_size))
            for ep in eps:
                for etp in etps:
                    cfg = ParallelConfig(tp, cp, dp, ep, etp)
                    try:
                        check_config(cfg, model, None, node_size, "")
                    except PlanError:
                        continue
                    if cp > 1 and seq_length % (2 * cp):
                        continue
                    out.append(cfg)
    return out


# ---------------------------------------------------------------------- runtime rules
def runtime_allows(runtime: Runtime, cfg: ParallelConfig) -> bool:
    """Whether ``runtime`` runs a stage of this parallel config at all (context parallelism)."""
    return cfg.cp == 1 or runtime.cp


@dataclass(frozen=True)
class StageRules:
    """Runtime rules between stages (no single option can break them).

    - ``edge_tp``: the first and last stage have one TP (they share the embedding weight);
    - ``edge_dp``: their DPs divide one another (the shared embedding's gradient reduction);
    - ``mesh_min_stages``: every mesh -- a run of consecutive stages of one device type and parallel
      config -- after the first holds at least this many stages;
    - ``types_grouped``: the stages of one device type are consecutive (FlagScale ranks processes by
      device type; the hetero family is built that way, a one-mesh plan must be told).
    """

    edge_tp: bool = False
    edge_dp: bool = False
    mesh_min_stages: int = 1
    types_grouped: bool = False

    @property
    def active(self) -> bool:
        return self.edge_tp or self.edge_dp or self.mesh_min_stages > 1

    def edges_ok(self, first: ParallelConfig, last: ParallelConfig) -> bool:
        if self.edge_tp and first.tp != last.tp:
            return False
        return not (self.edge_dp and first.dp % last.dp and last.dp % first.dp)


def stage_rules(runtime: Runtime | None, model: ModelSpec, settings: Settings | None = None) -> StageRules:
    """The rules between stages a runtime imposes on plans of ``model``. A one-mesh (megatron-family)
    runtime has none left: its stages share one config."""
    if runtime is None or runtime.family != "hetero":
        return StageRules()
    shared = shared_embedding(model)
    dist_opt = settings.distributed_optimizer if settings is not None else True
    return StageRules(
        edge_tp=runtime.edge_tp and shared,
        edge_dp=runtime.edge_dp_divisible and shared and dist_opt,
        mesh_min_stages=runtime.mesh_min_stages,
        types_grouped=True,
    )


def mesh_runs(stages: tuple[Stage, ...] | list[Stage]) -> list[tuple[int, int]]:
    """``(first stage, stage count)`` of each mesh: consecutive stages of one device type and config."""
    out: list[tuple[int, int]] = []
    for i, s in enumerate(stages):
        if out and stages[i - 1].device == s.device and stages[i - 1].cfg == s.cfg:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((i, 1))
    return out


def stage_rule_problems(rules: StageRules, stages: tuple[Stage, ...] | list[Stage]) -> list[tuple[str, str, str]]:
    """``(rule, field, message)`` for each rule between stages that ``stages`` break."""
    out: list[tuple[str, str, str]] = []
    if not stages:
        return out
    first, last = stages[0].cfg, stages[-1].cfg
    if rules.edge_tp and first.tp != last.tp:
        out.append(
            (
                "edge_tp",
                "stages[-1].tp",
                f"the first and last stage share the embedding and need one TP, got {first.tp} and {last.tp}",
            )
        )
    if rules.edge_dp and first.dp % last.dp and last.dp % first.dp:
        out.append(
            (
                "edge_dp",
                "stages[-1].dp",
                f"the first and last stage share the embedding; their DPs {first.dp} and {last.dp} must divide one another",
            )
        )
    if rules.types_grouped:
        seen: list[str] = []
        for i, s in enumerate(stages):
            if seen and s.device != seen[-1] and s.device in seen:
                out.append(("types_grouped", f"stages[{i}].device", f"{s.device} stages are not consecutive"))
                break
            if not seen or seen[-1] != s.device:
                seen.append(s.device)
    if rules.mesh_min_stages > 1:
        for m, (start, n) in enumerate(mesh_runs(stages)):
            if m and n < rules.mesh_min_stages:
                out.append(
                    (
                        "mesh_min_stages",
                        f"stages[{start}]",
                        f"mesh {m} ({stages[start].device}, {stages[start].cfg.label()}) holds {n} stage(s); every mesh after the first needs at least {rules.mesh_min_stages}",
                    )
                )
    return out
