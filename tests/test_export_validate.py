"""Validators: one bad plan (or one edited artifact) per rule, each must trip exactly the rule it targets.

The table has to name every registered rule, so adding a rule without a test fails here.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from hapmoe_milp.config import ParallelConfig, Settings
from hapmoe_milp.errors import ExportError, PlanError
from hapmoe_milp.export import flagscale_config, megatron_args
from hapmoe_milp.export.validate import RULES, Violation, check, rule_names, validate
from hapmoe_milp.plan import Plan, Stage, check_plan
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

CAT = Catalog()
MIX = CAT.model("mixtral-s")
C16 = CAT.cluster("16-1")  # 8 H800 + 8 910B: FlagScale's (cross-vendor)
C32 = CAT.cluster("32-1")
H16 = CAT.cluster("16-1-h")  # 16 H800: Megatron-LM's
A16 = CAT.cluster("16-2-h")  # 16 910B: MindSpeed-LLM's
MIX_TIED = replace(MIX, untie_embeddings_and_output_weights=False)
MIX_MTP1 = replace(MIX, mtp_num_layers=1)
MIX_MTP2 = replace(MIX, mtp_num_layers=2)
MIX_TOP1 = replace(MIX, moe_router_topk=1)
MIX_GQA12 = replace(MIX, num_attention_heads=48, num_query_groups=12, kv_channels=None)
DENSE = CAT.model("llama-2-7b")
MIX_PREFIX = replace(MIX, moe_layer_freq=(0, 0, *([1] * 22)))  # two dense layers first, like DeepSeek's


def pc(tp: int = 1, cp: int = 1, dp: int = 1, ep: int = 1, etp: int = 1) -> ParallelConfig:
    return ParallelConfig(tp=tp, cp=cp, dp=dp, ep=ep, etp=etp)


def plan(
    counts: list[int],
    devices: list[str],
    cfgs: ParallelConfig | list[ParallelConfig],
    *,
    model: ModelSpec = MIX,
    family: str = "megatron",
    rec: str | list[str] = "none",
    gbs: int = 256,
    mbs: int = 1,
    seq: int = 4096,
    vpp: int = 1,
    start: int = 0,
    cluster: str = "16-1",
) -> Plan:
    cl = cfgs if isinstance(cfgs, list) else [cfgs] * len(counts)
    rl = rec if isinstance(rec, list) else [rec] * len(counts)
    stages, pos = [], start
    for n, d, c, r in zip(counts, devices, cl, rl):
        stages.append(Stage(d, c, pos, pos + n, r))  # type: ignore[arg-type]
        pos += n
    return Plan(model.name, cluster, family, tuple(stages), gbs, seq, mbs, vpp=vpp)  # type: ignore[arg-type]


HB = ["h800", "910b"]
HH = ["h800", "h800"]
G4 = pc(tp=2, dp=2, ep=4)  # 4 devices
G8 = pc(tp=2, dp=4, ep=8)  # 8 devices
GOOD_MG = plan([8, 7, 5, 4], ["h800"] * 4, G4, cluster="16-1-h")  # layout
GOOD_FIRST = plan([14, 10], HH, G8, cluster="16-1-h")  # --decoder-first-pipeline-num-layers
# FlagScale: every mesh after the first holds two or more stages (its layer offset needs mesh pp > 1)
FS_H, FS_B = pc(tp=4, dp=1, ep=2), pc(tp=2, dp=2, ep=2)  # 4 devices each
GOOD_FS = plan([7, 7, 5, 5], ["h800", "h800", "910b", "910b"], [FS_H, FS_H, FS_B, FS_B], family="hetero", mbs=2)
GOOD_MS = plan([10, 8, 6], ["910b"] * 3, G4, cluster="16-2-h")  # --num-layer-list


def edit_args(base: Plan, model: ModelSpec = MIX, cluster: ClusterSpec = C16) -> Callable[..., list[str]]:
    """A function that returns the generated args with flags dropped / replaced / added."""

    def f(
        drop: tuple[str, ...] = (), set_: dict[str, list[str]] | None = None, add: list[str] | None = None
    ) -> list[str]:
        toks = megatron_args(base, model, cluster)
        out: list[str] = []
        skip = False
        for t in toks:
            if t.startswith("--"):
                skip = t in drop or t in (set_ or {})
            if not skip:
                out.append(t)
        for k, v in (set_ or {}).items():
            out += [k, *v]
        return out + (add or [])

    return f


def edit_fs(
    base: Plan, model: ModelSpec, fn: Callable[[dict[str, Any]], None], cluster: ClusterSpec = C16
) -> dict[str, Any]:
    cfg = copy.deepcopy(flagscale_config(base, model, cluster))
    fn(cfg)
    return cfg


@dataclass(frozen=True)
class Case:
    rule: str
    plan: Plan
    target: str = "megatron"
    model: ModelSpec = MIX
    cluster: ClusterSpec | None = None  # the plan's own
    kw: dict[str, Any] = field(default_factory=dict)


def _hetero(p: Plan) -> Plan:
    return replace(p, family="hetero")


TIED_DP = plan(
    [6, 6, 6, 6],
    ["h800", "h800", "910b", "910b"],
    [pc(tp=2, dp=2, ep=2)] * 2 + [pc(tp=2, dp=1, ep=2)] * 2,
    model=MIX_TIED,
    family="hetero",
    mbs=1,
)
LAYOUT_ARGS = edit_args(GOOD_MG, cluster=H16)
FIRST_ARGS = edit_args(GOOD_FIRST, cluster=H16)


def edit_ms(base: Plan) -> Callable[..., list[str]]:
    """Like edit_args, on MindSpeed-LLM's command line."""
    from hapmoe_milp.export.mindspeed import mindspeed_args

    def f(drop: tuple[str, ...] = (), add: list[str] | None = None) -> list[str]:
        out, skip = [], False
        for t in mindspeed_args(base, MIX, A16):
            if t.startswith("--"):
                skip = t in drop
            if not skip:
                out.append(t)
        return out + (add or [])

    return f


