"""FlagScale export: meshes, layer split, hostfile, and what FlagScale's runner and validator make of them
(re-enacted in :mod:`tests.flagscale_oracle`)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import yaml

from hapmoe_milp.config import ParallelConfig
from hapmoe_milp.errors import ExportError
from hapmoe_milp.export import export_plan, flagscale_config, flagscale_hostfile, flagscale_yaml
from hapmoe_milp.export.flagscale import process_meshes
from hapmoe_milp.export.validate import validate
from hapmoe_milp.plan import Plan, Stage, load_plan
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs.model import ModelSpec
from tests.flagscale_oracle import built_layer_ids, flagscale_asserts, flatten_dict_to_args, rank_mapper

CAT = Catalog()
MIXTRAL = CAT.model("mixtral-s")
DSV3 = CAT.model("deepseek-v3")
C16 = CAT.cluster("16-1")
C32 = CAT.cluster("32-1")


def make_plan(
    counts: list[int],
    devices: list[str],
    cfgs: list[ParallelConfig],
    *,
    model: ModelSpec = MIXTRAL,
    cluster: str = "16-1",
    recompute: list[str] | None = None,
    mbs: int = 2,
    gbs: int = 256,
    vpp: int = 1,
) -> Plan:
    recs = recompute or ["none"] * len(counts)
    stages, pos = [], 0
    for n, d, c, r in zip(counts, devices, cfgs, recs):
        stages.append(Stage(d, c, pos, pos + n, r))  # type: ignore[arg-type]
        pos += n
    return Plan(model.name, cluster, "hetero", tuple(stages), gbs, 4096, mbs, vpp=vpp)


H_TP4 = ParallelConfig(tp=4, dp=2, ep=2, etp=1)  # 8 H800
B_TP2 = ParallelConfig(tp=2, dp=4, ep=2, etp=1)  # 8 910B
H_TP4_DP1 = ParallelConfig(tp=4, dp=1, ep=2, etp=1)  # 4 devices
B_TP2_DP2 = ParallelConfig(tp=2, dp=2, ep=2, etp=1)  # 4 devices

# two meshes of two stages each (FlagScale gives a later mesh of one stage layer offset 0)
HETERO = make_plan([7, 7, 5, 5], ["h800", "h800", "910b", "910b"], [H_TP4_DP1] * 2 + [B_TP2_DP2] * 2)
FOUR = make_plan([8, 8, 4, 4], ["h800", "h800", "910b", "910b"], [H_TP4_DP1, H_TP4_DP1, B_TP2_DP2, B_TP2_DP2])
ONE_STAGE_LATER_MESH = make_plan([14, 10], ["h800", "910b"], [H_TP4, B_TP2])


# ---------------------------------------------------------------------- FlagScale, re-enacted
# ---------------------------------------------------------------------- meshes and keys
def test_meshes_group_consecutive_identical_stages() -> None:
    meshes = process_meshes(FOUR)
    assert [(m.device, m.pp, m.first_stage) for m in meshes] == [("h800", 2, 0), ("910b", 2, 2)]
    h = flagscale_config(FOUR, MIXTRAL, C16)["system"]["hetero"]
    assert h["hetero_process_meshes"] == [4, 1, 2, 1, 2, 2, 1, 2, 2, 2]
    assert h["hetero_pipeline_layer_split"] == [8, 8, 4, 4]
    assert h["hetero_device_types"] == ["h800", "910b"]
    assert h["expert_tensor_parallel_size_per_process_mesh"] == [1, 1]
    assert h["enable_hetero"] is True and h["standalone_embedding_stage"] is False


def test_anchor_example_shape() -> None:
    """The illustrative 8xH800 + 8x910B config of reference/anchors.md §2.6 (56 layers, 2 PP stages per mesh,
    global micro_batch_size 2 so the 910B mesh runs mbs 1) comes out key for key."""
    model = ModelSpec(
        name="anchor-56",
        num_layers=56,
        hidden_size=4096,
        num_attention_heads=32,
        vocab_size=32000,
        num_query_groups=8,
        num_experts=8,
        moe_ffn_hidden_size=14336,
    )
    plan = make_plan([16, 16, 12, 12], ["h800", "h800", "910b", "910b"], [H_TP4_DP1] * 2 + [B_TP2_DP2] * 2, model=model)
    assert validate(plan, model, C16, "flagscale") == []
    cfg = flagscale_config(plan, model, C16)
    h = cfg["system"]["hetero"]
    assert h["hetero_process_meshes"] == [4, 1, 2, 1, 2, 2, 1, 2, 2, 2]
    assert h["hetero_pipeline_layer_split"] == [16, 16, 12, 12]
    assert h["hetero_device_types"] == ["h800", "910b"]
    assert flagscale_asserts(cfg, model) == [2, 1]


def test_system_keys_and_checkpoint_format() -> None:
    cfg = flagscale_config(HETERO, MIXTRAL, C16)
    s = cfg["system"]
    assert s["tensor_model_parallel_size"] == 4 and s["pipeline_model_parallel_size"] == 4
    assert s["expert_model_parallel_size"] == 2 and s["expert_tensor_parallel_size"] == 1
    assert s["context_parallel_size"] == 1 and s["sequence_parallel"] is True
    assert s["checkpoint"] == {"ckpt_format": "torch", "save_interval": 1000}  # TP 4 vs 2
    assert s["distributed_backend"] == "flagcx"  # NVIDIA + Huawei
    assert cfg["model"]["micro_batch_size"] == 2 and cfg["model"]["global_batch_size"] == 256
    assert cfg["model"]["num_experts"] == 8 and cfg["model"]["moe_grouped_gemm"] is True
    assert "use_partial_reduce_for_shared_embedding" not in s["hetero"]  # untied, no MTP
    assert flagscale_asserts(cfg, MIXTRAL) == [2, 1]


def test_same_tp_meshes_keep_default_checkpoint() -> None:
    plan = make_plan([12, 12], ["h800", "910b"], [ParallelConfig(tp=2, dp=4, ep=2), ParallelConfig(tp=2, dp=4, ep=2)])
    assert "ckpt_format" not in flagscale_config(plan, MIXTRAL, C16)["system"]["checkpoint"]


def test_mtp_layers_stay_on_last_stage_and_partial_reduce() -> None:
    """DeepSeek-V3 (MTP shares the embedding): equal first/last TP, DP 16 vs 8 -> partial reduce; the split
    counts decoder layers only, the MTP layer rides on the last stage."""
    cl = CAT.cluster("256-h800-910b")
    a = ParallelConfig(tp=4, dp=16, ep=64, etp=1)  # 64 devices
    b = ParallelConfig(tp=4, dp=8, ep=32, etp=1)  # 32 devices
    plan = make_plan([31, 16, 15], ["h800", "910b", "910b"], [a, b, b], model=DSV3, cluster=cl.name, mbs=2)
    assert validate(plan, DSV3, cl, "flagscale") == []
    cfg = flagscale_config(plan, DSV3, cl)
    h = cfg["system"]["hetero"]
    assert h["hetero_pipeline_layer_split"] == [31, 16, 14]
    assert h["use_partial_reduce_for_shared_embedding"] is True
    assert cfg["model"]["mtp_num_layers"] == 1
    assert flagscale_asserts(cfg, DSV3) == [2, 4]


def test_a_later_mesh_of_one_stage_is_refused() -> None:
    """FlagScale's get_transformer_layer_offset adds the hetero offset only when the mesh's own PP > 1, so
    this plan's 910B mesh would build layers [0, 10) again instead of [14, 24)."""
    found = validate(ONE_STAGE_LATER_MESH, MIXTRAL, C16, "flagscale")
    assert [v.rule for v in found] == ["rule_runtime_mesh_stages"]
    assert built_layer_ids(flagscale_config(FOUR, MIXTRAL, C16)) == list(range(24))


