"""Rules every runtime shares: the plan's structure, Megatron's per-mesh rules (each runtime runs
Megatron-Core underneath), node locality, and what ``plan.check_plan`` checks.

Sources: Megatron-LM ``validate_args`` and ``TransformerConfig.__post_init__`` (reference/megatron.md
§2.7; :data:`hapmoe_milp.runtimes.MEGATRON_COMMIT`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hapmoe_milp.errors import PlanError
from hapmoe_milp.export.common import stage_layers
from hapmoe_milp.export.validate.registry import Context, Violation, rule, violation
from hapmoe_milp.plan import check_plan


# ---------------------------------------------------------------------- structural
@rule(kind="plan", tier="structure")
def rule_stage_layers_contiguous(ctx: Context) -> Iterator[Violation]:
    pos = 0
    for i, s in enumerate(ctx.plan.stages):
        if s.layer_start != pos:
            yield violation(
                f"stages[{i}].layers",
                f"starts at layer {s.layer_start}, expected {pos} (stages hold contiguous layer ranges)",
            )
        if s.layer_end < s.layer_start:
            yield violation(f"stages[{i}].layers", f"end {s.layer_end} is before start {s.layer_start}")
        pos = s.layer_end


@rule(kind="plan", tier="structure")
def rule_layers_cover_model(ctx: Context) -> Iterator[Violation]:
    n = len(ctx.model.layer_kinds)
    end = ctx.plan.stages[-1].layer_end if ctx.plan.stages else 0
    if end != n:
        yield violation(
            "stages",
            f"cover layers [0, {end}), the model has {n} (decoder {ctx.model.num_layers} + MTP {ctx.model.mtp_num_layers})",
        )


@rule(kind="plan", tier="structure")
def rule_device_type_in_cluster(ctx: Context) -> Iterator[Violation]:
    for i, s in enumerate(ctx.plan.stages):
        if s.device not in ctx.cluster.inventory:
            yield violation(
                f"stages[{i}].device",
                f"device type {s.device!r} is not in cluster {ctx.cluster.name} ({', '.join(ctx.cluster.device_types)})",
            )


@rule(kind="plan", tier="structure")
def rule_inventory_per_type(ctx: Context) -> Iterator[Violation]:
    for did, n in ctx.plan.devices_by_type().items():
        have = ctx.cluster.inventory.get(did, 0)
        if have and n > have:
            yield violation("stages", f"use {n} {did} devices, cluster {ctx.cluster.name} has {have}")


# ---------------------------------------------------------------------- Megatron's per-mesh rules
@rule(kind="plan")
def rule_heads_divisible_by_tp(ctx: Context) -> Iterator[Violation]:
    h = ctx.model.num_attention_heads
    for i, s in enumerate(ctx.plan.stages):
        if h % s.cfg.tp:
            yield violation(
                f"stages[{i}].tp", f"num_attention_heads {h} is not divisible by tp {s.cfg.tp} (TransformerConfig)"
            )


@rule(kind="plan")
def rule_query_groups_divisible_by_tp(ctx: Context) -> Iterator[Violation]:
    g = ctx.model.groups
    for i, s in enumerate(ctx.plan.stages):
        if g % s.cfg.tp and s.cfg.tp % g:
            yield violation(
                f"stages[{i}].tp",
                f"num_query_groups {g} and tp {s.cfg.tp} do not divide each other (TransformerConfig)",
            )


@rule(kind="plan")
def rule_experts_divisible_by_ep(ctx: Context) -> Iterator[Violation]:
    e = ctx.model.num_experts
    if not e:
        return
    for i, s in enumerate(ctx.plan.stages):
        if e % s.cfg.ep:
            yield violation(f"stages[{i}].ep", f"num_experts {e} is not divisible by ep {s.cfg.ep} (validate_args)")


@rule(kind="plan")
def rule_ep_needs_experts(ctx: Context) -> Iterator[Violation]:
    if ctx.model.is_moe:
        return
    for i, s in enumerate(ctx.plan.stages):
        if s.cfg.ep != 1 or s.cfg.etp != 1:
            yield violation(
                f"stages[{i}].ep",
                f"a dense model needs ep = etp = 1, got ep {s.cfg.ep} etp {s.cfg.etp} "
                "(TransformerConfig: expert parallelism without num_moe_experts)",
            )


@rule(kind="plan")
def rule_expert_grid_divides_world(ctx: Context) -> Iterator[Violation]:
    """Megatron: W % (ETP*EP*PP) == 0; per stage that is devices % (ETP*EP) (FlagScale: per mesh)."""
    for i, s in enumerate(ctx.plan.stages):
        n = s.cfg.etp * s.cfg.ep
        if s.devices % n:
            yield violation(
                f"stages[{i}].ep",
                f"etp x ep = {n} does not divide the stage's tp x cp x dp = {s.devices} devices "
                "(initialize_model_parallel: world size not divisible by expert_tensor_model_pipeline_parallel size)",
            )


@rule(kind="plan")
def rule_gbs_divisible_by_mbs_dp(ctx: Context) -> Iterator[Violation]:
    p = ctx.plan
    n = p.micro_batch_size * p.stages[0].cfg.dp
    if p.global_batch_size % n:
        yield violation(
            "global_batch_size",
            f"{p.global_batch_size} is not divisible by micro_batch_size x dp of stage 0 = {n} "
            "(ConstantNumMicroBatchesCalculator)",
        )


@rule(kind="plan")
def rule_seq_divisible_by_2cp(ctx: Context) -> Iterator[Violation]:
    seq = ctx.plan.seq_length
    for i, s in enumerate(ctx.plan.stages):
        if s.cfg.cp > 1 and seq % (2 * s.cfg.cp):
            yield violation(
                f"stages[{i}].cp", f"seq_length {seq} is not divisible by 2 x cp = {2 * s.cfg.cp} (validate_args)"
            )


def _groups_within_nodes(ctx: Context, size_of: Callable[[Any], int], what: str) -> Iterator[Violation]:
    placement = ctx.plan.placement(ctx.cluster)
    for i, (s, slots) in enumerate(zip(ctx.plan.stages, placement)):
        size = size_of(s.cfg)
        node = ctx.cluster.node_size(s.device)
        if size > node:
            yield violation(f"stages[{i}].{what}", f"{what} {size} exceeds the {s.device} node size {node}")
            continue
        for start in range(0, len(slots), size):
            grp = set(slots[start : start + size])
            if len(grp) > 1:
                yield violation(
                    f"stages[{i}].{what}",
                    f"a {what} group of stage {i} (its ranks {start}..{start + size - 1}) straddles {len(grp)} "
                    f"{s.device} nodes; align the stage to the node size or change {what}",
                )
                break


@rule(kind="plan")
def rule_tp_within_node(ctx: Context) -> Iterator[Violation]:
    """TP groups are the fastest-varying ranks (order tp-cp-ep-dp-pp); they must share a node."""
    yield from _groups_within_nodes(ctx, lambda c: c.tp, "tp")


@rule(kind="plan")
def rule_etp_within_node(ctx: Context) -> Iterator[Violation]:
    """Expert-TP groups are the fastest-varying ranks of the expert grid (tp-ep-dp-pp)."""
    yield from _groups_within_nodes(ctx, lambda c: c.etp, "etp")


@rule(kind="plan")
def rule_mtp_in_one_stage(ctx: Context) -> Iterator[Violation]:
    holders = [i for i, sl in enumerate(stage_layers(ctx.plan, ctx.model)) if sl.mtp]
    if len(holders) > 1:
        yield violation(
            "stages",
            f"MTP layers are split over stages {holders}; Megatron needs all MTP layers in one (virtual) stage",
        )


@rule(kind="plan", tier="invariants")
def rule_plan_invariants(ctx: Context) -> Iterator[Violation]:
    """Everything ``plan.check_plan`` (what ``estimate`` runs) checks, so a plan that passes validation
    for any target is one ``estimate`` accepts (e.g. a megatron-family plan with two mesh shapes passes the
    FlagScale rules but is not a megatron plan). Runs only when no named rule fired."""
    try:
        check_plan(ctx.plan, ctx.model, ctx.cluster)
    except PlanError as exc:
        yield violation(exc.field or "plan", exc.detail)


@rule()
def rule_offload_needs_dist_opt(ctx: Context) -> Iterator[Violation]:
    st = ctx.settings
    if st.optimizer_offload and not st.distributed_optimizer:
        yield violation(
            "settings.optimizer_offload",
            "optimizer CPU offload needs --use-precision-aware-optimizer (validate_args), which needs the "
            "distributed optimizer (OptimizerConfig); set distributed_optimizer",
        )
