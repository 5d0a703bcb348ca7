"""Megatron-Core as an oracle for the exporter (optional: ``pip install torch==2.13.0 megatron-core``).

On Python 3.11 pip resolves megatron-core 0.16.x, which ships ``megatron.core`` only (no
``megatron.training``), so this checks what core can check offline (reference/megatron.md §4):

* exported layouts parse with ``PipelineParallelLayerLayout`` and pass ``validate_layer_layout``, and give
  the plan's layers per pipeline rank and per virtual chunk;
* the exported arguments build a ``TransformerConfig`` / ``MLATransformerConfig`` (every emitted flag is
  mapped, so an unknown flag fails the test); without a layout, ``get_num_layers_to_build`` reproduces
  the plan's split;
* ``initialize_model_parallel`` succeeds on a fake process group of the plan's world size and gives the
  plan's DP and expert-DP; its rank groups put TP/ETP groups where our placement says (one node) and
  pipeline stage ``i`` on ranks ``[i*g, (i+1)*g)``;
* ``ConstantNumMicroBatchesCalculator`` gives the plan's number of micro-batches;
* plans and arguments our validator rejects are rejected by megatron-core too, for the rules it checks.

FlagScale plans are checked mesh by mesh the same way (FlagScale builds each mesh with Megatron's
RankGenerator and TransformerConfig).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator  # noqa: E402

from hapmoe_milp.config import ParallelConfig  # noqa: E402
from hapmoe_milp.errors import ExportError, SpecError  # noqa: E402
from hapmoe_milp.export import flagscale_config, megatron_args, parse_megatron_args  # noqa: E402
from hapmoe_milp.export.flagscale import process_meshes  # noqa: E402
from hapmoe_milp.export.validate import validate  # noqa: E402
from hapmoe_milp.plan import Plan, Stage  # noqa: E402
from hapmoe_milp.specs import Catalog  # noqa: E402
from hapmoe_milp.specs.cluster import ClusterSpec  # noqa: E402
from hapmoe_milp.specs.model import ModelSpec  # noqa: E402
from tests.megatron_oracle import (  # noqa: E402
    check_megatron_export,
    config_from_args,
    fake_world,
    init_mesh,
    mcore_chunks,
)

pytestmark = pytest.mark.megatron
log = logging.getLogger(__name__)

CAT = Catalog()
MIX = CAT.model("mixtral-s")
DSV3 = CAT.model("deepseek-v3")
DSV2L = CAT.model("deepseek-v2-lite")
C16 = CAT.cluster("8xh800+8xa100")  # two NVIDIA types: upstream Megatron-LM runs them
C32 = CAT.cluster("16xh800+16xa100")
C256 = CAT.cluster("128xh800+128xa100")


def make_plan(
    counts: list[int],
    devices: list[str],
    cfg: ParallelConfig | list[ParallelConfig],
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    rec: str = "none",
    vpp: int = 1,
    mbs: int = 1,
    gbs: int = 256,
    family: str = "megatron",
) -> Plan:
    cfgs = cfg if isinstance(cfg, list) else [cfg] * len(counts)
    stages, pos = [], 0
    for n, d, c in zip(counts, devices, cfgs):
        stages.append(Stage(d, c, pos, pos + n, rec))  # type: ignore[arg-type]
        pos += n
    return Plan(model.name, cluster.name, family, tuple(stages), gbs, 4096, mbs, vpp=vpp)  # type: ignore[arg-type]


HHBB = ["h800", "h800", "a100", "a100"]
G4 = ParallelConfig(tp=2, dp=2, ep=4)
G8 = ParallelConfig(tp=2, dp=4, ep=8)
DS16 = ParallelConfig(tp=1, dp=16, ep=16)
DS_TYPES = ["h800"] * 8 + ["a100"] * 8

MEGATRON_PLANS: list[tuple[str, Plan, ModelSpec, ClusterSpec]] = [
    ("mixtral-even", make_plan([6, 6, 6, 6], HHBB, G4, MIX, C16), MIX, C16),
    ("mixtral-first", make_plan([14, 10], ["h800", "a100"], G8, MIX, C16), MIX, C16),
    ("mixtral-first-last", make_plan([9, 6, 6, 3], HHBB, G4, MIX, C16), MIX, C16),
    ("mixtral-uneven-layout", make_plan([8, 7, 5, 4], HHBB, G4, MIX, C16), MIX, C16),
    ("mixtral-even-vpp2", make_plan([6, 6, 6, 6], HHBB, G4, MIX, C16, vpp=2), MIX, C16),
    ("mixtral-layout-vpp2", make_plan([8, 7, 5, 4], HHBB, G4, MIX, C16, vpp=2), MIX, C16),
    ("mixtral-first-last-vpp2", make_plan([8, 6, 6, 4], HHBB, G4, MIX, C16, vpp=2), MIX, C16),
    ("mixtral-full-recompute", make_plan([8, 7, 5, 4], HHBB, G4, MIX, C16, rec="full"), MIX, C16),
    ("mixtral-selective", make_plan([8, 7, 5, 4], HHBB, G4, MIX, C16, rec="selective"), MIX, C16),
    (
        "mixtral-cp2-etp2",
        make_plan([12, 12], ["h800", "a100"], ParallelConfig(tp=2, cp=2, dp=2, ep=2, etp=2), MIX, C16),
        MIX,
        C16,
    ),
    ("mixtral-32-8stages", make_plan([3] * 8, ["h800"] * 4 + ["a100"] * 4, G4, MIX, C32, vpp=3), MIX, C32),
    # first rank's first chunk the embedding alone, last rank's last chunk the loss alone (E|t|...|t|L)
    ("mixtral-embedding-loss-chunks", make_plan([12, 12], ["h800", "a100"], G8, MIX, C16, vpp=13), MIX, C16),
    ("dsv3-mtp-layout", make_plan([5] + [4] * 13 + [3, 2], DS_TYPES, DS16, DSV3, C256), DSV3, C256),
    ("dsv3-mtp-vpp2", make_plan([5] + [4] * 13 + [3, 2], DS_TYPES, DS16, DSV3, C256, vpp=2), DSV3, C256),
    ("dsv3-mtp-last-flag", make_plan([4] * 15 + [2], DS_TYPES, DS16, DSV3, C256), DSV3, C256),
    ("dsv3-mtp-alone", make_plan([5] + [4] * 14 + [1], DS_TYPES, DS16, DSV3, C256), DSV3, C256),
    ("dsv2-lite-no-qlora", make_plan([8, 7, 6, 6], HHBB, ParallelConfig(tp=2, dp=2, ep=4), DSV2L, C16), DSV2L, C16),
]

HETERO_PLANS: list[tuple[str, Plan, ModelSpec, ClusterSpec]] = [
    (
        "mixtral-two-meshes",
        make_plan(
            [7, 7, 5, 5],
            HHBB,
            [ParallelConfig(tp=4, dp=1, ep=2)] * 2 + [ParallelConfig(tp=2, dp=2, ep=2)] * 2,
            MIX,
            C16,
            mbs=2,
            family="hetero",
        ),
        MIX,
        C16,
    ),
    (
        "mixtral-four-stages",
        make_plan(
            [8, 8, 4, 4],
            HHBB,
            [ParallelConfig(tp=4, dp=1, ep=2)] * 2 + [ParallelConfig(tp=2, dp=2, ep=2, etp=2)] * 2,
            MIX,
            C16,
            mbs=2,
            family="hetero",
        ),
        MIX,
        C16,
    ),
]


# ---------------------------------------------------------------------- positive oracle
def test_megatron_core_version() -> None:
    import megatron.core

    log.info("oracle: megatron-core %s, torch %s", megatron.core.__version__, torch.__version__)
    assert megatron.core.__version__


@pytest.mark.parametrize("case", MEGATRON_PLANS, ids=[c[0] for c in MEGATRON_PLANS])
def test_megatron_core_accepts_export(case: tuple[str, Plan, ModelSpec, ClusterSpec]) -> None:
    _name, plan, model, cluster = case
    check_megatron_export(plan, model, cluster)


@pytest.mark.parametrize("case", HETERO_PLANS, ids=[c[0] for c in HETERO_PLANS])
def test_megatron_core_accepts_each_flagscale_mesh(case: tuple[str, Plan, ModelSpec, ClusterSpec]) -> None:
    """FlagScale builds every mesh with Megatron's RankGenerator and TransformerConfig at that mesh's sizes."""
    _name, plan, model, cluster = case
    assert validate(plan, model, cluster, "flagscale") == []
    fs = flagscale_config(plan, model, cluster)
    flat = fs["system"]["hetero"]["hetero_process_meshes"]
    etps = fs["system"]["hetero"]["expert_tensor_parallel_size_per_process_mesh"]
    base = dict(fs["model"])
    for mesh, (tp, cp, ep, dp, pp), etp in zip(process_meshes(plan), zip(*[flat[i::5] for i in range(5)]), etps):
        world = tp * cp * dp * pp
        with fake_world(world):
            sizes = init_mesh(world, tp, pp, cp, ep, etp, None)
        assert sizes["dp"] == dp == mesh.cfg.dp and sizes["edp"] == world // (etp * ep * pp)
        parsed = {k: v for k, v in base.items() if k not in ("moe_token_dispatcher_type",)}
        parsed.update(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            context_parallel_size=cp,
            expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp,
            bf16=True,
        )
        if tp > 1:
            parsed["sequence_parallel"] = True
        config_from_args(parsed)
        mbs_i = plan.stage_micro_batch(mesh.first_stage)
        calc = ConstantNumMicroBatchesCalculator(plan.global_batch_size, mbs_i, dp, False, 0)
        assert calc.get() == plan.num_microbatches


# ---------------------------------------------------------------------- negative oracle
def _edit(
    args: list[str], drop: tuple[str, ...] = (), add: tuple[str, ...] = (), set_: dict[str, str] | None = None
) -> list[str]:
    out, skip = [], False
    for t in args:
        if t.startswith("--"):
            skip = t in drop or t in (set_ or {})
        if not skip:
            out.append(t)
    for k, v in (set_ or {}).items():
        out += [k, v]
    return out + list(add)


BASE = MEGATRON_PLANS[3][1]  # mixtral, layout [8, 7, 5, 4]
FIRST = MEGATRON_PLANS[1][1]  # mixtral, --decoder-first-pipeline-num-layers 14


@pytest.mark.parametrize(
    ("rule", "plan", "edit"),
    [
        (
            "rule_heads_divisible_by_tp",
            replace(BASE, stages=tuple(replace(s, cfg=ParallelConfig(tp=3, dp=1)) for s in BASE.stages)),
            {},
        ),
        (
            "rule_sequence_parallel_needs_tp",
            replace(BASE, stages=tuple(replace(s, cfg=ParallelConfig(dp=4, ep=4)) for s in BASE.stages)),
            {"add": ("--sequence-parallel",)},
        ),
        (
            "rule_moe_bias_needs_etp_1",
            replace(BASE, stages=tuple(replace(s, cfg=ParallelConfig(tp=2, dp=2, ep=2, etp=2)) for s in BASE.stages)),
            {"drop": ("--disable-bias-linear",)},
        ),
        ("rule_recompute_flags", BASE, {"add": ("--recompute-granularity", "full")}),
        ("rule_layout_counts", BASE, {"set_": {"--pipeline-model-parallel-layout": "Et*8|t*7|t*5|t*5L"}}),
        ("rule_layout_counts", BASE, {"set_": {"--pipeline-model-parallel-layout": "Et*8|t*7|t*5|t*4"}}),
        ("rule_layout_exclusive", BASE, {"add": ("--decoder-first-pipeline-num-layers", "8")}),
        ("rule_uneven_pp_split", FIRST, {"set_": {"--decoder-first-pipeline-num-layers": "0"}}),
        ("rule_uneven_pp_split", MEGATRON_PLANS[2][1], {"set_": {"--decoder-first-pipeline-num-layers": "10"}}),
    ],
)
def test_megatron_core_rejects_what_we_reject_config(rule: str, plan: Plan, edit: dict[str, Any]) -> None:
    """Config-time rules: our validator and TransformerConfig (or the layout parser) agree on rejecting."""
    args = _edit(megatron_args(plan, MIX, C16), **edit)
    assert rule in {v.rule for v in validate(plan, MIX, C16, "megatron", args=args)}
    with pytest.raises((ValueError, AssertionError)):
        config_from_args(parse_megatron_args(args))


def test_megatron_core_rejects_expert_grid_like_us() -> None:
    bad = make_plan([12, 12], ["h800", "a100"], ParallelConfig(tp=2, dp=2, ep=8), MIX, C16)
    assert "rule_expert_grid_divides_world" in {v.rule for v in validate(bad, MIX, C16, "megatron")}
    with fake_world(bad.devices_used), pytest.raises(RuntimeError, match="not divisible"):
        init_mesh(bad.devices_used, 2, 2, 1, 8, 1, None)


def test_megatron_core_rejects_vpp_without_pp_like_us() -> None:
    bad = make_plan([24], ["h800"], G8, MIX, C16, vpp=2)
    assert "rule_vpp_needs_pp_gt_1" in {v.rule for v in validate(bad, MIX, C16, "megatron")}
    with fake_world(bad.devices_used), pytest.raises(RuntimeError):
        init_mesh(bad.devices_used, 2, 1, 1, 8, 1, 2)


def test_megatron_core_rejects_gbs_like_us() -> None:
    bad = replace(BASE, global_batch_size=255)
    assert "rule_gbs_divisible_by_mbs_dp" in {v.rule for v in validate(bad, MIX, C16, "megatron")}
    with pytest.raises(AssertionError):
        ConstantNumMicroBatchesCalculator(255, 1, 2, False, 0)


def test_megatron_core_rejects_topk1_without_pre_softmax_like_us() -> None:
    top1 = replace(MIX, moe_router_topk=1)
    p = replace(BASE, model=top1.name)
    args = _edit(megatron_args(p, top1, C16), drop=("--moe-router-pre-softmax",))
    assert "rule_topk1_needs_pre_softmax" in {v.rule for v in validate(p, top1, C16, "megatron", args=args)}
    with pytest.raises(ValueError):
        config_from_args(parse_megatron_args(args))
    config_from_args(parse_megatron_args(megatron_args(p, top1, C16)))  # and our export is accepted


def test_megatron_core_rejects_offload_without_dist_opt_like_us() -> None:
    """OptimizerConfig refuses the precision-aware optimizer (which CPU offload needs) without the
    distributed optimizer; our rule_offload_needs_dist_opt says the same before anything is written."""
    from megatron.core.optimizer import OptimizerConfig

    with pytest.raises(AssertionError, match="distributed optimizer"):
        OptimizerConfig(
            optimizer="adam",
            bf16=True,
            optimizer_cpu_offload=True,
            use_precision_aware_optimizer=True,
            use_distributed_optimizer=False,
        )
    plan = MEGATRON_PLANS[0][1]
    st = plan.settings().with_(optimizer_offload=True, distributed_optimizer=False)
    rules = {v.rule for v in validate(plan, MEGATRON_PLANS[0][2], MEGATRON_PLANS[0][3], "megatron", settings=st)}
    assert "rule_offload_needs_dist_opt" in rules


def test_null_vocab_probe_on_the_installed_megatron_core(tmp_path: Any) -> None:
    """The launch scripts' probe, run against this megatron-core's own NullTokenizer file: the --vocab-size
    it picks makes that tokenizer report exactly the model's vocabulary."""
    import importlib.util
    import pathlib
    import subprocess
    import sys

    import megatron

    from hapmoe_milp.export.megatron import NULL_VOCAB_PROBE

    root = pathlib.Path(megatron.__path__[0]).parent
    f = root / "megatron" / "core" / "tokenizers" / "text" / "libraries" / "null_tokenizer.py"
    if not f.is_file():
        pytest.skip("this megatron-core has no core NullTokenizer")
    want = MIX.vocab_size
    out = subprocess.run(
        [sys.executable, "-", str(root), str(want)], input=NULL_VOCAB_PROBE, capture_output=True, text=True, check=True
    )
    arg = int(out.stdout)
    spec = importlib.util.spec_from_file_location("_nt", f)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    assert mod.NullTokenizer(arg).vocab_size == want