def test_mtp_off_last_stage_is_refused() -> None:
    cl = CAT.cluster("256-h800-910b")
    a = ParallelConfig(tp=4, dp=16, ep=64)
    plan = make_plan([62, 0], ["h800", "910b"], [a, a], model=DSV3, cluster=cl.name)
    with pytest.raises(ExportError, match="rule_fs_mtp_on_last_stage"):
        flagscale_config(plan, DSV3, cl)


def test_interleaved_device_types_are_refused() -> None:
    plan = make_plan(
        [6, 6, 6, 6],
        ["h800", "910b", "h800", "910b"],
        [H_TP4_DP1, B_TP2_DP2, ParallelConfig(tp=2, dp=2, ep=2), B_TP2_DP2],
    )
    with pytest.raises(ExportError, match="rule_fs_device_types_grouped"):
        flagscale_config(plan, MIXTRAL, C16)
    assert "rule_fs_device_types_grouped" in {v.rule for v in validate(plan, MIXTRAL, C16, "flagscale")}


# ---------------------------------------------------------------------- recompute
def test_per_stage_recompute_uses_refined_config() -> None:
    plan = make_plan(
        [8, 8, 4, 4],
        ["h800", "h800", "910b", "910b"],
        [H_TP4_DP1, H_TP4_DP1, B_TP2_DP2, B_TP2_DP2],
        recompute=["full", "full", "none", "full"],
    )
    rec = flagscale_config(plan, MIXTRAL, C16)["system"]["recompute"]
    assert rec["recompute_granularity"] == "full" and rec["recompute_method"] == "uniform"
    m = plan.num_microbatches
    assert rec["recompute_granularity_per_stage_micro_batch"] == [[2, m, 1], [1, m, 0], [1, m, 1]]
    # FlagScale's post_validate_args: literal_eval each CLI value, expand to one flag list per stage
    argv = flatten_dict_to_args(rec)
    i = argv.index("--recompute-granularity-per-stage-micro-batch")
    per_stage: list[list[int]] = []
    for item in argv[i + 1 :]:
        n_stages, n_mb, flag = ast.literal_eval(item)
        per_stage += [[flag] * n_mb] * n_stages
    assert [row[0] for row in per_stage] == [1, 1, 0, 1] and all(len(r) == m for r in per_stage)


