"""Rules read from a runtime's declaration (:mod:`hapmoe_milp.runtimes`): the same fields the search
filters its space with, and the same functions for the rules between stages
(:func:`hapmoe_milp.space.stage_rule_problems`), so a plan the search returns for a runtime passes them
and a hand-made plan is refused for the reason the search would never have built it. Each message cites
the source the rule was read from.
"""

from __future__ import annotations

from collections.abc import Iterator

from hapmoe_milp.export.common import stage_layers
from hapmoe_milp.export.validate.registry import Context, Violation, rule, violation
from hapmoe_milp.space import stage_rule_problems, stage_rules


@rule()
def rule_runtime_vendors(ctx: Context) -> Iterator[Violation]:
    rt = ctx.runtime
    for i, s in enumerate(ctx.plan.stages):
        vendor = ctx.cluster.device(s.device).vendor if s.device in ctx.cluster.inventory else None
        if vendor is not None and vendor not in rt.vendors:
            yield violation(
                f"stages[{i}].device",
                f"{rt.title} runs {', '.join(sorted(rt.vendors))} devices, this stage runs on {s.device} ({vendor}); "
                f"FlagScale runs meshes of several vendors ({rt.cite('vendors')})",
            )
            return


@rule()
def rule_runtime_hybrid(ctx: Context) -> Iterator[Violation]:
    """Hybrid (Mamba) models need Megatron's ``pretrain_mamba.py``: FlagScale's heterogeneous entry
    (train_gpt.py) and our MindSpeed-LLM export (its pretrain_gpt.py) build GPT models only."""
    rt = ctx.runtime
    if ctx.model.is_hybrid and not rt.hybrid:
        yield violation(
            "model",
            f"{ctx.model.name} is a hybrid (Mamba) model; {rt.title} builds GPT models only here: export it to "
            f"Megatron-LM (pretrain_mamba.py) with one mesh for every stage ({rt.cite('hybrid')})",
        )


@rule()
def rule_runtime_vpp(ctx: Context) -> Iterator[Violation]:
    rt = ctx.runtime
    if ctx.plan.vpp > 1 and not rt.vpp:
        yield violation("vpp", f"{rt.title} runs no virtual pipeline stages with this plan ({rt.cite('vpp')})")


@rule()
def rule_runtime_cp(ctx: Context) -> Iterator[Violation]:
    rt = ctx.runtime
    cps = sorted({s.cfg.cp for s in ctx.plan.stages})
    if cps != [1] and not rt.cp:
        yield violation("stages.cp", f"{rt.title} runs no context parallelism, got cp {cps} ({rt.cite('cp')})")


@rule()
def rule_runtime_recompute(ctx: Context) -> Iterator[Violation]:
    rt = ctx.runtime
    levels = [s.recompute for s in ctx.plan.stages]
    kinds = set(levels)
    if not all(rt.runs_recompute(lv) for lv in kinds):
        yield violation(
            "stages.recompute",
            f"{rt.title} runs recompute {', '.join(rt.recompute)} here, the plan has {sorted(kinds)} ({rt.cite('recompute')})",
        )
    elif len(kinds) > 1 and not kinds <= set(rt.mixed_recompute):
        mixed = f"mixes only {' and '.join(rt.mixed_recompute)} per stage" if rt.mixed_recompute else "has one setting"
        yield violation(
            "stages.recompute",
            f"per-stage recompute {levels}: {rt.title} {mixed}; use nearest_expressible_recompute(plan, "
            f"{rt.name!r}) ({rt.cite('mixed_recompute')})",
        )


@rule()
def rule_runtime_ep_all_or_none(ctx: Context) -> Iterator[Violation]:
    rt = ctx.runtime
    eps = [s.cfg.ep for s in ctx.plan.stages]
    if rt.ep_all_or_none and any(e == 1 for e in eps) and any(e > 1 for e in eps):
        yield violation(
            "stages.ep",
            f"EP must be 1 in every mesh or > 1 in every mesh, got {eps}: mixing deadlocks because ranks build "
            f"different numbers of optimizers ({rt.cite('ep_all_or_none')})",
        )


def _between(ctx: Context, which: str) -> Iterator[Violation]:
    rt = ctx.runtime
    rules = stage_rules(rt, ctx.model, ctx.settings)
    for name, fld, msg in stage_rule_problems(rules, ctx.plan.stages):
        if name == which:
            key = {"edge_tp": "edge_tp", "edge_dp": "edge_dp_divisible", "mesh_min_stages": "mesh_min_stages"}[name]
            yield violation(fld, f"{msg} ({rt.title}: {rt.cite(key)})")