PREFIX_SPLIT = plan(
    [8, 6, 10], ["h800", "h800", "910b"], [pc(tp=4, ep=2), pc(tp=4, ep=2), pc(tp=2, dp=4, ep=2)], family="hetero", mbs=4
)  # its 910B mesh is one stage: FlagScale would build its layers as [0, 10)

OFFLOAD_MG = GOOD_MG.with_settings(GOOD_MG.settings().with_(optimizer_offload=True))
OFFLOAD_FS = GOOD_FS.with_settings(GOOD_FS.settings().with_(optimizer_offload=True))

# a hybrid (Mamba) mixtral-s: Mamba-2 / MoE / attention / MoE, six times (issue 22)
HYBRID = replace(MIX, hybrid_override_pattern="ME*E" * 6, swiglu=False, squared_relu=True)
CHUNKED = replace(MIX, attention_chunk_size=1024, no_rope_freq=4)

CASES: list[Case] = [
    Case(
        "rule_megatron_architecture", plan([12, 12], HH, G8, cluster="16-1-h"), model=replace(HYBRID, mamba_version=1)
    ),
    Case("rule_megatron_attention_differs", GOOD_MG, model=CHUNKED),
    Case("rule_runtime_hybrid", GOOD_FS, "flagscale", model=HYBRID),
    Case("rule_hybrid_pipeline_split", GOOD_MG, model=HYBRID),
    Case(
        "rule_offload_flags",
        OFFLOAD_MG,
        cluster=H16,
        kw={
            "args": edit_args(OFFLOAD_MG, cluster=H16)(
                drop=("--optimizer-cpu-offload", "--use-precision-aware-optimizer")
            )
        },
    ),
    Case(
        "rule_fs_offload_keys",
        OFFLOAD_FS,
        "flagscale",
        kw={"fs_config": edit_fs(OFFLOAD_FS, MIX, lambda c: c["system"].pop("optimizer_cpu_offload"))},
    ),
    # ---- what estimate checks (plan.check_plan), for plans the named rules of the target let through
    Case("rule_plan_invariants", replace(GOOD_FS, family="megatron"), "flagscale"),
    Case(
        "rule_offload_needs_dist_opt",
        GOOD_MG,
        cluster=H16,
        kw={"settings": Settings(optimizer_offload=True, distributed_optimizer=False)},
    ),
    # ---- what a runtime declares (the search reads the same fields)
    Case("rule_runtime_mesh_stages", PREFIX_SPLIT, "flagscale", model=MIX_PREFIX),
    Case("rule_runtime_vendors", plan([12, 12], HB, G8)),
    Case("rule_runtime_vpp", _hetero(replace(GOOD_FS, vpp=2)), "flagscale"),
    Case("rule_runtime_cp", _hetero(plan([6, 6, 6, 6], HB * 2, pc(tp=2, cp=2, ep=2))), "flagscale"),
    Case(
        "rule_runtime_recompute",
        replace(GOOD_FS, stages=(*GOOD_FS.stages[:3], replace(GOOD_FS.stages[3], recompute="selective"))),
        "flagscale",
    ),
    Case(
        "rule_runtime_ep_all_or_none",
        _hetero(
            plan([6, 6, 6, 6], ["h800", "h800", "910b", "910b"], [pc(tp=2, dp=2)] * 2 + [pc(tp=2, dp=2, ep=2)] * 2)
        ),
        "flagscale",
    ),
    Case(
        "rule_runtime_edge_tp",
        plan(
            [6, 6, 6, 6],
            ["h800", "h800", "910b", "910b"],
            [pc(tp=4, dp=1, ep=2)] * 2 + [pc(tp=2, dp=2, ep=2)] * 2,
            model=MIX_TIED,
            family="hetero",
            mbs=2,
        ),
        "flagscale",
        model=MIX_TIED,
    ),
    Case(
        "rule_runtime_edge_dp",
        plan(
            [6, 6, 6, 6],
            ["h800", "h800", "910b", "910b"],
            [pc(tp=1, dp=3, ep=1)] * 2 + [pc(tp=2, dp=2, ep=1)] * 2,
            model=replace(DENSE, untie_embeddings_and_output_weights=False, num_layers=24),
            family="hetero",
            mbs=2,
            gbs=252,
        ),
        "flagscale",
        model=replace(DENSE, untie_embeddings_and_output_weights=False, num_layers=24),
    ),
    Case(
        "rule_runtime_mtp_with_decoder",
        plan([12, 12, 1], ["h800", "910b", "910b"], G4, model=MIX_MTP1),
        "flagscale",
        model=MIX_MTP1,
    ),
    Case("rule_runtime_precision", replace(GOOD_FS, precision="fp8"), "flagscale"),
    Case("rule_runtime_dispatcher", replace(GOOD_FS, dispatcher="flex"), "flagscale"),
    # MindSpeed-LLM's Megatron core_v0.12.1 has neither --overlap-moe-expert-parallel-comm nor --cuda-graph-impl
    Case("rule_runtime_overlap_and_graphs", GOOD_MS, "mindspeed", kw={"settings": Settings(overlap_ep_comm=True)}),
    Case("rule_runtime_legacy_model", GOOD_MG, kw={"settings": Settings(legacy_model=True)}),
    Case("rule_runtime_gshard_moe", GOOD_MS, "mindspeed", kw={"settings": Settings(gshard_capacity_factor=1.1)}),
    # ---- MindSpeed-LLM target, edited arguments
    Case(
        "rule_ms_num_layer_list",
        GOOD_MS,
        "mindspeed",
        cluster=A16,
        kw={"args": edit_ms(GOOD_MS)(drop=("--num-layer-list",))},
    ),
    Case(
        "rule_ms_context_parallel_algo",
        GOOD_MS,
        "mindspeed",
        cluster=A16,
        kw={"args": edit_ms(GOOD_MS)(add=["--context-parallel-algo", "ulysses"])},
    ),
    # ---- structural
    Case("rule_stage_layers_contiguous", plan([12, 12], HB, G8, start=1)),
    Case("rule_layers_cover_model", plan([12, 8], HB, G8)),
    Case("rule_device_type_in_cluster", plan([12, 12], ["h800", "a100"], G8)),
    Case("rule_inventory_per_type", plan([8, 8, 8], ["h800", "h800", "910b"], G8)),
    # ---- Megatron's per-mesh rules (every target)
    Case("rule_heads_divisible_by_tp", plan([12, 12], HB, pc(tp=3, dp=1))),
    Case("rule_query_groups_divisible_by_tp", plan([12, 12], HB, pc(tp=8, ep=8)), model=MIX_GQA12),
    Case("rule_experts_divisible_by_ep", plan([12, 12], HB, pc(tp=2, dp=3, ep=3), gbs=252)),
    Case("rule_ep_needs_experts", plan([16, 16], HB, pc(tp=2, dp=4, ep=2)), model=DENSE),
    Case("rule_expert_grid_divides_world", plan([12, 12], HB, pc(tp=2, dp=2, ep=8))),
    Case("rule_gbs_divisible_by_mbs_dp", replace(GOOD_MG, global_batch_size=255)),
    Case("rule_seq_divisible_by_2cp", plan([12, 12], HB, pc(tp=2, cp=2, dp=2, ep=8), seq=4098)),
    Case(
        "rule_tp_within_node",
        plan(
            [12, 12],
            ["h800", "h800"],
            [pc(tp=4, dp=1, ep=4), pc(tp=2, dp=3, ep=2)],
            family="hetero",
            mbs=4,
            gbs=252,
            cluster="32-1",
        ),
        target="flagscale",
        cluster=C32,
    ),
    Case(
        "rule_etp_within_node",
        plan(
            [12, 12],
            ["h800", "h800"],
            [pc(dp=8, ep=2, etp=4), pc(dp=6, ep=2)],
            family="hetero",
            mbs=4,
            gbs=240,
            cluster="32-1",
        ),
        target="flagscale",
        cluster=C32,
    ),
    Case("rule_mtp_in_one_stage", plan([25, 1], HB, G8), model=MIX_MTP2),
    # ---- Megatron target, plan level
    Case("rule_uniform_mesh", GOOD_FS),
    Case("rule_world_divisible_by_tp_pp_cp", plan([12, 12], HB, [pc(tp=2, dp=2, ep=4), pc(tp=2, dp=1, ep=2)])),
    Case("rule_vpp_needs_pp_gt_1", plan([24], ["h800"], G8, vpp=2)),
    Case("rule_vpp_microbatches_divisible_by_pp", plan([8, 8, 8], ["h800", "h800", "910b"], G4, vpp=2)),
    Case("rule_ep_overlap_requirements", GOOD_MG, kw={"settings": Settings(overlap_ep_comm=True)}),
    # Megatron-Core refuses mlp graphs when every layer is MoE (Mixtral-S); the dense case is below
    Case("rule_cuda_graph_scope_fits_the_model", GOOD_MG, kw={"settings": Settings(cuda_graph_scope="attn,mlp")}),
    # ---- Megatron target, edited arguments
    Case("rule_args_match_plan", GOOD_MG, kw={"args": LAYOUT_ARGS(set_={"--global-batch-size": ["512"]})}),
    Case("rule_moe_tp_needs_sequence_parallel", GOOD_MG, kw={"args": LAYOUT_ARGS(drop=("--sequence-parallel",))}),
    Case(
        "rule_sequence_parallel_needs_tp",
        plan([12, 12], HB, pc(dp=8, ep=8)),
        kw={"args": edit_args(plan([12, 12], HB, pc(dp=8, ep=8)))(add=["--sequence-parallel"])},
    ),
    Case(
        "rule_moe_bias_needs_etp_1",
        plan([12, 12], HB, pc(tp=2, dp=4, ep=2, etp=2)),
        kw={"args": edit_args(plan([12, 12], HB, pc(tp=2, dp=4, ep=2, etp=2)))(drop=("--disable-bias-linear",))},
    ),
    Case(
        "rule_topk1_needs_pre_softmax",
        plan([12, 12], HB, G8, model=MIX_TOP1),
        model=MIX_TOP1,
        kw={"args": edit_args(plan([12, 12], HB, G8, model=MIX_TOP1), MIX_TOP1)(drop=("--moe-router-pre-softmax",))},
    ),
    Case(
        "rule_overlap_param_gather_needs_dist_opt",
        GOOD_MG,
        kw={"args": LAYOUT_ARGS(drop=("--use-distributed-optimizer",))},
    ),
    Case("rule_recompute_flags", GOOD_MG, kw={"args": LAYOUT_ARGS(add=["--recompute-granularity", "full"])}),
    Case(
        "rule_layout_grammar",
        GOOD_MG,
        kw={"args": LAYOUT_ARGS(set_={"--pipeline-model-parallel-layout": ["Et*8|t*7|t*5|x*4L"]})},
    ),
    Case(
        "rule_layout_counts",
        GOOD_MG,
        kw={"args": LAYOUT_ARGS(set_={"--pipeline-model-parallel-layout": ["Et*8|t*7|t*5|t*5L"]})},
    ),
    Case(
        "rule_layout_matches_plan",
        GOOD_MG,
        kw={"args": LAYOUT_ARGS(set_={"--pipeline-model-parallel-layout": ["Et*6|t*6|t*6|t*6L"]})},
    ),
    Case(
        "rule_layout_exclusive",
        GOOD_MG,
        kw={"args": LAYOUT_ARGS(add=["--decoder-first-pipeline-num-layers", "8"])},
    ),
    Case(
        "rule_uneven_pp_split",
        GOOD_FIRST,
        kw={"args": FIRST_ARGS(set_={"--decoder-first-pipeline-num-layers": ["0"]})},
    ),
    Case("rule_even_split", GOOD_FIRST, kw={"args": FIRST_ARGS(drop=("--decoder-first-pipeline-num-layers",))}),
    # ---- FlagScale target, plan level
    Case(
        "rule_fs_same_cp", _hetero(plan([12, 12], HB, [pc(tp=2, dp=4, ep=2), pc(tp=2, cp=2, dp=2, ep=2)])), "flagscale"
    ),
    Case(
        "rule_fs_microbatch_divisible",
        _hetero(plan([12, 12], HB, [pc(tp=8, dp=1, ep=8), pc(tp=4, dp=2, ep=8)])),
        "flagscale",
    ),
    Case(
        "rule_fs_mtp_on_last_stage", plan([25, 0], HB, G8, model=MIX_MTP1, family="hetero"), "flagscale", model=MIX_MTP1
    ),
    Case(
        "rule_fs_device_types_grouped",
        plan([8, 8, 8], ["h800", "910b", "h800"], G4, family="hetero"),
        "flagscale",
    ),
    # ---- FlagScale target, edited config
    Case(
        "rule_fs_mesh_ranks",
        GOOD_FS,
        "flagscale",
        kw={
            "fs_config": edit_fs(
                GOOD_FS,
                MIX,
                lambda c: c["system"]["hetero"].update(hetero_process_meshes=[4, 1, 2, 2, 1, 2, 1, 2, 2, 1]),
            )
        },
    ),
    Case(
        "rule_fs_pp_matches_meshes",
        GOOD_FS,
        "flagscale",
        kw={"fs_config": edit_fs(GOOD_FS, MIX, lambda c: c["system"].update(pipeline_model_parallel_size=3))},
    ),
    Case(
        "rule_fs_layer_split",
        GOOD_FS,
        "flagscale",
        kw={
            "fs_config": edit_fs(
                GOOD_FS, MIX, lambda c: c["system"]["hetero"].update(hetero_pipeline_layer_split=[12, 12])
            )
        },
    ),
    Case(
        "rule_fs_partial_reduce_flag",
        TIED_DP,
        "flagscale",
        model=MIX_TIED,
        kw={
            "fs_config": edit_fs(
                TIED_DP, MIX_TIED, lambda c: c["system"]["hetero"].pop("use_partial_reduce_for_shared_embedding")
            )
        },
    ),
    Case(
        "rule_fs_standalone_embedding_off",
        GOOD_FS,
        "flagscale",
        kw={
            "fs_config": edit_fs(GOOD_FS, MIX, lambda c: c["system"]["hetero"].update(standalone_embedding_stage=True))
        },
    ),
    Case(
        "rule_fs_ckpt_format",
        GOOD_FS,
        "flagscale",
        kw={"fs_config": edit_fs(GOOD_FS, MIX, lambda c: c["system"].pop("checkpoint"))},
    ),
]


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        (Settings(overlap_ep_comm=True), "settings.overlap_ep_comm"),
        (Settings(cuda_graph_scope="attn"), "settings.cuda_graph_scope"),
    ],
)
def test_runtime_without_ep_overlap_or_graphs_refuses_them(settings: Settings, field: str) -> None:
    found = [v for v in validate(GOOD_MS, MIX, CAT.cluster("16-2-h"), "mindspeed", settings=settings)]
    assert field in {v.field for v in found if v.rule == "rule_runtime_overlap_and_graphs"}
    ok = validate(GOOD_MG, MIX, CAT.cluster("16-1-h"), "megatron", settings=Settings(cuda_graph_scope="attn"))
    assert "rule_runtime_overlap_and_graphs" not in {v.rule for v in ok}


