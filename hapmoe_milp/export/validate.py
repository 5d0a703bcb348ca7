"""Export validators: one function per Megatron-LM / FlagScale rule, named after the rule it mirrors.

Three tiers, run in order:

* structural rules (layers contiguous and complete, known device types, inventory): when one fails the
  rest would only report consequences, so validation stops there;
* plan rules (Megatron's per-mesh divisibility rules, node-locality, batch arithmetic, and each target's
  own restrictions such as one mesh shape for Megatron or CP = 1 for FlagScale);
* artifact rules, run on the exported arguments / config (generated, or handed in by the caller to
  check an edited file): sequence parallel, bias, recompute flags, layout grammar and counts, the
  FlagScale mesh list and layer split. These are the checks Megatron's ``validate_args``,
  ``TransformerConfig.__post_init__`` and ``initialize_model_parallel`` (reference/megatron.md §2) or
  FlagScale's ``pre_validate_args`` / ``ParallelContext`` (§5.1, anchors.md §2.6) would fail on, plus the
  ones FlagScale's own checks miss (EP all-or-none, device types grouped).

Between the plan and artifact tiers, ``rule_plan_invariants`` runs everything ``plan.check_plan`` checks
(what ``estimate`` runs) when no named rule fired, so a plan valid for any target is one ``estimate``
accepts. Rules with ``severity="warning"`` (e.g. FlagScale's layer offset 0 for a single-stage mesh) flag a
plan that runs, but not as planned; they never fail ``check``.

``validate`` returns every violation; ``check`` raises on the first error (PlanError for a plan that no
target can run, ExportError for one the chosen target cannot express).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from hapmoe_milp.config import Settings
from hapmoe_milp.errors import ExportError, PlanError
from hapmoe_milp.export.common import (
    TARGETS,
    Target,
    recompute_expressible,
    stage_layers,
    uses_shared_embedding,
)
from hapmoe_milp.export.flagscale import flagscale_config, process_meshes, types_grouped
from hapmoe_milp.export.megatron import (
    layout_chunks,
    layout_problems,
    megatron_args,
    megatron_chunks,
    parse_layout,
    parse_megatron_args,
)
from hapmoe_milp.export.megatron_arch import megatron_gaps
from hapmoe_milp.plan import Plan, check_plan
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

log = logging.getLogger(__name__)

Kind = Literal["plan", "export"]
Tier = Literal["structure", "plan", "invariants", "artifact"]
Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Violation:
    """One broken rule. ``severity="warning"`` marks a plan that runs but not as planned (it does not
    fail ``check`` or ``validate``'s exit status; the CLI prints it)."""

    rule: str
    field: str
    message: str
    kind: Kind = "export"
    severity: Severity = "error"

    def __str__(self) -> str:
        return f"{self.field}: {self.message} [{self.rule}]"


@dataclass(frozen=True)
class Context:
    plan: Plan
    model: ModelSpec
    cluster: ClusterSpec
    target: Target
    settings: Settings
    args: dict[str, Any] | None = None  # parsed Megatron arguments
    fs: dict[str, Any] | None = None  # FlagScale config

    @property
    def world(self) -> int:
        return self.plan.devices_used


RuleFn = Callable[[Context], Iterable[Violation]]


@dataclass(frozen=True)
class Rule:
    name: str
    fn: RuleFn
    targets: tuple[Target, ...]
    kind: Kind
    tier: Tier
    severity: Severity = "error"


RULES: list[Rule] = []


def rule(
    *targets: Target, kind: Kind = "export", tier: Tier = "plan", severity: Severity = "error"
) -> Callable[[RuleFn], RuleFn]:
    def deco(fn: RuleFn) -> RuleFn:
        RULES.append(Rule(fn.__name__, fn, targets or TARGETS, kind, tier, severity))
        return fn

    return deco


def _v(rule_name: str, fld: str, msg: str, kind: Kind = "export") -> Violation:
    """A violation; ``_run`` stamps the registered rule's name and kind on it, so they cannot drift."""
    return Violation(rule=rule_name, field=fld, message=msg, kind=kind)


# ====================================================================== structural (any target)
@rule(kind="plan", tier="structure")
def rule_stage_layers_contiguous(ctx: Context) -> Iterator[Violation]:
    pos = 0
    for i, s in enumerate(ctx.plan.stages):
        if s.layer_start != pos:
            yield _v(
                "rule_stage_layers_contiguous",
                f"stages[{i}].layers",
                f"starts at layer {s.layer_start}, expected {pos} (stages hold contiguous layer ranges)",
                "plan",
            )
        if s.layer_end < s.layer_start:
            yield _v(
                "rule_stage_layers_contiguous",
                f"stages[{i}].layers",
                f"end {s.layer_end} is before start {s.layer_start}",
                "plan",
            )
        pos = s.layer_end


@rule(kind="plan", tier="structure")
def rule_layers_cover_model(ctx: Context) -> Iterator[Violation]:
    n = len(ctx.model.layer_kinds)
    end = ctx.plan.stages[-1].layer_end if ctx.plan.stages else 0
    if end != n:
        yield _v(
            "rule_layers_cover_model",
            "stages",
            f"cover layers [0, {end}), the model has {n} (decoder {ctx.model.num_layers} + MTP {ctx.model.mtp_num_layers})",
            "plan",
        )


@rule(kind="plan", tier="structure")
def rule_device_type_in_cluster(ctx: Context) -> Iterator[Violation]:
    for i, s in enumerate(ctx.plan.stages):
        if s.device not in ctx.cluster.inventory:
            yield _v(
                "rule_device_type_in_cluster",
                f"stages[{i}].device",
                f"device type {s.device!r} is not in cluster {ctx.cluster.name} ({', '.join(ctx.cluster.device_types)})",
                "plan",
            )


@rule(kind="plan", tier="structure")
def rule_inventory_per_type(ctx: Context) -> Iterator[Violation]:
    for did, n in ctx.plan.devices_by_type().items():
        have = ctx.cluster.inventory.get(did, 0)
        if have and n > have:
            yield _v(
                "rule_inventory_per_type",
                "stages",
                f"use {n} {did} devices, cluster {ctx.cluster.name} has {have}",
                "plan",
            )


# ====================================================================== Megatron rules every target inherits
@rule(kind="plan")
def rule_heads_divisible_by_tp(ctx: Context) -> Iterator[Violation]:
    h = ctx.model.num_attention_heads
    for i, s in enumerate(ctx.plan.stages):
        if h % s.cfg.tp:
            yield _v(
                "rule_heads_divisible_by_tp",
                f"stages[{i}].tp",
                f"num_attention_heads {h} is not divisible by tp {s.cfg.tp} (TransformerConfig)",
                "plan",
            )


@rule(kind="plan")
def rule_query_groups_divisible_by_tp(ctx: Context) -> Iterator[Violation]:
    g = ctx.model.groups
    for i, s in enumerate(ctx.plan.stages):
        if g % s.cfg.tp and s.cfg.tp % g:
            yield _v(
                "rule_query_groups_divisible_by_tp",
                f"stages[{i}].tp",
                f"num_query_groups {g} and tp {s.cfg.tp} do not divide each other (TransformerConfig)",
                "plan",
            )


@rule(kind="plan")
def rule_experts_divisible_by_ep(ctx: Context) -> Iterator[Violation]:
    e = ctx.model.num_experts
    if not e:
        return
    for i, s in enumerate(ctx.plan.stages):
        if e % s.cfg.ep:
            yield _v(
                "rule_experts_divisible_by_ep",
                f"stages[{i}].ep",
                f"num_experts {e} is not divisible by ep {s.cfg.ep} (validate_args)",
                "plan",
            )


@rule(kind="plan")
def rule_ep_needs_experts(ctx: Context) -> Iterator[Violation]:
    if ctx.model.is_moe:
        return
    for i, s in enumerate(ctx.plan.stages):
        if s.cfg.ep != 1 or s.cfg.etp != 1:
            yield _v(
                "rule_ep_needs_experts",
                f"stages[{i}].ep",
                f"a dense model needs ep = etp = 1, got ep {s.cfg.ep} etp {s.cfg.etp} "
                "(TransformerConfig: expert parallelism without num_moe_experts)",
                "plan",
            )


@rule(kind="plan")
def rule_expert_grid_divides_world(ctx: Context) -> Iterator[Violation]:
    """Megatron: W % (ETP*EP*PP) == 0; per stage that is devices % (ETP*EP) (FlagScale: per mesh)."""
    for i, s in enumerate(ctx.plan.stages):
        n = s.cfg.etp * s.cfg.ep
        if s.devices % n:
            yield _v(
                "rule_expert_grid_divides_world",
                f"stages[{i}].ep",
                f"etp x ep = {n} does not divide the stage's tp x cp x dp = {s.devices} devices "
                "(initialize_model_parallel: world size not divisible by expert_tensor_model_pipeline_parallel size)",
                "plan",
            )


@rule(kind="plan")
def rule_gbs_divisible_by_mbs_dp(ctx: Context) -> Iterator[Violation]:
    p = ctx.plan
    n = p.micro_batch_size * p.stages[0].cfg.dp
    if p.global_batch_size % n:
        yield _v(
            "rule_gbs_divisible_by_mbs_dp",
            "global_batch_size",
            f"{p.global_batch_size} is not divisible by micro_batch_size x dp of stage 0 = {n} "
            "(ConstantNumMicroBatchesCalculator)",
            "plan",
        )


@rule(kind="plan")
def rule_seq_divisible_by_2cp(ctx: Context) -> Iterator[Violation]:
    seq = ctx.plan.seq_length
    for i, s in enumerate(ctx.plan.stages):
        if s.cfg.cp > 1 and seq % (2 * s.cfg.cp):
            yield _v(
                "rule_seq_divisible_by_2cp",
                f"stages[{i}].cp",
                f"seq_length {seq} is not divisible by 2 x cp = {2 * s.cfg.cp} (validate_args)",
                "plan",
            )


def _groups_within_nodes(ctx: Context, size_of: Callable[[Any], int], what: str, rule_name: str) -> Iterator[Violation]:
    placement = ctx.plan.placement(ctx.cluster)
    for i, (s, slots) in enumerate(zip(ctx.plan.stages, placement)):
        size = size_of(s.cfg)
        node = ctx.cluster.node_size(s.device)
        if size > node:
            yield _v(rule_name, f"stages[{i}].{what}", f"{what} {size} exceeds the {s.device} node size {node}", "plan")
            continue
        for start in range(0, len(slots), size):
            grp = set(slots[start : start + size])
            if len(grp) > 1:
                yield _v(
                    rule_name,
                    f"stages[{i}].{what}",
                    f"a {what} group of stage {i} (its ranks {start}..{start + size - 1}) straddles {len(grp)} "
                    f"{s.device} nodes; align the stage to the node size or change {what}",
                    "plan",
                )
                break


@rule(kind="plan")
def rule_tp_within_node(ctx: Context) -> Iterator[Violation]:
    """TP groups are the fastest-varying ranks (order tp-cp-ep-dp-pp); they must share a node."""
    yield from _groups_within_nodes(ctx, lambda c: c.tp, "tp", "rule_tp_within_node")


@rule(kind="plan")
def rule_etp_within_node(ctx: Context) -> Iterator[Violation]:
    """Expert-TP groups are the fastest-varying ranks of the expert grid (tp-ep-dp-pp)."""
    yield from _groups_within_nodes(ctx, lambda c: c.etp, "etp", "rule_etp_within_node")


@rule(kind="plan")
def rule_mtp_in_one_stage(ctx: Context) -> Iterator[Violation]:
    holders = [i for i, sl in enumerate(stage_layers(ctx.plan, ctx.model)) if sl.mtp]
    if len(holders) > 1:
        yield _v(
            "rule_mtp_in_one_stage",
            "stages",
            f"MTP layers are split over stages {holders}; Megatron needs all MTP layers in one (virtual) stage",
            "plan",
        )


@rule(kind="plan", tier="invariants")
def rule_plan_invariants(ctx: Context) -> Iterator[Violation]:
    """Everything ``plan.check_plan`` (what ``estimate`` runs) checks, so a plan that passes validation
    for any target is one ``estimate`` accepts (e.g. a megatron-family plan with two mesh shapes passes the
    FlagScale rules but is not a megatron plan). Runs only when no named rule fired."""
    try:
        check_plan(ctx.plan, ctx.model, ctx.cluster)
    except PlanError as exc:
        yield _v("rule_plan_invariants", exc.field or "plan", exc.detail, "plan")


@rule()
def rule_offload_needs_dist_opt(ctx: Context) -> Iterator[Violation]:
    st = ctx.settings
    if st.optimizer_offload and not st.distributed_optimizer:
        yield _v(
            "rule_offload_needs_dist_opt",
            "settings.optimizer_offload",
            "optimizer CPU offload needs --use-precision-aware-optimizer (validate_args), which needs the "
            "distributed optimizer (OptimizerConfig); set distributed_optimizer",
        )


# ====================================================================== Megatron-LM target
@rule("megatron")
def rule_uniform_mesh(ctx: Context) -> Iterator[Violation]:
    first = ctx.plan.stages[0].cfg
    for i, s in enumerate(ctx.plan.stages):
        if s.cfg != first:
            yield _v(
                "rule_uniform_mesh",
                f"stages[{i}]",
                f"Megatron-LM needs one mesh shape for all stages; {s.cfg.label()} != {first.label()} "
                "(use the flagscale target for per-stage meshes)",
            )
            return


@rule("megatron")
def rule_world_divisible_by_tp_pp_cp(ctx: Context) -> Iterator[Violation]:
    c = ctx.plan.stages[0].cfg
    n = c.tp * ctx.plan.pp * c.cp
    if ctx.world % n:
        yield _v(
            "rule_world_divisible_by_tp_pp_cp",
            "stages",
            f"world size {ctx.world} is not divisible by TP x PP x CP = {n} (validate_args)",
        )


@rule("megatron")
def rule_uniform_recompute(ctx: Context) -> Iterator[Violation]:
    levels = tuple(s.recompute for s in ctx.plan.stages)
    if not recompute_expressible(levels, "megatron"):
        yield _v(
            "rule_uniform_recompute",
            "stages.recompute",
            f"Megatron applies one recompute setting to every stage, the plan has {list(levels)}; "
            "use nearest_expressible_recompute(plan)",
        )


@rule("megatron")
def rule_vpp_needs_pp_gt_1(ctx: Context) -> Iterator[Violation]:
    if ctx.plan.vpp > 1 and ctx.plan.pp < 2:
        yield _v("rule_vpp_needs_pp_gt_1", "vpp", "virtual pipeline stages need pipeline size > 1 (parallel_state)")


@rule("megatron")
def rule_vpp_microbatches_divisible_by_pp(ctx: Context) -> Iterator[Violation]:
    p = ctx.plan
    if p.vpp > 1 and p.pp > 1:
        m = p.global_batch_size // max(1, p.samples_per_microbatch)
        if m % p.pp or m < p.pp:
            yield _v(
                "rule_vpp_microbatches_divisible_by_pp",
                "vpp",
                f"the interleaved schedule needs num_microbatches ({m}) to be a multiple of pp ({p.pp})",
            )


@rule("megatron")
def rule_ep_overlap_requirements(ctx: Context) -> Iterator[Violation]:
    if not ctx.settings.overlap_ep_comm or not ctx.model.is_moe:
        return
    p, c = ctx.plan, ctx.plan.stages[0].cfg
    problems = []
    if c.ep < 2:
        problems.append("EP > 1")
    if p.dispatcher not in ("alltoall", "flex"):
        problems.append("the alltoall or flex dispatcher")
    if any(s.recompute == "full" for s in p.stages):
        problems.append("no full recompute")
    if p.pp > 1 and p.vpp < 2:
        problems.append("virtual pipeline stages when PP > 1")
    if ctx.model.mtp_num_layers > 1:
        problems.append("at most one MTP layer")
    if problems:
        yield _v(
            "rule_ep_overlap_requirements",
            "settings.overlap_ep_comm",
            "--overlap-moe-expert-parallel-comm needs " + ", ".join(problems),
        )


# ---------------------------------------------------------------------- Megatron artifact rules
def _a(ctx: Context) -> dict[str, Any]:
    assert ctx.args is not None
    return ctx.args


# ---------------------------------------------------------------------- architectures (issue 22)
@rule("megatron")
def rule_megatron_architecture(ctx: Context) -> Iterator[Violation]:
    """A model Megatron-Core cannot build (export/megatron_arch.py), with the runtime that can."""
    for gap in megatron_gaps(ctx.model):
        if gap.blocking:
            yield _v(
                "rule_megatron_architecture",
                "model",
                f"Megatron-LM cannot build {ctx.model.name}: {gap.feature}; it runs under {gap.runtime}",
            )


@rule("megatron", severity="warning")
def rule_megatron_attention_differs(ctx: Context) -> Iterator[Violation]:
    """Megatron runs the model, but not the attention the plan priced."""
    for gap in megatron_gaps(ctx.model):
        if not gap.blocking:
            yield _v(
                "rule_megatron_attention_differs",
                "model",
                f"{gap.feature}; the plan's attention cost is what {gap.runtime} runs",
            )


@rule("megatron")
def rule_hybrid_pipeline_split(ctx: Context) -> Iterator[Violation]:
    """Megatron's hybrid stack (MambaStack._select_layers_for_pipeline_parallel, megatron-core 0.16.1) has no
    virtual stages and no layout: layers split evenly, or with a different first and/or last stage."""
    m, p = ctx.model, ctx.plan
    if not m.is_hybrid or p.pp == 1:
        return
    if p.vpp > 1:
        yield _v("rule_hybrid_pipeline_split", "vpp", "hybrid (Mamba) models run without virtual pipeline stages")
        return
    counts = p.layer_counts()
    for first, last in ((None, None), (counts[0], None), (None, counts[-1]), (counts[0], counts[-1])):
        got = megatron_chunks(p.pp, m.num_layers, 0, 1, first, last)
        if got is not None and [row[0].decoder for row in got] == counts:
            return
    yield _v(
        "rule_hybrid_pipeline_split",
        "stages",
        f"layers per stage {counts} need a layout, which Megatron's hybrid stack does not take "
        "(only an even split with a different first and/or last stage)",
    )


@rule("megatron", tier="artifact")
def rule_args_match_plan(ctx: Context) -> Iterator[Violation]:
    a, p, c = _a(ctx), ctx.plan, ctx.plan.stages[0].cfg
    want: dict[str, int] = {
        "tensor_model_parallel_size": c.tp,
        "pipeline_model_parallel_size": p.pp,
        "context_parallel_size": c.cp,
        "micro_batch_size": p.micro_batch_size,
        "global_batch_size": p.global_batch_size,
        "seq_length": p.seq_length,
        "num_layers": ctx.model.num_layers,
    }
    if ctx.model.is_moe:
        want["expert_model_parallel_size"] = c.ep
        want["expert_tensor_parallel_size"] = c.etp
    defaults: dict[str, Any] = {
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "context_parallel_size": 1,
        "expert_model_parallel_size": 1,
        "expert_tensor_parallel_size": a.get("tensor_model_parallel_size", 1),  # Megatron: ETP defaults to TP
    }
    for k, v in want.items():
        got = a.get(k, defaults.get(k))
        if got != v:
            yield _v("rule_args_match_plan", f"--{k.replace('_', '-')}", f"is {got}, the plan has {v}")


@rule("megatron", tier="artifact")
def rule_moe_tp_needs_sequence_parallel(ctx: Context) -> Iterator[Violation]:
    a = _a(ctx)
    if ctx.model.is_moe and int(a.get("tensor_model_parallel_size", 1)) > 1 and not a.get("sequence_parallel"):
        yield _v(
            "rule_moe_tp_needs_sequence_parallel",
            "--sequence-parallel",
            "MoE with TP > 1 needs --sequence-parallel (MoELayer raises during training without it)",
        )


@rule("megatron", tier="artifact")
def rule_sequence_parallel_needs_tp(ctx: Context) -> Iterator[Violation]:
    a = _a(ctx)
    if a.get("sequence_parallel") and int(a.get("tensor_model_parallel_size", 1)) == 1:
        yield _v(
            "rule_sequence_parallel_needs_tp",
            "--sequence-parallel",
            "sequence parallelism with TP = 1 is rejected by ModelParallelConfig (drop the flag)",
        )


@rule("megatron", tier="artifact")
def rule_moe_bias_needs_etp_1(ctx: Context) -> Iterator[Violation]:
    a = _a(ctx)
    tp = int(a.get("tensor_model_parallel_size", 1))
    etp = int(a.get("expert_tensor_parallel_size", tp))
    if ctx.model.is_moe and etp > 1 and not a.get("disable_bias_linear"):
        yield _v(
            "rule_moe_bias_needs_etp_1",
            "--disable-bias-linear",
            f"MoE linear bias is only supported with ETP = 1, ETP is {etp} (TransformerConfig); add --disable-bias-linear",
        )


@rule("megatron", tier="artifact")
def rule_topk1_needs_pre_softmax(ctx: Context) -> Iterator[Violation]:
    a = _a(ctx)
    if (
        ctx.model.is_moe
        and int(a.get("moe_router_topk", 2)) == 1
        and a.get("moe_router_score_function", "softmax") == "softmax"
        and not a.get("moe_router_pre_softmax")
    ):
        yield _v(
            "rule_topk1_needs_pre_softmax",
            "--moe-router-pre-softmax",
            "top-1 routing with softmax scores needs --moe-router-pre-softmax (TransformerConfig)",
        )


@rule("megatron", tier="artifact")
def rule_overlap_param_gather_needs_dist_opt(ctx: Context) -> Iterator[Violation]:
    a = _a(ctx)
    if a.get("overlap_param_gather") and not (a.get("use_distributed_optimizer") and a.get("overlap_grad_reduce")):
        yield _v(
            "rule_overlap_param_gather_needs_dist_opt",
            "--overlap-param-gather",
            "needs --use-distributed-optimizer and --overlap-grad-reduce (validate_args)",
        )


@rule("megatron", tier="artifact")
def rule_recompute_flags(ctx: Context) -> Iterator[Violation]:
    a = _a(ctx)
    gran, method, k = a.get("recompute_granularity"), a.get("recompute_method"), a.get("recompute_num_layers")
    f = "--recompute-granularity"
    if gran is None:
        if method is not None or k is not None:
            yield _v("rule_recompute_flags", f, "--recompute-method/--recompute-num-layers without a granularity")
    elif gran == "full":
        if method not in ("block", "uniform") or not isinstance(k, int) or k < 1:
            yield _v(
                "rule_recompute_flags",
                f,
                "full recompute needs --recompute-method block|uniform and --recompute-num-layers >= 1",
            )
    elif gran == "selective":
        if method is not None or k is not None:
            yield _v(
                "rule_recompute_flags", f, "selective recompute must not set --recompute-method/--recompute-num-layers"
            )
        mods = a.get("recompute_modules", ["core_attn"])
        mods = mods if isinstance(mods, list) else [mods]
        if "moe_act" in mods and not a.get("moe_grouped_gemm"):
            yield _v("rule_recompute_flags", "--recompute-modules", "moe_act recompute needs --moe-grouped-gemm")
    else:
        yield _v("rule_recompute_flags", f, f"must be full or selective, got {gran!r}")
    levels = {s.recompute for s in ctx.plan.stages}
    if len(levels) == 1:
        want = levels.pop()
        got = "none" if gran is None else str(gran)
        if got != want:
            yield _v("rule_recompute_flags", f, f"gives recompute {got!r}, the plan has {want!r}")


@rule("megatron", tier="artifact")
def rule_offload_flags(ctx: Context) -> Iterator[Violation]:
    """The arguments keep optimizer states where the plan was priced (host memory or device)."""
    a = _a(ctx)
    want, have = ctx.settings.optimizer_offload, bool(a.get("optimizer_cpu_offload"))
    if want and not have:
        yield _v(
            "rule_offload_flags",
            "--optimizer-cpu-offload",
            "is missing: the plan keeps optimizer states in host memory (it was priced, and may only fit, that way)",
        )
    elif have and not want:
        yield _v(
            "rule_offload_flags", "--optimizer-cpu-offload", "is set, but the plan keeps optimizer states on the device"
        )
    if have and not a.get("use_precision_aware_optimizer"):
        yield _v(
            "rule_offload_flags",
            "--use-precision-aware-optimizer",
            "is required with --optimizer-cpu-offload (validate_args)",
        )


def _layout(ctx: Context) -> str | None:
    v = _a(ctx).get("pipeline_model_parallel_layout")
    return None if v is None else str(v)


@rule("megatron", tier="artifact")
def rule_layout_grammar(ctx: Context) -> Iterator[Violation]:
    lay = _layout(ctx)
    if lay is None:
        return
    try:
        parse_layout(lay)
    except ValueError as exc:
        yield _v("rule_layout_grammar", "--pipeline-model-parallel-layout", f"{lay!r}: {exc}")


@rule("megatron", tier="artifact")
def rule_layout_counts(ctx: Context) -> Iterator[Violation]:
    """PipelineParallelLayerLayout.validate_layer_layout: E first, L last, counts, MTP placement."""
    lay = _layout(ctx)
    if lay is None:
        return
    try:
        parse_layout(lay)
    except ValueError:
        return  # rule_layout_grammar reports it
    for msg in layout_problems(lay, ctx.plan.pp, ctx.model.num_layers, ctx.model.mtp_num_layers):
        yield _v("rule_layout_counts", "--pipeline-model-parallel-layout", f"{lay!r}: {msg}")


@rule("megatron", tier="artifact")
def rule_layout_matches_plan(ctx: Context) -> Iterator[Violation]:
    lay = _layout(ctx)
    p = ctx.plan
    if lay is None:
        return
    try:
        stages = parse_layout(lay)
    except ValueError:
        return
    if len(stages) % p.pp:
        return  # rule_layout_counts reports it
    if len(stages) // p.pp != p.vpp:
        yield _v(
            "rule_layout_matches_plan",
            "--pipeline-model-parallel-layout",
            f"has {len(stages)} virtual stages = VPP {len(stages) // p.pp}, the plan has vpp {p.vpp}",
        )
        return
    got = [sum(c.total for c in row) for row in layout_chunks(lay, p.pp)]
    want = p.layer_counts()
    if got != want:
        yield _v(
            "rule_layout_matches_plan",
            "--pipeline-model-parallel-layout",
            f"gives {got} layers per pipeline rank, the plan has {want}",
        )


@rule("megatron", tier="artifact")
def rule_layout_exclusive(ctx: Context) -> Iterator[Violation]:
    a = _a(ctx)
    if _layout(ctx) is None:
        return
    clash = [
        k
        for k in (
            "decoder_first_pipeline_num_layers",
            "decoder_last_pipeline_num_layers",
            "num_layers_per_virtual_pipeline_stage",
            "num_virtual_stages_per_pipeline_rank",
            "account_for_embedding_in_pipeline_split",
            "account_for_loss_in_pipeline_split",
        )
        if k in a
    ]
    if clash:
        yield _v(
            "rule_layout_exclusive",
            "--pipeline-model-parallel-layout",
            "cannot be combined with " + ", ".join("--" + k.replace("_", "-") for k in clash),
        )


def _split_flags(ctx: Context) -> tuple[int | None, int | None, int]:
    a = _a(ctx)
    vpp = a.get("num_virtual_stages_per_pipeline_rank", 1)
    return a.get("decoder_first_pipeline_num_layers"), a.get("decoder_last_pipeline_num_layers"), int(vpp)


@rule("megatron", tier="artifact")
def rule_uneven_pp_split(ctx: Context) -> Iterator[Violation]:
    """TransformerConfig's uneven-PP checks, and that the flags give the plan's per-rank layers."""
    first, last, vpp = _split_flags(ctx)
    if _layout(ctx) is not None or (first is None and last is None):
        return
    p, m = ctx.plan, ctx.model
    ch = megatron_chunks(p.pp, m.num_layers, m.mtp_num_layers, vpp, first, last)
    if ch is None:
        yield _v(
            "rule_uneven_pp_split",
            "--decoder-first-pipeline-num-layers",
            f"first {first} / last {last} with {m.num_layers} layers over PP {p.pp} (VPP {vpp}) is rejected by "
            "TransformerConfig (values > 0, middle layers divisible by middle stages and by VPP)",
        )
    elif (got := [sum(c.total for c in row) for row in ch]) != p.layer_counts():
        yield _v(
            "rule_uneven_pp_split",
            "--decoder-first-pipeline-num-layers",
            f"gives {got} layers per pipeline rank, the plan has {p.layer_counts()}",
        )


@rule("megatron", tier="artifact")
def rule_even_split(ctx: Context) -> Iterator[Violation]:
    first, last, vpp = _split_flags(ctx)
    if _layout(ctx) is not None or first is not None or last is not None:
        return
    p, m = ctx.plan, ctx.model
    if p.pp == 1:
        return
    ch = megatron_chunks(p.pp, m.num_layers, m.mtp_num_layers, vpp, None, None)
    if ch is None:
        yield _v(
            "rule_even_split",
            "--num-layers",
            f"{m.num_layers} layers are not divisible by PP {p.pp} x VPP {vpp}; give a layout or first/last flags",
        )
    elif (got := [sum(c.total for c in row) for row in ch]) != p.layer_counts():
        yield _v(
            "rule_even_split",
            "--num-layers",
            f"the even split gives {got} layers per rank, the plan has {p.layer_counts()}",
        )
    if vpp != p.vpp:
        yield _v("rule_even_split", "--num-virtual-stages-per-pipeline-rank", f"is {vpp}, the plan has vpp {p.vpp}")


# ====================================================================== FlagScale target
@rule("flagscale")
def rule_fs_gpt_models_only(ctx: Context) -> Iterator[Violation]:
    """FlagScale's heterogeneous runs enter through its train_gpt.py (reference/megatron.md §5.1): GPT models
    only, not Megatron's hybrid (Mamba) stack."""
    if ctx.model.is_hybrid:
        yield _v(
            "rule_fs_gpt_models_only",
            "model",
            f"{ctx.model.name} is a hybrid (Mamba) model; FlagScale's heterogeneous training (train_gpt.py) builds "
            "GPT models only: export it to Megatron-LM (pretrain_mamba.py) with one mesh for every stage",
        )


@rule("flagscale")
def rule_fs_same_cp(ctx: Context) -> Iterator[Violation]:
    cps = [s.cfg.cp for s in ctx.plan.stages]
    if len(set(cps)) > 1:
        yield _v("rule_fs_same_cp", "stages.cp", f"FlagScale needs the same CP in every mesh, got {cps}")


@rule("flagscale")
def rule_fs_cp_is_one(ctx: Context) -> Iterator[Violation]:
    cps = sorted({s.cfg.cp for s in ctx.plan.stages})
    if cps != [1]:
        yield _v(
            "rule_fs_cp_is_one",
            "stages.cp",
            f"FlagScale's ParallelContext rejects context parallelism ('Context parallelism is not supported'), got cp {cps}",
        )


@rule("flagscale")
def rule_fs_ep_all_or_none(ctx: Context) -> Iterator[Violation]:
    eps = [s.cfg.ep for s in ctx.plan.stages]
    if any(e == 1 for e in eps) and any(e > 1 for e in eps):
        yield _v(
            "rule_fs_ep_all_or_none",
            "stages.ep",
            f"EP must be 1 in every mesh or > 1 in every mesh, got {eps}: mixing deadlocks because ranks build "
            "different numbers of optimizers (FlagScale #717; its own assertion is always true)",
        )


@rule("flagscale")
def rule_fs_microbatch_divisible(ctx: Context) -> Iterator[Violation]:
    p = ctx.plan
    n = p.samples_per_microbatch
    for i, s in enumerate(p.stages):
        if n % s.cfg.dp:
            yield _v(
                "rule_fs_microbatch_divisible",
                f"stages[{i}].dp",
                f"(dp0 x micro_batch_size) = {n} is not divisible by this mesh's dp {s.cfg.dp} (pre_validate_args)",
            )


@rule("flagscale")
def rule_fs_tied_embedding_tp(ctx: Context) -> Iterator[Violation]:
    s0, sl = ctx.plan.stages[0], ctx.plan.stages[-1]
    if uses_shared_embedding(ctx.model) and s0.cfg.tp != sl.cfg.tp:
        why = "tied embeddings" if not ctx.model.untie_embeddings_and_output_weights else "MTP"
        yield _v(
            "rule_fs_tied_embedding_tp",
            "stages[-1].tp",
            f"with {why} the first and last mesh need the same TP, got {s0.cfg.tp} and {sl.cfg.tp}",
        )


@rule("flagscale")
def rule_fs_shared_embedding_dp(ctx: Context) -> Iterator[Violation]:
    d0, dl = ctx.plan.stages[0].cfg.dp, ctx.plan.stages[-1].cfg.dp
    if uses_shared_embedding(ctx.model) and ctx.settings.distributed_optimizer and d0 != dl and d0 % dl and dl % d0:
        yield _v(
            "rule_fs_shared_embedding_dp",
            "stages[-1].dp",
            f"with a shared embedding and the distributed optimizer, first/last mesh dp {d0} and {dl} must divide one another",
        )


@rule("flagscale")
def rule_fs_no_vpp(ctx: Context) -> Iterator[Violation]:
    if ctx.plan.vpp > 1:
        yield _v("rule_fs_no_vpp", "vpp", "FlagScale heterogeneous meshes do not support virtual pipeline stages")


@rule("flagscale")
def rule_fs_mtp_on_last_stage(ctx: Context) -> Iterator[Violation]:
    layers = stage_layers(ctx.plan, ctx.model)
    bad = [i for i, sl in enumerate(layers[:-1]) if sl.mtp]
    if bad:
        yield _v(
            "rule_fs_mtp_on_last_stage",
            f"stages[{bad[0]}].layers",
            "FlagScale builds MTP layers on the last pipeline stage (its layer split counts decoder layers only)",
        )


@rule("flagscale")
def rule_fs_device_types_grouped(ctx: Context) -> Iterator[Violation]:
    meshes = process_meshes(ctx.plan)
    if not types_grouped(meshes):
        yield _v(
            "rule_fs_device_types_grouped",
            "stages.device",
            f"mesh device types {[m.device for m in meshes]}: FlagScale ranks processes by the first position of "
            "their type in hetero_device_types, so meshes of one type must be consecutive",
        )


@rule("flagscale")
def rule_fs_recompute_expressible(ctx: Context) -> Iterator[Violation]:
    levels = tuple(s.recompute for s in ctx.plan.stages)
    if not recompute_expressible(levels, "flagscale"):
        yield _v(
            "rule_fs_recompute_expressible",
            "stages.recompute",
            f"per-stage recompute {list(levels)}: FlagScale mixes only none and full per stage; "
            "use nearest_expressible_recompute(plan, 'flagscale')",
        )


@rule("flagscale", severity="warning")
def rule_fs_single_stage_mesh_offset(ctx: Context) -> Iterator[Violation]:
    """FlagScale computes a stage's first layer as the sum of the layer split before it only when its mesh
    has pp > 1 (``get_transformer_layer_offset`` under ``enable_hetero``); a mesh of a single stage takes
    Megatron's pp == 1 branch, offset 0, and builds the specs of layers [0, n) instead of [s, s+n). That
    only matters when layers differ -- a dense prefix (``moe_layer_freq``) or MTP, whose layer spec is
    taken from the stage's last decoder layer -- so it warns for those models only, naming what changes."""
    kinds = ctx.model.layer_kinds
    decoder = [k for k in kinds if k != "mtp"]
    if len(set(decoder)) <= 1 and not ctx.model.mtp_num_layers:
        return
    layers = stage_layers(ctx.plan, ctx.model)
    for i, m in enumerate(process_meshes(ctx.plan)):
        if i == 0 or m.pp != 1:
            continue
        st = ctx.plan.stages[m.first_stage]
        n = layers[m.first_stage].decoder
        want, built = decoder[st.layer_start : st.layer_start + n], decoder[:n]
        diff = sum(1 for a, b in zip(want, built) if a != b)
        what = (
            f"{diff} of its {n} layers would get the wrong kind (dense/MoE)" if diff else "layer numbers restart at 0"
        )
        if layers[m.first_stage].mtp and built[-1:] != want[-1:]:
            what += "; its MTP layers would copy the wrong layer kind"
        yield _v(
            "rule_fs_single_stage_mesh_offset",
            f"stages[{m.first_stage}]",
            f"mesh {i} holds a single pipeline stage, so FlagScale gives it layer offset 0 and it builds layers "
            f"[0, {n}) instead of [{st.layer_start}, {st.layer_start + n}): {what}. Give the mesh two or more "
            "stages, or move it first",
        )


# ---------------------------------------------------------------------- FlagScale artifact rules
def _h(ctx: Context) -> dict[str, Any]:
    assert ctx.fs is not None
    return dict(ctx.fs.get("system", {}).get("hetero", {}))


@rule("flagscale", tier="artifact")
def rule_fs_mesh_ranks(ctx: Context) -> Iterator[Violation]:
    h = _h(ctx)
    f = "system.hetero.hetero_process_meshes"
    flat = list(h.get("hetero_process_meshes") or [])
    if len(flat) % 5 or not flat:
        yield _v("rule_fs_mesh_ranks", f, f"needs 5 ints (tp, cp, ep, dp, pp) per mesh, got {len(flat)} values")
        return
    meshes = [flat[i : i + 5] for i in range(0, len(flat), 5)]
    total = sum(tp * cp * dp * pp for tp, cp, _ep, dp, pp in meshes)
    if total != ctx.world:
        yield _v(
            "rule_fs_mesh_ranks",
            f,
            f"meshes hold {total} ranks, the plan uses {ctx.world} devices (world size mismatch)",
        )
    etps = list(h.get("expert_tensor_parallel_size_per_process_mesh") or [1] * len(meshes))
    if len(etps) != len(meshes):
        yield _v(
            "rule_fs_mesh_ranks",
            "system.hetero.expert_tensor_parallel_size_per_process_mesh",
            f"has {len(etps)} entries for {len(meshes)} meshes",
        )
        return
    types = list(h.get("hetero_device_types") or [])
    if len(types) != len(meshes):
        yield _v(
            "rule_fs_mesh_ranks",
            "system.hetero.hetero_device_types",
            f"has {len(types)} entries for {len(meshes)} meshes",
        )
    for i, ((tp, cp, ep, dp, pp), etp) in enumerate(zip(meshes, etps)):
        if (tp * cp * dp * pp) % (etp * ep * pp):
            yield _v(
                "rule_fs_mesh_ranks",
                f,
                f"mesh {i}: tp*cp*dp*pp = {tp * cp * dp * pp} is not divisible by etp*ep*pp = {etp * ep * pp}",
            )


@rule("flagscale", tier="artifact")
def rule_fs_pp_matches_meshes(ctx: Context) -> Iterator[Violation]:
    assert ctx.fs is not None
    flat = list(_h(ctx).get("hetero_process_meshes") or [])
    pp = ctx.fs.get("system", {}).get("pipeline_model_parallel_size")
    if pp != sum(flat[4::5]) or pp != ctx.plan.pp:
        yield _v(
            "rule_fs_pp_matches_meshes",
            "system.pipeline_model_parallel_size",
            f"is {pp}; the meshes' pp sum to {sum(flat[4::5])} and the plan has {ctx.plan.pp} stages",
        )


@rule("flagscale", tier="artifact")
def rule_fs_layer_split(ctx: Context) -> Iterator[Violation]:
    split = list(_h(ctx).get("hetero_pipeline_layer_split") or [])
    f = "system.hetero.hetero_pipeline_layer_split"
    want = [sl.decoder for sl in stage_layers(ctx.plan, ctx.model)]
    if len(split) != ctx.plan.pp:
        yield _v("rule_fs_layer_split", f, f"has {len(split)} entries, pipeline size is {ctx.plan.pp}")
    elif sum(split) != ctx.model.num_layers:
        yield _v("rule_fs_layer_split", f, f"sums to {sum(split)}, num_layers is {ctx.model.num_layers}")
    elif any(n < 1 for n in split):
        yield _v("rule_fs_layer_split", f, f"{split}: every stage needs at least one decoder layer")
    elif split != want:
        yield _v("rule_fs_layer_split", f, f"is {split}, the plan's decoder layers per stage are {want}")


@rule("flagscale", tier="artifact")
def rule_fs_partial_reduce_flag(ctx: Context) -> Iterator[Violation]:
    d0, dl = ctx.plan.stages[0].cfg.dp, ctx.plan.stages[-1].cfg.dp
    if (
        uses_shared_embedding(ctx.model)
        and ctx.settings.distributed_optimizer
        and d0 != dl
        and not _h(ctx).get("use_partial_reduce_for_shared_embedding")
    ):
        yield _v(
            "rule_fs_partial_reduce_flag",
            "system.hetero.use_partial_reduce_for_shared_embedding",
            f"must be true: shared embedding with first/last mesh dp {d0} != {dl} (pre_validate_args)",
        )


@rule("flagscale", tier="artifact")
def rule_fs_standalone_embedding_off(ctx: Context) -> Iterator[Violation]:
    if _h(ctx).get("standalone_embedding_stage", False):
        yield _v(
            "rule_fs_standalone_embedding_off",
            "system.hetero.standalone_embedding_stage",
            "must be false with process meshes (pre_validate_args)",
        )


@rule("flagscale", tier="artifact")
def rule_fs_offload_keys(ctx: Context) -> Iterator[Violation]:
    assert ctx.fs is not None
    system = ctx.fs.get("system", {})
    want, have = ctx.settings.optimizer_offload, bool(system.get("optimizer_cpu_offload"))
    if want != have or (have and not system.get("use_precision_aware_optimizer")):
        yield _v(
            "rule_fs_offload_keys",
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
        yield _v(
            "rule_fs_ckpt_format",
            "system.checkpoint.ckpt_format",
            f"TP differs across meshes ({sorted(tps)}): dist_ckpt breaks, use ckpt_format torch (FlagScale #319)",
        )


# ====================================================================== driver
def _run(rules: Iterable[Rule], ctx: Context) -> list[Violation]:
    out: list[Violation] = []
    for r in rules:
        for v in r.fn(ctx):
            out.append(Violation(rule=r.name, field=v.field, message=v.message, kind=r.kind, severity=r.severity))
    return out


def validate(
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    target: Target,
    *,
    settings: Settings | None = None,
    args: list[str] | str | None = None,
    fs_config: dict[str, Any] | None = None,
) -> list[Violation]:
    """Every rule violation of ``plan`` for ``target``. ``args`` / ``fs_config`` check a given (e.g. hand-
    edited) artifact instead of the one the exporter would write."""
    if target not in TARGETS:
        raise ExportError(f"unknown target {target!r} (expected {' or '.join(TARGETS)})", field="target")
    st = plan.settings(settings)
    ctx = Context(plan, model, cluster, target, st)
    mine = [r for r in RULES if target in r.targets]
    out = _run((r for r in mine if r.tier == "structure"), ctx)
    if out:
        return out
    out = _run((r for r in mine if r.tier == "plan"), ctx)
    if not any(v.severity == "error" for v in out):
        out += _run((r for r in mine if r.tier == "invariants"), ctx)
    gen_error: str | None = None
    try:
        if target == "megatron":
            parsed = parse_megatron_args(args if args is not None else megatron_args(plan, model, cluster, settings))
            ctx = Context(plan, model, cluster, target, st, args=parsed)
        else:
            fs = fs_config if fs_config is not None else flagscale_config(plan, model, cluster, settings)
            ctx = Context(plan, model, cluster, target, st, fs=fs)
    except ExportError as exc:
        gen_error = exc.detail
    if gen_error is None:
        out += _run((r for r in mine if r.tier == "artifact"), ctx)
    elif not any(v.severity == "error" for v in out):
        out.append(Violation("rule_exportable", "plan", gen_error, "export"))
    for v in out:
        log.debug("%s", v)
    return out


def check(
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    target: Target,
    *,
    settings: Settings | None = None,
    source: str = "plan",
) -> None:
    """Raise on the first error: PlanError for rules any target shares, ExportError for target rules.
    Warnings do not raise (``warnings`` lists them)."""
    found = [v for v in validate(plan, model, cluster, target, settings=settings) if v.severity == "error"]
    if not found:
        return
    v = found[0]
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    msg = f"[{v.rule}] {v.message}{more}"
    if v.kind == "plan":
        raise PlanError(msg, source=source, field=v.field)
    raise ExportError(f"{target}: {msg}", source=source, field=v.field)


def warnings(
    plan: Plan, model: ModelSpec, cluster: ClusterSpec, target: Target, *, settings: Settings | None = None
) -> list[Violation]:
    """The warning-level violations of ``plan`` for ``target`` (a plan that runs, but not as planned)."""
    return [v for v in validate(plan, model, cluster, target, settings=settings) if v.severity == "warning"]


def rule_names(target: Target | None = None) -> list[str]:
    return [r.name for r in RULES if target is None or target in r.targets]
