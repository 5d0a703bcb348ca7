"""The least memory any plan can need, summed over the cluster: a proof of infeasibility before any pricing.

Whatever the plan -- family, runtime, pipeline depth, VPP, meshes, recompute, FSDP -- each of its stages
puts ``g = TP x CP x DP`` devices of one type on a contiguous range of layers, and a stage fits only if
every rank's allocated bytes stay within :meth:`CostModel.capacity` (``MemoryModel.budget``). So a plan
that fits satisfies, summed over its stages,

    sum_stages g * (model state + stored activations + working set)  <=  sum_stages g * capacity(device, mesh)

The right side is at most the cluster's :func:`usable_bytes`: every device at ``capacity(device)`` with no
mesh (no DeepEP buffers, the largest budget a mesh can leave), idle devices included. The left side is at
least the model state alone, and the model state of one parameter is the smallest when it is sharded the
widest a stage allows. With ``x`` one state component's bytes per parameter (:func:`bytes_per_param`: the
model copy, FP8 copies, gradients, main parameters, Adam moments), a layer's ``p`` parameters split into
``p_tp`` (sharded by TP), ``p_rep`` (replicated) and ``p_exp`` (sharded by EP x ETP) hold on the stage

- a component replicated over the DP x CP copies: ``g * (p_tp / TP + p_rep) * x = DP CP (p_tp + TP p_rep) x
  >= (p_tp + p_rep) x``; and for experts ``g * p_exp / (EP ETP) * x = EDP * p_exp * x >= p_exp * x``;
- a component the distributed optimizer (or Megatron-FSDP) shards over DP x CP: ``g / (DP CP) * (p_tp / TP
  + p_rep) * x = (p_tp + TP p_rep) x >= (p_tp + p_rep) x``; over expert-DP: ``g / EDP * p_exp / (EP ETP) * x
  = p_exp * x`` (a valid mesh has ``EP x ETP`` dividing ``g``: ``ParallelConfig.edp``).

So every component of every layer costs at least ``p * x`` bytes summed over its stage's devices, i.e. the
model state of the whole model is at least ``P * bytes_per_param(settings, shard=1).total`` for its ``P``
placed parameters -- every decoder and MTP layer (:meth:`ModelSpec.layer_params`) plus the input embedding
on the first stage and the output layer (its own ``V x h`` copy, tied or not, except that tied embeddings
in a one-stage plan share one matrix; and the final norm) on the last, each matrix at least ``vocab x h``
however the vocabulary is padded. Optimizer offload lowers ``x`` (main
parameters and moments go to the host), so the floor under offload is below the one without. Activations,
working sets and fragmentation only add, so they are left out: the floor is a necessary condition, cheap
(no option priced), and when it fails no plan in the space fits. ``tests/test_cost_floor.py`` checks the
per-layer inequality on every stage option of small spaces and against the full search.
"""

from __future__ import annotations

from dataclasses import dataclass

from hapmoe_milp.config import ParallelConfig, Settings, parse_recompute
from hapmoe_milp.cost.memory import MemoryModel, activation_terms, bytes_per_param, head_bytes, layer_working_bytes
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import LayerKind, ModelSpec


@dataclass(frozen=True)
class MemoryFloor:
    """The cluster-wide memory floor of a (model, cluster, settings) against what the cluster holds."""

    params: int  # parameters every plan places (decoder and MTP layers, embedding, output layer)
    per_param: float  # bytes of model state per parameter, summed over its copies and shards, at least
    usable: float  # allocated bytes the cluster's devices may hold together, at most
    devices: int
    optimizer_offload: bool

    @property
    def need(self) -> float:
        """Bytes of model state any plan holds, summed over the cluster, at least."""
        return self.params * self.per_param

    @property
    def fits(self) -> bool:
        """False is a proof that no plan fits: the model state alone exceeds the whole cluster."""
        return self.need <= self.usable


def layer_floor_params(model: ModelSpec, kind: LayerKind) -> int:
    """Parameters of one layer of ``kind``: its model state summed over a stage's devices is at least this
    many times ``bytes_per_param(settings, 1).total`` on any mesh (module docstring)."""
    return sum(model.layer_params(kind).values())


def edge_floor_params(model: ModelSpec) -> tuple[int, int]:
    """(first stage's input embedding, last stage's output layer and final norm) parameters every plan
    holds, at the least padding: the cost model prices ``padded_vocab(TP) x h / TP`` per rank for each
    matrix (``CostModel.first_edge``, ``last_edge``), which summed over a stage is at least ``vocab x h``;
    with tied embeddings a one-stage plan holds the matrix once (``CostModel.single_edge``), so the output
    layer counts only its norm then."""
    vh = model.vocab_size * model.hidden_size
    return vh, vh * model.untie_embeddings_and_output_weights + model.hidden_size * model.norm_params


def placed_params(model: ModelSpec) -> int:
    """Parameters every plan places on some stage: each layer once, the embedding and the output layer."""
    first, last = edge_floor_params(model)
    return sum(layer_floor_params(model, k) for k in model.layer_kinds) + first + last


def usable_bytes(cluster: ClusterSpec, settings: Settings) -> float:
    """Allocated bytes the whole cluster may hold: every device at its largest budget (no mesh, hence no
    DeepEP buffers; ``MemoryModel.budget``), idle or not."""
    return sum(device_budget(cluster, settings, d) * n for d, n in cluster.inventory.items())