# ---------------------------------------------------------------------- current MoE families (issue 22)
H100_64 = CAT.cluster("64-h100")
H100_256 = CAT.cluster("256xh100")
FAMILY_PLANS = [
    # catalog id, per-stage layers, mesh, cluster
    ("kimi-k2", [16, 15, 15, 15], ParallelConfig(tp=1, dp=64, ep=64), H100_256),
    ("glm-4.5", [24, 23, 23, 23], ParallelConfig(tp=2, dp=32, ep=32), H100_256),
    ("glm-4.5-air", [12, 12, 12, 11], ParallelConfig(tp=2, dp=8, ep=16), H100_64),
    ("qwen3-next-80b-a3b", [12, 12, 12, 12], ParallelConfig(tp=2, dp=8, ep=16), H100_64),
    ("llama-4-scout", [12, 12, 12, 12], ParallelConfig(tp=2, dp=8, ep=16), H100_64),
    ("llama-4-maverick", [12, 12, 12, 12], ParallelConfig(tp=2, dp=32, ep=64), H100_256),
    ("granite-3.0-3b-a800m", [16, 16], ParallelConfig(tp=1, dp=32, ep=8), H100_64),
    ("hunyuan-a13b", [8, 8, 8, 8], ParallelConfig(tp=2, dp=8, ep=16), H100_64),
    ("minimax-m2", [17, 16, 16, 16], ParallelConfig(tp=2, dp=8, ep=16), H100_64),
    ("dots-llm1", [16, 16, 15, 15], ParallelConfig(tp=2, dp=8, ep=16), H100_64),
    ("ling-lite", [14, 14], ParallelConfig(tp=1, dp=32, ep=32), H100_64),
    ("nemotron-3-nano-30b-a3b", [14, 14, 14, 10], ParallelConfig(tp=2, dp=8, ep=16), H100_64),
    ("deepseek-v3", [16, 16, 16, 14], ParallelConfig(tp=1, dp=64, ep=64), H100_256),
]