@rule()
def rule_runtime_edge_tp(ctx: Context) -> Iterator[Violation]:
    """Tied embeddings or MTP: the first and last mesh share a weight, so FlagScale needs one TP there."""
    yield from _between(ctx, "edge_tp")


@rule()
def rule_runtime_edge_dp(ctx: Context) -> Iterator[Violation]:
    yield from _between(ctx, "edge_dp")


@rule()
def rule_runtime_mesh_stages(ctx: Context) -> Iterator[Violation]:
    """FlagScale computes a stage's first layer from the layer split only when its mesh has pp > 1
    (``get_transformer_layer_offset`` under ``enable_hetero``); a later mesh of a single stage takes
    offset 0 and builds layers [0, n) instead of its own, so two meshes build the same layer ids (and,
    with a dense prefix or MTP, the wrong layer kinds). The search never builds such a plan."""
    yield from _between(ctx, "mesh_min_stages")


@rule()
def rule_runtime_mtp_with_decoder(ctx: Context) -> Iterator[Violation]:
    rt = ctx.runtime
    if not (rt.mtp_with_decoder and ctx.model.mtp_num_layers):
        return
    last = stage_layers(ctx.plan, ctx.model)[-1]
    if last.mtp and last.decoder < 1:
        yield violation(
            "stages[-1].layers",
            f"the last stage holds only MTP layers; {rt.title} splits decoder layers over stages (each at least "
            f"one) and builds the MTP layers on the last ({rt.cite('mtp_with_decoder')})",
        )


@rule()
def rule_runtime_precision(ctx: Context) -> Iterator[Violation]:
    rt = ctx.runtime
    if ctx.plan.precision != "fp8":
        return
    vendors = {ctx.cluster.device(s.device).vendor for s in ctx.plan.stages if s.device in ctx.cluster.inventory}
    if not vendors <= rt.fp8_vendors:
        yield violation(
            "settings.precision",
            f"{rt.title} has no FP8 training on {', '.join(sorted(vendors - rt.fp8_vendors))} devices "
            f"({rt.cite('fp8_vendors')})",
        )


@rule()
def rule_runtime_dispatcher(ctx: Context) -> Iterator[Violation]:
    rt = ctx.runtime
    if ctx.model.is_moe and ctx.plan.dispatcher not in rt.dispatchers:
        yield violation(
            "settings.dispatcher",
            f"{rt.title} has no {ctx.plan.dispatcher!r} token dispatcher (it has {', '.join(rt.dispatchers)}) "
            f"({rt.cite('dispatchers')})",
        )


@rule()
def rule_runtime_overlap_and_graphs(ctx: Context) -> Iterator[Violation]:
    """EP-communication overlap and CUDA graphs only where the runtime has them (``Runtime.ep_overlap``,
    ``Runtime.cuda_graphs``): MindSpeed-LLM's Megatron core_v0.12.1 has neither flag."""
    rt, st = ctx.runtime, ctx.settings
    if st.overlap_ep_comm and ctx.model.is_moe and not rt.ep_overlap:
        yield violation(
            "settings.overlap_ep_comm", f"{rt.title} has no EP-communication overlap here ({rt.cite('ep_overlap')})"
        )
    if st.cuda_graph_scope != "none" and not rt.cuda_graphs:
        yield violation(
            "settings.cuda_graph_scope", f"{rt.title} has no CUDA-graph capture here ({rt.cite('cuda_graphs')})"
        )


@rule()
def rule_runtime_legacy_model(ctx: Context) -> Iterator[Violation]:
    """``legacy_model`` prices Megatron-LM's pre-Core GPT, for judging measurements of old runs; every runtime
    here launches Megatron-Core models, so such a plan has nothing to run it."""
    if ctx.settings.legacy_model:
        yield violation(
            "settings.legacy_model",
            f"{ctx.runtime.title} launches Megatron-Core models; the pre-Core model is priced, not exported",
        )


@rule()
def rule_runtime_gshard_moe(ctx: Context) -> Iterator[Violation]:
    """``gshard_capacity_factor`` prices ModelLink's legacy GShard MoE layer (MindSpeed ``ascendspeed/components/moe``),
    for judging measurements of old runs; every runtime here launches Megatron-Core's MoE, so such a plan has
    nothing to run it."""
    if ctx.settings.gshard_capacity_factor and ctx.model.is_moe:
        yield violation(
            "settings.gshard_capacity_factor",
            f"{ctx.runtime.title} launches Megatron-Core's MoE; the legacy GShard layer is priced, not exported",
        )
