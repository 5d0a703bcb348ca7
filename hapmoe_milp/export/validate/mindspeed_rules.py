"""MindSpeed-LLM's own argument checks on our command line (Ascend/MindSpeed-LLM @
:data:`hapmoe_milp.runtimes.MINDSPEED_COMMIT`): its ``--num-layer-list`` feature and its context-parallel
algorithm. The Megatron core_v0.12.1 checks underneath are the one-mesh rules of
:mod:`hapmoe_milp.export.validate.megatron_rules`."""

from __future__ import annotations

from collections.abc import Iterator

from hapmoe_milp.export.common import stage_layers
from hapmoe_milp.export.validate.registry import Context, Violation, rule, violation

CP_ALGOS = ("megatron_cp_algo", "hybrid_cp_algo", "kvallgather_cp_algo")


@rule("mindspeed", tier="artifact")
def rule_ms_num_layer_list(ctx: Context) -> Iterator[Violation]:
    """num_layer_list.py: one entry per stage, PP > 1, no virtual pipeline; training/arguments.py: the
    entries sum to --num-layers. Without the flag the even split must give the plan's stages."""
    a, p, m = ctx.parsed_args(), ctx.plan, ctx.model
    f = "--num-layer-list"
    want = [sl.decoder for sl in stage_layers(p, m)]
    raw = a.get("num_layer_list")
    if raw is None:
        if p.pp > 1 and (m.num_layers % p.pp or any(c != m.num_layers // p.pp for c in want)):
            yield violation(f, f"is missing: the even split of {m.num_layers} layers over PP {p.pp} is not {want}")
        return
    try:
        got = [int(x) for x in str(raw).split(",")]
    except ValueError:
        yield violation(f, f"{raw!r} is not a comma-separated list of layer counts")
        return
    pp = int(a.get("pipeline_model_parallel_size", 1))
    if len(got) != pp:
        yield violation(f, f"has {len(got)} entries, pipeline size is {pp}")
    elif pp < 2:
        yield violation(
            f, "needs pipeline parallelism (MindSpeed-LLM: 'Dynamic pipeline model should work with pipeline parallel')"
        )
    elif a.get("num_layers_per_virtual_pipeline_stage") or a.get("num_virtual_stages_per_pipeline_rank"):
        yield violation(f, "cannot be combined with a virtual pipeline (MindSpeed-LLM num_layer_list.py)")
    elif sum(got) != int(a.get("num_layers", 0)):
        yield violation(f, f"sums to {sum(got)}, --num-layers is {a.get('num_layers')}")
    elif got != want:
        yield violation(f, f"is {got}, the plan's decoder layers per stage are {want}")


@rule("mindspeed", tier="artifact")
def rule_ms_context_parallel_algo(ctx: Context) -> Iterator[Violation]:
    a = ctx.parsed_args()
    algo = a.get("context_parallel_algo", "megatron_cp_algo")
    if algo not in CP_ALGOS:
        yield violation("--context-parallel-algo", f"must be one of {', '.join(CP_ALGOS)}, got {algo!r}")
    elif int(a.get("context_parallel_size", 1)) > 1 and algo == "kvallgather_cp_algo":
        seq, cp = int(a.get("seq_length", 0)), int(a.get("context_parallel_size", 1))
        if seq % (2 * cp):
            yield violation("--seq-length", f"{seq} is not divisible by 2 x cp = {2 * cp} (kvallgather_cp_algo)")