@pytest.mark.parametrize("case", FAMILY_PLANS, ids=[c[0] for c in FAMILY_PLANS])
def test_megatron_core_accepts_current_families(case: tuple[str, list[int], ParallelConfig, ClusterSpec]) -> None:
    """The exported arguments of each family build megatron-core's TransformerConfig, whose __post_init__
    runs the rules for gated DeltaNet, group-limited routing, NoPE frequency, output gate, MoE and hybrid
    models; Megatron's hybrid allocator accepts the layer pattern."""
    mid, counts, cfg, cluster = case
    model = CAT.model(mid)
    devices = ["h100"] * len(counts)
    plan = make_plan(counts, devices, cfg, model, cluster)
    assert [v for v in validate(plan, model, cluster, "megatron") if v.severity == "error"] == []
    parsed = parse_megatron_args(megatron_args(plan, model, cluster))
    config = config_from_args(parsed)
    assert config.num_layers == model.num_layers
    if model.moe_router_num_groups:
        assert (config.moe_router_num_groups, config.moe_router_group_topk) == (
            model.moe_router_num_groups,
            model.moe_router_group_topk,
        )
    if model.has_linear_attention:
        assert config.experimental_attention_variant == "gated_delta_net" and config.attention_output_gate
    if model.is_hybrid:
        from megatron.core.ssm.mamba_hybrid_layer_allocation import allocate_layers

        assert config.is_hybrid_model
        pattern = allocate_layers(model.num_layers, 0.0, 0.0, parsed["hybrid_override_pattern"])
        assert "".join(pattern) == model.hybrid_override_pattern
    else:
        got = mcore_chunks(config, plan.pp, plan.vpp)
        assert [sum(d + m for d, m in row) for row in got] == plan.layer_counts()