def memory_floor(model: ModelSpec, cluster: ClusterSpec, settings: Settings) -> MemoryFloor:
    """The floor under ``settings`` (module docstring): ``fits`` False proves that no plan fits."""
    return MemoryFloor(
        params=placed_params(model),
        per_param=bytes_per_param(settings, 1).total,
        usable=usable_bytes(cluster, settings),
        devices=cluster.world_size,
        optimizer_offload=settings.optimizer_offload,
    )


def state_split(settings: Settings) -> tuple[float, float]:
    """(unsharded, sharded) bytes per parameter: ``bytes_per_param(settings, d).total = unsharded + sharded / d``
    (the function is affine in ``1 / d``, so two shard counts give both parts)."""
    one, two = bytes_per_param(settings, 1).total, bytes_per_param(settings, 2).total
    sharded = 2.0 * (one - two)
    return one - sharded, sharded


@dataclass(frozen=True)
class StageFloor:
    """Allocated bytes per device a stage of ``g`` devices needs at least, on any mesh and micro-batch."""

    per_kind: dict[LayerKind, float]  # model state of one layer of each kind
    first: float  # the input embedding's state (first stage)
    last: float  # the output layer's state and its logits (last stage of a deeper pipeline)
    single: float  # both edges of a one-stage pipeline (tied embeddings: one matrix)
    fixed: float  # the working set every stage holds (``CostModel.fixed_memory``)


def stage_floor_bytes(model: ModelSpec, settings: Settings, g: int, node: int) -> StageFloor:
    """Allocated bytes per device a stage of ``g`` devices (nodes of ``node``) needs at least, on any mesh.

    Model state: a rank holds ``(p_tp / TP + p_rep)`` dense parameters at ``u + s / (DP CP)`` bytes each
    (``u, s``: :func:`state_split`) and ``p_exp / (EP ETP)`` expert parameters at ``u + s / EDP``. With
    ``TP <= T = min(g, node)`` (TP stays inside a node; ``space.configs``), ``DP CP = g / TP`` and ``EP ETP
    EDP = g``: dense ``>= u (p_tp / T + p_rep) + s (p_tp + p_rep) / g``, experts ``>= (u + s) p_exp / g``.
    The embedding and output layer are dense with ``p_tp >= vocab x h`` (``padded_vocab`` only adds).

    One stage that is the first and the last holds the embedding and the output layer as one term
    (``CostModel.single_edge``): with tied embeddings the matrix once.

    Working set: every stage holds the largest kind's working set (``CostModel.fixed_memory``, recompute
    none) and the last stage its logits too (``last_edge``). Each term is a non-negative multiple of the
    rank's tokens ``ts = b S / (CP TP) >= S / g`` (``b >= 1`` sample, ``CP TP <= g``) or of its routed rows
    ``k ts ETP >= k ts``, the expert width entering as ``F / ETP`` per row times ``ETP``-gathered rows;
    the logits are ``10 b S / (CP TP)`` times ``padded_vocab(TP) >= padded_vocab(1)``. So the terms priced
    by :mod:`hapmoe_milp.cost.memory` itself at ``TP = ETP = b = 1``, ``CP = g`` (the fewest tokens and rows
    a rank can have, not a mesh the search uses) are a floor for every mesh of ``g`` devices."""
    u, s = state_split(settings)
    t = min(g, node)

    def dense(p_tp: float, p_rep: float) -> float:
        return u * (p_tp / t + p_rep) + s * (p_tp + p_rep) / g

    fewest = ParallelConfig(tp=1, cp=g, dp=1, ep=1, etp=1)
    ts = settings.seq_length / g
    per_kind: dict[LayerKind, float] = {}
    work = 0.0
    for k in sorted(set(model.layer_kinds)):
        p = model.layer_params(k)
        per_kind[k] = dense(p["tp"], p["replicated"]) + (u + s) * p["expert"] / g
        rows = model.moe_router_topk * ts if model.kind_parts(k)[1] == "moe" else 0.0
        terms = activation_terms(model, settings, fewest, 1, k, rows)
        work = max(work, layer_working_bytes(model, settings, fewest, 1, k, terms, parse_recompute("none"), rows))
    vh = model.vocab_size * model.hidden_size
    logits = head_bytes(model, settings, fewest, 1)[1]
    norm = model.hidden_size * model.norm_params
    first, last = dense(vh, 0.0), dense(vh, norm) + logits
    single = first + dense(vh * model.untie_embeddings_and_output_weights, norm) + logits
    return StageFloor(per_kind, first, last, single, work)


def device_budget(cluster: ClusterSpec, settings: Settings, did: str) -> float:
    """Allocated bytes one device of ``did`` may hold on any mesh (``MemoryModel.budget`` with no DeepEP
    buffers, the largest)."""
    return MemoryModel(cluster.device(did), settings).budget(None)


__all__ = [
    "MemoryFloor",
    "StageFloor",
    "device_budget",
    "edge_floor_params",
    "layer_floor_params",
    "memory_floor",
    "placed_params",
    "stage_floor_bytes",
    "state_split",
    "usable_bytes",
]