def test_uniform_recompute_levels() -> None:
    sel = make_plan([14, 10], ["h800", "910b"], [H_TP4, B_TP2], recompute=["selective", "selective"])
    rec = flagscale_config(sel, MIXTRAL, C16)["system"]["recompute"]
    assert rec == {"recompute_granularity": "selective", "recompute_modules": ["layernorm", "moe_act"]}
    full = make_plan([14, 10], ["h800", "910b"], [H_TP4, B_TP2], recompute=["full", "full"])
    rec = flagscale_config(full, MIXTRAL, C16)["system"]["recompute"]
    assert "recompute_granularity_per_stage_micro_batch" not in rec
    assert "recompute" not in flagscale_config(HETERO, MIXTRAL, C16)["system"]


def test_selective_mixed_is_refused() -> None:
    plan = make_plan([14, 10], ["h800", "910b"], [H_TP4, B_TP2], recompute=["selective", "none"])
    with pytest.raises(ExportError, match="rule_fs_recompute_expressible"):
        flagscale_config(plan, MIXTRAL, C16)


# ---------------------------------------------------------------------- hostfile and rank order
@pytest.mark.parametrize("plan", [HETERO, FOUR], ids=["two-meshes", "four-stages"])
def test_hostfile_rank_mapper_puts_meshes_on_their_type(plan: Plan) -> None:
    cfg = flagscale_config(plan, MIXTRAL, C16)
    text = flagscale_hostfile(plan, C16)
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert all(ln.split()[2].startswith("type=") for ln in lines)
    logical = rank_mapper(text, cfg["system"]["hetero"]["hetero_device_types"])
    pos = 0
    for m in process_meshes(plan):
        assert set(logical[pos : pos + m.devices]) == {m.device}
        pos += m.devices
    assert pos == len(logical) == plan.devices_used


