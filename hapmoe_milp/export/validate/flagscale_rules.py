"""FlagScale's own rules, beyond what its :class:`~hapmoe_milp.runtimes.Runtime` declares (those --
no VPP, CP 1, EP all-or-none, edge TP/DP, two stages per later mesh -- are checked by
:mod:`hapmoe_milp.export.validate.runtime_rules` from the declaration the search reads too).

Sources: FlagScale ``flagscale/train/arguments.py`` (``pre_validate_args``) and
``flagscale/train/hetero/parallel_context.py`` at :data:`hapmoe_milp.runtimes.FLAGSCALE_COMMIT`
(reference/megatron.md §5.1, anchors.md §2.6); the artifact rules check the config FlagScale's runner
turns into flags, including what its own checks miss (device types grouped, checkpoint format).
"""

from __future__ import annotations

from collections.abc import Iterator

from hapmoe_milp.export.common import stage_layers, uses_shared_embedding
from hapmoe_milp.export.flagscale import process_meshes, types_grouped
from hapmoe_milp.export.validate.registry import Context, Violation, rule, violation


# ---------------------------------------------------------------------- plan level
@rule("flagscale")
def rule_fs_same_cp(ctx: Context) -> Iterator[Violation]:
    cps = [s.cfg.cp for s in ctx.plan.stages]
    if len(set(cps)) > 1:
        yield violation("stages.cp", f"FlagScale needs the same CP in every mesh, got {cps}")


@rule("flagscale")
def rule_fs_microbatch_divisible(ctx: Context) -> Iterator[Violation]:
    p = ctx.plan
    n = p.samples_per_microbatch
    for i, s in enumerate(p.stages):
        if n % s.cfg.dp:
            yield violation(
                f"stages[{i}].dp",
                f"(dp0 x micro_batch_size) = {n} is not divisible by this mesh's dp {s.cfg.dp} (pre_validate_args)",
            )


@rule("flagscale")
def rule_fs_mtp_on_last_stage(ctx: Context) -> Iterator[Violation]:
    layers = stage_layers(ctx.plan, ctx.model)
    bad = [i for i, sl in enumerate(layers[:-1]) if sl.mtp]
    if bad:
        yield violation(
            f"stages[{bad[0]}].layers",
            "FlagScale builds MTP layers on the last pipeline stage (its layer split counts decoder layers only)",
        )


@rule("flagscale")
def rule_fs_device_types_grouped(ctx: Context) -> Iterator[Violation]:
    meshes = process_meshes(ctx.plan)
    if not types_grouped(meshes):
        yield violation(
            "stages.device",
            f"mesh device types {[m.device for m in meshes]}: FlagScale ranks processes by the first position of "
            "their type in hetero_device_types, so meshes of one type must be consecutive",
        )


@rule("flagscale", tier="artifact")
def rule_fs_mesh_ranks(ctx: Context) -> Iterator[Violation]:
    h = ctx.hetero()
    f = "system.hetero.hetero_process_meshes"
    flat = list(h.get("hetero_process_meshes") or [])
    if len(flat) % 5 or not flat:
        yield violation(f, f"needs 5 ints (tp, cp, ep, dp, pp) per mesh, got {len(flat)} values")
        return
    meshes = [flat[i : i + 5] for i in range(0, len(flat), 5)]
    total = sum(tp * cp * dp * pp for tp, cp, _ep, dp, pp in meshes)
    if total != ctx.world:
        yield violation(
            f,
            f"meshes hold {total} ranks, the plan uses {ctx.world} devices (world size mismatch)",
        )
    etps = list(h.get("expert_tensor_parallel_size_per_process_mesh") or [1] * len(meshes))
    if len(etps) != len(meshes):
        yield violation(
            "system.hetero.expert_tensor_parallel_size_per_process_mesh",
            f"has {len(etps)} entries for {len(meshes)} meshes",
        )
        return
    types = list(h.get("hetero_device_types") or [])
    if len(types) != len(meshes):
        yield violation(
            "system.hetero.hetero_device_types",
            f"has {len(types)} entries for {len(meshes)} meshes",
        )
    for i, ((tp, cp, ep, dp, pp), etp) in enumerate(zip(meshes, etps)):
        if (tp * cp * dp * pp) % (etp * ep * pp):
            yield violation(
                f,
                f"mesh {i}: tp*cp*dp*pp = {tp * cp * dp * pp} is not divisible by etp*ep*pp = {etp * ep * pp}",
            )