def test_megatron_core_rejects_bad_router_groups_like_us() -> None:
    """Experts that do not split into the groups: TransformerConfig asserts, our spec refuses it first."""
    from hapmoe_milp.specs.model_doc import validate_model

    bad = replace(DSV3, moe_router_num_groups=7)
    with pytest.raises(SpecError, match="moe_router_num_groups"):
        validate_model(bad, "test")
    plan = make_plan([16, 16, 16, 14], ["h800"] * 4, DS16, DSV3, C256)
    args = _edit(megatron_args(plan, DSV3, C256), set_={"--moe-router-num-groups": "7"})
    with pytest.raises((ValueError, AssertionError)):
        config_from_args(parse_megatron_args(args))


def test_jamba_export_names_the_runtime() -> None:
    jamba = CAT.model("jamba-v0.1")
    plan = make_plan([32, 32], ["h100", "h100"], ParallelConfig(tp=2, dp=16, ep=16), jamba, H100_64)
    found = {v.rule: v.message for v in validate(plan, jamba, H100_64, "megatron")}
    assert "Mamba-1" in found["rule_megatron_architecture"] and "transformers" in found["rule_megatron_architecture"]
    with pytest.raises(ExportError, match="JambaForCausalLM"):
        megatron_args(plan, jamba, H100_64)