def test_hostfile_partial_nodes_and_type_order() -> None:
    """910B first in the plan: its hosts come first; a half-used node lists only its used slots (a type's
    stages take its last devices, Plan.slot_offsets, so the 4 used 910B sit on its second node)."""
    plan = make_plan([14, 10], ["910b", "h800"], [B_TP2_DP2, H_TP4], model=MIXTRAL, cluster="32-1")
    text = flagscale_hostfile(plan, C32)
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert lines == ["910b-node1 slots=4 type=910b", "h800-node1 slots=8 type=h800"]


# ---------------------------------------------------------------------- CLI view and files
def test_runner_flattening_gives_flagscale_flags() -> None:
    argv = flatten_dict_to_args(flagscale_config(FOUR, MIXTRAL, C16))
    s = " ".join(argv)
    assert "--enable-hetero" in argv
    assert "--hetero-process-meshes 4 1 2 1 2 2 1 2 2 2" in s
    assert "--hetero-pipeline-layer-split 8 8 4 4" in s
    assert "--hetero-device-types h800 910b" in s
    assert "--expert-tensor-parallel-size-per-process-mesh 1 1" in s
    assert "--standalone-embedding-stage" not in argv  # False -> omitted
    assert "--micro-batch-size 2" in s and "--bf16" in argv


def test_export_plan_flagscale_files(tmp_path: Path) -> None:
    paths = export_plan(HETERO, MIXTRAL, C16, "flagscale", tmp_path)
    assert sorted(p.name for p in paths) == ["README.txt", "experiment.yaml", "flagscale.yaml", "hostfile", "plan.json"]
    cfg = yaml.safe_load((tmp_path / "flagscale.yaml").read_text())
    assert cfg == flagscale_config(HETERO, MIXTRAL, C16)
    assert load_plan(tmp_path / "plan.json") == HETERO
    assert "type=h800" in (tmp_path / "hostfile").read_text()
    assert "mesh 1" in (tmp_path / "README.txt").read_text()
    assert flagscale_yaml(HETERO, MIXTRAL, C16).startswith("# Generated by hapmoe-milp")


def test_export_plan_flagscale_refuses_cp(tmp_path: Path) -> None:
    cp2 = ParallelConfig(tp=2, cp=2, dp=1, ep=2)
    plan = make_plan([6, 6, 6, 6], ["h800", "h800", "910b", "910b"], [cp2] * 4)
    with pytest.raises(ExportError, match="rule_runtime_cp"):
        export_plan(plan, MIXTRAL, C16, "flagscale", tmp_path)
    assert not any(tmp_path.iterdir())


def test_megatron_family_plan_exports_to_flagscale() -> None:
    cfg = ParallelConfig(tp=2, dp=2, ep=2)
    stages = tuple(Stage(d, cfg, 6 * i, 6 * i + 6) for i, d in enumerate(["h800", "h800", "910b", "910b"]))
    plan = Plan("mixtral-s", "16-1", "megatron", stages, 256, 4096, 1)
    assert validate(plan, MIXTRAL, C16, "flagscale") == []
    assert flagscale_config(plan, MIXTRAL, C16)["system"]["hetero"]["hetero_process_meshes"] == [2, 1, 2, 2, 2] * 2


def test_dense_model_has_no_expert_keys() -> None:
    dense = CAT.model("llama-2-7b")
    a, b = ParallelConfig(tp=4, dp=1), ParallelConfig(tp=2, dp=2)
    plan = make_plan([10, 10, 6, 6], ["h800", "h800", "910b", "910b"], [a, a, b, b], model=dense)
    assert validate(plan, dense, C16, "flagscale") == []
    cfg = flagscale_config(plan, dense, C16)
    assert "expert_model_parallel_size" not in cfg["system"]
    assert "expert_tensor_parallel_size_per_process_mesh" not in cfg["system"]["hetero"]
    assert "num_experts" not in cfg["model"] and "moe_grouped_gemm" not in cfg["model"]
    assert cfg["system"]["hetero"]["hetero_process_meshes"] == [4, 1, 1, 1, 2, 2, 1, 1, 2, 2]