@pytest.mark.parametrize(("scope", "bad"), [("moe_router", True), ("attn,mlp", False), ("attn", False)])
def test_a_dense_model_graphs_no_moe_parts(scope: str, bad: bool) -> None:
    """core_v0.16.0 TransformerConfig: 'moe cuda graph is only supported for MoE'; mlp and attn are fine."""
    p = plan([16, 16], HH, pc(tp=2, dp=4), cluster="16-1-h")
    found = validate(p, DENSE, H16, "megatron", settings=Settings(cuda_graph_scope=scope))
    assert any(v.rule == "rule_cuda_graph_scope_fits_the_model" for v in found) is bad


def test_every_rule_has_a_case() -> None:
    assert sorted(c.rule for c in CASES) == sorted(rule_names())
    assert len(set(rule_names())) == len(RULES)


@pytest.mark.parametrize("case", CASES, ids=[c.rule for c in CASES])
def test_rule_trips(case: Case) -> None:
    cluster = case.cluster or CAT.cluster(case.plan.cluster)
    found = validate(case.plan, case.model, cluster, case.target, **case.kw)  # type: ignore[arg-type]
    rules = {v.rule for v in found}
    assert case.rule in rules, found
    v = next(v for v in found if v.rule == case.rule)
    assert v.field and v.message
    assert str(v).endswith(f"[{case.rule}]")