@rule("flagscale", tier="artifact")
def rule_fs_pp_matches_meshes(ctx: Context) -> Iterator[Violation]:
    assert ctx.fs is not None
    flat = list(ctx.hetero().get("hetero_process_meshes") or [])
    pp = ctx.fs.get("system", {}).get("pipeline_model_parallel_size")
    if pp != sum(flat[4::5]) or pp != ctx.plan.pp:
        yield violation(
            "system.pipeline_model_parallel_size",
            f"is {pp}; the meshes' pp sum to {sum(flat[4::5])} and the plan has {ctx.plan.pp} stages",
        )


@rule("flagscale", tier="artifact")
def rule_fs_layer_split(ctx: Context) -> Iterator[Violation]:
    split = list(ctx.hetero().get("hetero_pipeline_layer_split") or [])
    f = "system.hetero.hetero_pipeline_layer_split"
    want = [sl.decoder for sl in stage_layers(ctx.plan, ctx.model)]
    if len(split) != ctx.plan.pp:
        yield violation(f, f"has {len(split)} entries, pipeline size is {ctx.plan.pp}")
    elif sum(split) != ctx.model.num_layers:
        yield violation(f, f"sums to {sum(split)}, num_layers is {ctx.model.num_layers}")
    elif any(n < 1 for n in split):
        yield violation(f, f"{split}: every stage needs at least one decoder layer")
    elif split != want:
        yield violation(f, f"is {split}, the plan's decoder layers per stage are {want}")


@rule("flagscale", tier="artifact")
def rule_fs_partial_reduce_flag(ctx: Context) -> Iterator[Violation]:
    d0, dl = ctx.plan.stages[0].cfg.dp, ctx.plan.stages[-1].cfg.dp
    if (
        uses_shared_embedding(ctx.model)
        and ctx.settings.distributed_optimizer
        and d0 != dl
        and not ctx.hetero().get("use_partial_reduce_for_shared_embedding")
    ):
        yield violation(
            "system.hetero.use_partial_reduce_for_shared_embedding",
            f"must be true: shared embedding with first/last mesh dp {d0} != {dl} (pre_validate_args)",
        )


@rule("flagscale", tier="artifact")
def rule_fs_standalone_embedding_off(ctx: Context) -> Iterator[Violation]:
    if ctx.hetero().get("standalone_embedding_stage", False):
        yield violation(
            "system.hetero.standalone_embedding_stage",
            "must be false with process meshes (pre_validate_args)",
        )


@rule("flagscale", tier="artifact")
def rule_fs_offload_keys(ctx: Context) -> Iterator[Violation]:
    assert ctx.fs is not None
    system = ctx.fs.get("system", {})
    want, have = ctx.settings.optimizer_offload, bool(system.get("optimizer_cpu_offload"))
    if want != have or (have and not system.get("use_precision_aware_optimizer")):
        yield violation(
            "system.optimizer_cpu_offload",
            f"is {have} with use_precision_aware_optimizer {bool(system.get('use_precision_aware_optimizer'))}; the "
            f"plan {'offloads' if want else 'does not offload'} optimizer states (both keys true when it does)",
        )


@rule("flagscale", tier="artifact")
def rule_fs_ckpt_format(ctx: Context) -> Iterator[Violation]:
    assert ctx.fs is not None
    tps = {s.cfg.tp for s in ctx.plan.stages}
    fmt = ctx.fs.get("system", {}).get("checkpoint", {}).get("ckpt_format")
    if len(tps) > 1 and fmt != "torch":
        yield violation(
            "system.checkpoint.ckpt_format",
            f"TP differs across meshes ({sorted(tps)}): dist_ckpt breaks, use ckpt_format torch (FlagScale #319)",
        )