def _compose(conf_dir: Path) -> dict[str, Any]:
    """What Hydra makes of the experiment config FlagScale's run.py loads: its defaults list is
    ``[_self_, flagscale@train]``, i.e. flagscale.yaml from the same folder under the ``train`` key."""
    exp = yaml.safe_load((conf_dir / "experiment.yaml").read_text())
    defaults = exp.pop("defaults")
    assert defaults[0] == "_self_"
    name, _, package = defaults[1].partition("@")
    exp[package] = yaml.safe_load((conf_dir / f"{name}.yaml").read_text())
    return exp


@pytest.mark.parametrize("plan", [HETERO, FOUR])
def test_flagscale_files_parse_and_carry_what_the_runner_needs(tmp_path: Path, plan: Plan) -> None:
    export_plan(plan, MIXTRAL, C16, "flagscale", tmp_path)
    cfg = _compose(tmp_path)
    exp = cfg["experiment"]
    # flagscale/runner: task type/backend/entrypoint, a hostfile, and the envs it exports on every host
    assert exp["task"] == {"type": "train", "backend": "megatron", "entrypoint": "flagscale/train/train_gpt.py"}
    assert Path(exp["runner"]["hostfile"]) == (tmp_path / "hostfile").absolute()
    assert exp["envs"]["CUDA_DEVICE_MAX_CONNECTIONS"] == 1  # TP > 1 on both meshes: Megatron asserts it
    assert cfg["action"] == "run"
    train = cfg["train"]
    assert set(train) == {"system", "model", "data"}
    # runner_train: checkpoint.save is always set, so Megatron's validate_args needs save_interval > 0
    train["system"]["checkpoint"]["save"] = str(tmp_path / "checkpoints")
    argv = flatten_dict_to_args(train)
    i = argv.index("--save-interval")
    assert "--save" in argv and int(argv[i + 1]) > 0
    flagscale_asserts(train, MIXTRAL)
    # the vocabulary: FlagScale's Megatron (core ~0.15) NullTokenizer adds one EOD token
    assert train["data"]["tokenizer"]["vocab_size"] + 1 == MIXTRAL.vocab_size


def test_flagscale_env_only_with_tp_or_cp() -> None:
    from hapmoe_milp.export.flagscale import experiment_config

    tp1 = make_plan([12, 12], ["h800", "910b"], [ParallelConfig(dp=8, ep=8), ParallelConfig(dp=8, ep=8)], mbs=1)
    visible = {
        "h800": {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"},
        "910b": {"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"},
    }
    assert experiment_config(tp1, C16)["experiment"]["envs"] == {"device_type_specific": visible}
    assert experiment_config(HETERO, C16)["experiment"]["envs"] == {
        "CUDA_DEVICE_MAX_CONNECTIONS": 1,
        "device_type_specific": visible,
    }


def test_offload_reaches_the_flagscale_config() -> None:
    from hapmoe_milp.config import Settings

    plan = HETERO.with_settings(HETERO.settings().with_(optimizer_offload=True))
    s = flagscale_config(plan, MIXTRAL, C16)["system"]
    assert s["optimizer_cpu_offload"] is True and s["use_precision_aware_optimizer"] is True
    assert s["optimizer_offload_fraction"] == 1.0 and s["use_distributed_optimizer"] is True
    argv = flatten_dict_to_args({"system": s})
    assert "--optimizer-cpu-offload" in argv and "--use-precision-aware-optimizer" in argv
    assert "optimizer_cpu_offload" not in flagscale_config(HETERO, MIXTRAL, C16)["system"]
    assert Settings().optimizer_offload is False