@pytest.mark.parametrize(
    ("p", "target", "model", "cluster"),
    [
        (GOOD_MG, "megatron", MIX, H16),
        (GOOD_FIRST, "megatron", MIX, H16),
        (plan([6, 6, 6, 6], ["h800", "h800", "910b", "910b"], G4), "flagscale", MIX, C16),  # one mesh per type
        (GOOD_FS, "flagscale", MIX, C16),
        (TIED_DP, "flagscale", MIX_TIED, C16),
        (plan([12, 12], HH, pc(dp=8, ep=8), cluster="16-1-h"), "megatron", MIX, H16),
        (plan([16, 16], HH, pc(tp=2, dp=4), cluster="16-1-h"), "megatron", DENSE, H16),
        (GOOD_MS, "mindspeed", MIX, A16),
        (plan([12, 12], ["910b"] * 2, G8, cluster="16-2-h"), "mindspeed", MIX, A16),
        (
            plan([14, 10], HH, G8, cluster="16-1-h"),
            "megatron",
            HYBRID,
            H16,
        ),  # Megatron's hybrid stack: first-stage flag
    ],
)
def test_good_plans_have_no_violations(p: Plan, target: str, model: ModelSpec, cluster: ClusterSpec) -> None:
    assert validate(p, model, cluster, target) == []  # type: ignore[arg-type]
    check(p, model, cluster, target)  # type: ignore[arg-type]