def test_megatron_core_accepts_cuda_graph_and_bf16_reduction_flags() -> None:
    """The CUDA-graph scope, BF16 gradient reduction and TP overlap a plan may carry build megatron-core's
    config."""
    plan = MEGATRON_PLANS[0][1]
    st = replace(
        plan.settings(),
        cuda_graph_scope="attn,moe_router,moe_preprocess",
        grad_reduce_in_bf16=True,
        tp_comm_overlap=True,
    )
    graphed = replace(plan, run_settings=st)
    check_megatron_export(graphed, MIX, C16)
    parsed = parse_megatron_args(megatron_args(graphed, MIX, C16))
    config = config_from_args(parsed)
    assert config.cuda_graph_impl == "transformer_engine"
    assert [str(getattr(x, "name", x)) for x in config.cuda_graph_scope] == ["attn", "moe_router", "moe_preprocess"]
    assert parsed["grad_reduce_in_bf16"] is True
    assert config.tp_comm_overlap is True


def test_the_element_wise_fusions_a_plan_was_priced_with_reach_megatron_core() -> None:
    """A plan priced with unfused SwiGLU and rotary and the fused cross-entropy (Settings.fused_swiglu,
    fused_rope, cross_entropy_fusion; cost/layer.py, cost/model.py) runs that way: the flags build megatron-core's
    config with those fusions off and on. The defaults (Megatron's own: both fused, cross-entropy unfused) add
    no flag."""
    plan = MEGATRON_PLANS[0][1]
    assert not {"--no-bias-swiglu-fusion", "--no-rope-fusion", "--cross-entropy-loss-fusion"} & set(
        megatron_args(plan, MIX, C16)
    )
    st = replace(plan.settings(), fused_swiglu=False, fused_rope=False, cross_entropy_fusion=True)
    unfused = replace(plan, run_settings=st)
    check_megatron_export(unfused, MIX, C16)
    config = config_from_args(parse_megatron_args(megatron_args(unfused, MIX, C16)))
    assert config.apply_rope_fusion is False and config.bias_activation_fusion is False
    assert config.cross_entropy_loss_fusion is True


def test_megatron_core_accepts_a_learned_position_table() -> None:
    """A model that keeps Megatron's learned absolute position table (measured FlagPerf launches) exports
    ``--position-embedding-type learned_absolute`` with ``--max-position-embeddings``, and Megatron's
    ``validate_args`` accepts it as written."""
    plan = MEGATRON_PLANS[0][1]
    learned = replace(MIX, learned_absolute_position_embedding=True)
    check_megatron_export(plan, learned, C16)
    parsed = parse_megatron_args(megatron_args(plan, learned, C16))
    assert parsed["position_embedding_type"] == "learned_absolute"
    assert parsed["max_position_embeddings"] >= plan.settings().seq_length
