"""Rules of the runtimes that run one mesh shape (Megatron-LM, its ROCm fork, MindSpeed-LLM): the
plan-level rules of a single mesh, and the checks their argument parsers run on our command line
(``validate_args``, ``TransformerConfig.__post_init__``, the layout parser; reference/megatron.md §2).

The layout and uneven-split rules read Megatron-LM's own flags (``megatron`` and ``rocm``, whose
``arguments.py`` carries the same grammar); MindSpeed-LLM's ``--num-layer-list`` has its own rules in
:mod:`hapmoe_milp.export.validate.mindspeed_rules`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hapmoe_milp.config import graph_parts, parse_recompute
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.export.common import plan_chunks, recompute_flag_args, recompute_from_flags
from hapmoe_milp.export.megatron import layout_chunks, layout_problems, megatron_chunks, parse_layout
from hapmoe_milp.export.megatron_arch import megatron_gaps
from hapmoe_milp.export.validate.registry import MEGATRON_ARGS, ONE_MESH, Context, Violation, rule, violation


# ---------------------------------------------------------------------- architectures (issue 22)
@rule(*ONE_MESH)
def rule_megatron_architecture(ctx: Context) -> Iterator[Violation]:
    """A model Megatron-Core cannot build (export/megatron_arch.py), with the runtime that can. The
    Megatron-style runtimes all build models with Megatron-Core."""
    for gap in megatron_gaps(ctx.model):
        if gap.blocking:
            yield violation(
                "model", f"Megatron-LM cannot build {ctx.model.name}: {gap.feature}; it runs under {gap.runtime}"
            )


@rule(*ONE_MESH, severity="warning")
def rule_megatron_attention_differs(ctx: Context) -> Iterator[Violation]:
    """Megatron runs the model, but not the attention the plan priced."""
    for gap in megatron_gaps(ctx.model):
        if not gap.blocking:
            yield violation("model", f"{gap.feature}; the plan's attention cost is what {gap.runtime} runs")


@rule(*MEGATRON_ARGS)
def rule_hybrid_pipeline_split(ctx: Context) -> Iterator[Violation]:
    """Megatron's hybrid stack (MambaStack._select_layers_for_pipeline_parallel, megatron-core 0.16.1) has no
    virtual stages and no layout: layers split evenly, or with a different first and/or last stage."""
    m, p = ctx.model, ctx.plan
    if not m.is_hybrid or p.pp == 1:
        return
    if p.vpp > 1:
        yield violation("vpp", "hybrid (Mamba) models run without virtual pipeline stages")
        return
    counts = p.layer_counts()
    for first, last in ((None, None), (counts[0], None), (None, counts[-1]), (counts[0], counts[-1])):
        got = megatron_chunks(p.pp, m.num_layers, 0, 1, first, last)
        if got is not None and [row[0].decoder for row in got] == counts:
            return
    yield violation(
        "stages",
        f"layers per stage {counts} need a layout, which Megatron's hybrid stack does not take "
        "(only an even split with a different first and/or last stage)",
    )


# ---------------------------------------------------------------------- one mesh shape: plan level
@rule(*ONE_MESH)
def rule_uniform_mesh(ctx: Context) -> Iterator[Violation]:
    first = ctx.plan.stages[0].cfg
    for i, s in enumerate(ctx.plan.stages):
        if s.cfg != first:
            yield violation(
                f"stages[{i}]",
                f"{ctx.runtime.title} runs one mesh shape for all stages; {s.cfg.label()} != {first.label()} "
                f"(FlagScale runs per-stage meshes) ({ctx.runtime.cite('family')})",
            )
            return


@rule(*ONE_MESH)
def rule_world_divisible_by_tp_pp_cp(ctx: Context) -> Iterator[Violation]:
    c = ctx.plan.stages[0].cfg
    n = c.tp * ctx.plan.pp * c.cp
    if ctx.world % n:
        yield violation(
            "stages",
            f"world size {ctx.world} is not divisible by TP x PP x CP = {n} (validate_args)",
        )


@rule(*ONE_MESH)
def rule_vpp_needs_pp_gt_1(ctx: Context) -> Iterator[Violation]:
    if ctx.plan.vpp > 1 and ctx.plan.pp < 2:
        yield violation("vpp", "virtual pipeline stages need pipeline size > 1 (parallel_state)")


@rule(*ONE_MESH)
def rule_vpp_microbatches_divisible_by_pp(ctx: Context) -> Iterator[Violation]:
    p = ctx.plan
    if p.vpp > 1 and p.pp > 1:
        m = p.global_batch_size // max(1, p.samples_per_microbatch)
        if m % p.pp or m < p.pp:
            yield violation(
                "vpp",
                f"the interleaved schedule needs num_microbatches ({m}) to be a multiple of pp ({p.pp})",
            )


@rule(*ONE_MESH)
def rule_ep_overlap_requirements(ctx: Context) -> Iterator[Violation]:
    if not ctx.settings.overlap_ep_comm or not ctx.model.is_moe:
        return
    p, c = ctx.plan, ctx.plan.stages[0].cfg
    problems = []
    if c.ep < 2:
        problems.append("EP > 1")
    if p.dispatcher not in ("alltoall", "flex"):
        problems.append("the alltoall or flex dispatcher")
    specs = [parse_recompute(s.recompute) for s in p.stages]
    if any(r.granularity == "full" for r in specs):
        problems.append("no full recompute")
    if any("moe" in r.modules for r in specs):  # core_v0.19.0 TransformerConfig
        problems.append("no moe recompute module")
    if p.pp > 1 and p.vpp < 2:
        problems.append("virtual pipeline stages when PP > 1")
    if ctx.model.mtp_num_layers > 1:
        problems.append("at most one MTP layer")
    if ctx.model.mtp_num_layers == 1 and p.pp < 2:
        problems.append("PP > 1 with an MTP layer")
    scope = ctx.settings.cuda_graph_scope
    if scope == "layer" or {"moe", "mlp"} & graph_parts(scope):
        problems.append("no CUDA graph other than Transformer Engine's, none of moe or mlp")
    if problems:
        yield violation(
            "settings.overlap_ep_comm",
            "--overlap-moe-expert-parallel-comm needs " + ", ".join(problems),
        )


@rule(*ONE_MESH)
def rule_cuda_graph_scope_fits_the_model(ctx: Context) -> Iterator[Violation]:
    """Megatron-Core checks the graphed parts against the model (core_v0.16.0 (3bec9aa97d)
    ``transformer_config.py`` ``__post_init__``): MoE parts need MoE layers, and ``mlp`` needs dense ones
    (refused when every layer is MoE)."""
    scope = ctx.settings.cuda_graph_scope
    if scope in ("none", "layer"):
        return
    parts = graph_parts(scope)
    mlps = {ctx.model.kind_parts(k)[1] for k in ctx.model.decoder_kinds}
    if not ctx.model.is_moe and {"moe", "moe_router", "moe_preprocess"} & parts:
        yield violation("settings.cuda_graph_scope", f"{scope}: MoE graph parts need an MoE model")
    if "mlp" in parts and "dense" not in mlps:
        yield violation(
            "settings.cuda_graph_scope", f"{scope}: mlp is graphed only in dense layers, and this model has none"
        )


# ---------------------------------------------------------------------- Megatron artifact rules
@rule(*ONE_MESH, tier="artifact")
def rule_args_match_plan(ctx: Context) -> Iterator[Violation]:
    a, p, c = ctx.parsed_args(), ctx.plan, ctx.plan.stages[0].cfg
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
            yield violation(f"--{k.replace('_', '-')}", f"is {got}, the plan has {v}")


@rule(*ONE_MESH, tier="artifact")
def rule_moe_tp_needs_sequence_parallel(ctx: Context) -> Iterator[Violation]:
    a = ctx.parsed_args()
    if ctx.model.is_moe and int(a.get("tensor_model_parallel_size", 1)) > 1 and not a.get("sequence_parallel"):
        yield violation(
            "--sequence-parallel",
            "MoE with TP > 1 needs --sequence-parallel (MoELayer raises during training without it)",
        )


@rule(*ONE_MESH, tier="artifact")
def rule_sequence_parallel_needs_tp(ctx: Context) -> Iterator[Violation]:
    a = ctx.parsed_args()
    if a.get("sequence_parallel") and int(a.get("tensor_model_parallel_size", 1)) == 1:
        yield violation(
            "--sequence-parallel",
            "sequence parallelism with TP = 1 is rejected by ModelParallelConfig (drop the flag)",
        )


@rule(*ONE_MESH, tier="artifact")
def rule_moe_bias_needs_etp_1(ctx: Context) -> Iterator[Violation]:
    a = ctx.parsed_args()
    tp = int(a.get("tensor_model_parallel_size", 1))
    etp = int(a.get("expert_tensor_parallel_size", tp))
    if ctx.model.is_moe and etp > 1 and not a.get("disable_bias_linear"):
        yield violation(
            "--disable-bias-linear",
            f"MoE linear bias is only supported with ETP = 1, ETP is {etp} (TransformerConfig); add --disable-bias-linear",
        )


@rule(*ONE_MESH, tier="artifact")
def rule_topk1_needs_pre_softmax(ctx: Context) -> Iterator[Violation]:
    a = ctx.parsed_args()
    if (
        ctx.model.is_moe
        and int(a.get("moe_router_topk", 2)) == 1
        and a.get("moe_router_score_function", "softmax") == "softmax"
        and not a.get("moe_router_pre_softmax")
    ):
        yield violation(
            "--moe-router-pre-softmax",
            "top-1 routing with softmax scores needs --moe-router-pre-softmax (TransformerConfig)",
        )


@rule(*ONE_MESH, tier="artifact")
def rule_overlap_param_gather_needs_dist_opt(ctx: Context) -> Iterator[Violation]:
    a = ctx.parsed_args()
    if a.get("overlap_param_gather") and not (a.get("use_distributed_optimizer") and a.get("overlap_grad_reduce")):
        yield violation(
            "--overlap-param-gather",
            "needs --use-distributed-optimizer and --overlap-grad-reduce (validate_args)",
        )


@rule(*ONE_MESH, tier="artifact")
def rule_recompute_flags(ctx: Context) -> Iterator[Violation]:
    a = ctx.parsed_args()
    gran, method, k = a.get("recompute_granularity"), a.get("recompute_method"), a.get("recompute_num_layers")
    f = "--recompute-granularity"
    if gran is None:
        if method is not None or k is not None:
            yield violation(f, "--recompute-method/--recompute-num-layers without a granularity")
    elif gran == "full":
        if method not in ("block", "uniform") or not isinstance(k, int) or k < 1:
            yield violation(
                f,
                "full recompute needs --recompute-method block|uniform and --recompute-num-layers >= 1",
            )
    elif gran == "selective":
        if method is not None or k is not None:
            yield violation(f, "selective recompute must not set --recompute-method/--recompute-num-layers")
        mods = a.get("recompute_modules", ["core_attn"])
        mods = mods if isinstance(mods, list) else [mods]
        if "moe_act" in mods and not a.get("moe_grouped_gemm"):
            yield violation("--recompute-modules", "moe_act recompute needs --moe-grouped-gemm")
    else:
        yield violation(f, f"must be full or selective, got {gran!r}")
    levels = {s.recompute for s in ctx.plan.stages}
    if len(levels) == 1:
        want = levels.pop()
        # compare what the flags make Megatron do: a ladder level and its module set give the same flags
        biggest = max(c.decoder for row in plan_chunks(ctx.plan, ctx.model) for c in row)
        try:
            got = recompute_from_flags(gran, method, k, a.get("recompute_modules"), biggest)
        except HapmoeError:
            got = str(gran)
        if recompute_flag_args(got, ctx.model, biggest) != recompute_flag_args(want, ctx.model, biggest):
            yield violation(f, f"gives recompute {got!r}, the plan has {want!r}")


@rule(*ONE_MESH, tier="artifact")
def rule_offload_flags(ctx: Context) -> Iterator[Violation]:
    """The arguments keep optimizer states where the plan was priced (host memory or device)."""
    a = ctx.parsed_args()
    want, have = ctx.settings.optimizer_offload, bool(a.get("optimizer_cpu_offload"))
    if want and not have:
        yield violation(
            "--optimizer-cpu-offload",
            "is missing: the plan keeps optimizer states in host memory (it was priced, and may only fit, that way)",
        )
    elif have and not want:
        yield violation("--optimizer-cpu-offload", "is set, but the plan keeps optimizer states on the device")
    if have and not a.get("use_precision_aware_optimizer"):
        yield violation(
            "--use-precision-aware-optimizer",
            "is required with --optimizer-cpu-offload (validate_args)",
        )


def _layout(ctx: Context) -> str | None:
    v = ctx.parsed_args().get("pipeline_model_parallel_layout")
    return None if v is None else str(v)


@rule(*MEGATRON_ARGS, tier="artifact")
def rule_layout_grammar(ctx: Context) -> Iterator[Violation]:
    lay = _layout(ctx)
    if lay is None:
        return
    try:
        parse_layout(lay)
    except ValueError as exc:
        yield violation("--pipeline-model-parallel-layout", f"{lay!r}: {exc}")


@rule(*MEGATRON_ARGS, tier="artifact")
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
        yield violation("--pipeline-model-parallel-layout", f"{lay!r}: {msg}")


@rule(*MEGATRON_ARGS, tier="artifact")
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
        yield violation(
            "--pipeline-model-parallel-layout",
            f"has {len(stages)} virtual stages = VPP {len(stages) // p.pp}, the plan has vpp {p.vpp}",
        )
        return
    got = [sum(c.total for c in row) for row in layout_chunks(lay, p.pp)]
    want = p.layer_counts()
    if got != want:
        yield violation(
            "--pipeline-model-parallel-layout",
            f"gives {got} layers per pipeline rank, the plan has {want}",
        )


@rule(*MEGATRON_ARGS, tier="artifact")
def rule_layout_exclusive(ctx: Context) -> Iterator[Violation]:
    a = ctx.parsed_args()
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
        yield violation(
            "--pipeline-model-parallel-layout",
            "cannot be combined with " + ", ".join("--" + k.replace("_", "-") for k in clash),
        )


def _split_flags(ctx: Context) -> tuple[int | None, int | None, int]:
    a = ctx.parsed_args()
    vpp = a.get("num_virtual_stages_per_pipeline_rank", 1)
    return a.get("decoder_first_pipeline_num_layers"), a.get("decoder_last_pipeline_num_layers"), int(vpp)


@rule(*MEGATRON_ARGS, tier="artifact")
def rule_uneven_pp_split(ctx: Context) -> Iterator[Violation]:
    """TransformerConfig's uneven-PP checks, and that the flags give the plan's per-rank layers."""
    first, last, vpp = _split_flags(ctx)
    if _layout(ctx) is not None or (first is None and last is None):
        return
    p, m = ctx.plan, ctx.model
    ch = megatron_chunks(p.pp, m.num_layers, m.mtp_num_layers, vpp, first, last)
    if ch is None:
        yield violation(
            "--decoder-first-pipeline-num-layers",
            f"first {first} / last {last} with {m.num_layers} layers over PP {p.pp} (VPP {vpp}) is rejected by "
            "TransformerConfig (values > 0, middle layers divisible by middle stages and by VPP)",
        )
    elif (got := [sum(c.total for c in row) for row in ch]) != p.layer_counts():
        yield violation(
            "--decoder-first-pipeline-num-layers",
            f"gives {got} layers per pipeline rank, the plan has {p.layer_counts()}",
        )


@rule(*MEGATRON_ARGS, tier="artifact")
def rule_even_split(ctx: Context) -> Iterator[Violation]:
    first, last, vpp = _split_flags(ctx)
    if _layout(ctx) is not None or first is not None or last is not None:
        return
    p, m = ctx.plan, ctx.model
    if p.pp == 1:
        return
    ch = megatron_chunks(p.pp, m.num_layers, m.mtp_num_layers, vpp, None, None)
    if ch is None:
        yield violation(
            "--num-layers",
            f"{m.num_layers} layers are not divisible by PP {p.pp} x VPP {vpp}; give a layout or first/last flags",
        )
    elif (got := [sum(c.total for c in row) for row in ch]) != p.layer_counts():
        yield violation(
            "--num-layers",
            f"the even split gives {got} layers per rank, the plan has {p.layer_counts()}",
        )
    if vpp != p.vpp:
        yield violation("--num-virtual-stages-per-pipeline-rank", f"is {vpp}, the plan has vpp {p.vpp}")