def test_good_plans_also_pass_check_plan() -> None:
    """Our export rules are at least as strict as plan.check_plan on the plans we accept."""
    for p, model, cluster in ((GOOD_MG, MIX, H16), (GOOD_FS, MIX, C16), (GOOD_FIRST, MIX, H16), (GOOD_MS, MIX, A16)):
        check_plan(p, model, cluster)


def test_one_setting_runtimes_refuse_mixed_recompute() -> None:
    p = plan([12, 12], HH, G8, rec=["full", "none"], cluster="16-1-h")
    assert "rule_runtime_recompute" in {v.rule for v in validate(p, MIX, H16, "megatron")}


def test_cross_vendor_plans_run_on_flagscale_only() -> None:
    """A plan over H800 and 910B: FlagScale runs it; Megatron-LM and MindSpeed-LLM each refuse the other
    vendor's stages."""
    p = plan([12, 12], HB, G8)
    assert "rule_runtime_vendors" in {v.rule for v in validate(p, MIX, C16, "megatron")}
    assert "rule_runtime_vendors" in {v.rule for v in validate(p, MIX, C16, "mindspeed")}
    assert "rule_runtime_vendors" not in {v.rule for v in validate(p, MIX, C16, "flagscale")}


def test_structural_violations_stop_validation() -> None:
    p = plan([12, 8], HB, pc(tp=3))
    assert {v.rule for v in validate(p, MIX, C16, "megatron")} == {"rule_layers_cover_model"}


def test_check_raises_plan_error_for_plan_rules() -> None:
    with pytest.raises(PlanError) as ei:
        check(plan([12, 12], HB, pc(tp=2, dp=3, ep=3)), MIX, C16, "megatron")
    assert "[rule_experts_divisible_by_ep]" in str(ei.value) and "stages[0].ep" in str(ei.value)


def test_check_raises_export_error_for_target_rules() -> None:
    with pytest.raises(ExportError) as ei:
        check(replace(GOOD_FS, stages=tuple(replace(s, device="h800") for s in GOOD_FS.stages)), MIX, H16, "megatron")
    assert "[rule_uniform_mesh]" in str(ei.value) and ei.value.field == "stages[2]"
    with pytest.raises(ExportError, match=r"flagscale: \[rule_runtime_vpp\]"):
        check(_hetero(replace(GOOD_FS, vpp=2)), MIX, C16, "flagscale")


def test_unknown_target() -> None:
    with pytest.raises(ExportError, match="unknown target"):
        validate(GOOD_MG, MIX, C16, "deepspeed")  # type: ignore[arg-type]


def test_rule_exportable_is_the_safety_net(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object, **k: object) -> list[str]:
        raise ExportError("cannot express this")

    monkeypatch.setitem(sys.modules["hapmoe_milp.export.artifacts"]._ARGS, "megatron", boom)
    found = validate(GOOD_MG, MIX, H16, "megatron")
    assert found == [Violation("rule_exportable", "plan", "cannot express this", "export")]


def test_offload_plans_validate_with_their_own_exports() -> None:
    assert validate(OFFLOAD_MG, MIX, H16, "megatron") == []
    assert validate(OFFLOAD_FS, MIX, C16, "flagscale") == []
    # a plan that does not offload, checked against arguments that do
    args = megatron_args(OFFLOAD_MG, MIX, H16)
    assert "rule_offload_flags" in {v.rule for v in validate(GOOD_MG, MIX, H16, "megatron", args=args)}


def test_args_text_is_accepted() -> None:
    from hapmoe_milp.export.megatron import format_args_file

    text = format_args_file(megatron_args(GOOD_MG, MIX, H16))
    assert validate(GOOD_MG, MIX, H16, "megatron", args=text) == []
