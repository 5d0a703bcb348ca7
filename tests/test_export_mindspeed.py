"""MindSpeed-LLM export for Ascend-only plans, checked against MindSpeed-LLM's own argument handling
(re-enacted in :mod:`tests.mindspeed_oracle`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hapmoe_milp.api import solve
from hapmoe_milp.config import ParallelConfig
from hapmoe_milp.export import export_plan
from hapmoe_milp.export.megatron import parse_hostfile
from hapmoe_milp.export.mindspeed import mindspeed_args
from hapmoe_milp.export.validate import validate
from hapmoe_milp.plan import Plan, Stage
from hapmoe_milp.specs import Catalog
from tests.mindspeed_oracle import Refused, mindspeed_accepts

CAT = Catalog()
A16 = CAT.cluster("16-2-h")  # 16 Ascend 910B


def stages(counts: list[int], cfg: ParallelConfig) -> tuple[Stage, ...]:
    out, pos = [], 0
    for n in counts:
        out.append(Stage("910b", cfg, pos, pos + n))
        pos += n
    return tuple(out)


def test_uneven_split_goes_to_num_layer_list() -> None:
    model = CAT.model("mixtral-s")
    plan = Plan("mixtral-s", "16-2-h", "megatron", stages([10, 8, 6], ParallelConfig(tp=2, dp=2, ep=4)), 256, 4096, 1)
    argv = mindspeed_args(plan, model, A16)
    assert argv[argv.index("--num-layer-list") + 1] == "10,8,6"
    assert "--pipeline-model-parallel-layout" not in argv and "--decoder-first-pipeline-num-layers" not in argv
    a = mindspeed_accepts(argv, world=plan.devices_used)
    assert a.num_layers == 24 and a.transformer_impl == "local"
    assert validate(plan, model, A16, "mindspeed") == []


@pytest.mark.parametrize("fused", [True, False])
def test_npu_fusions_are_opt_in_flags_as_the_plan_was_priced(fused: bool) -> None:
    """MindSpeed's NPU SwiGLU and rotary fusions are opt-in (--use-fused-swiglu, --use-fused-rotary-pos-emb):
    a plan priced fused (the default) asks for them, one priced unfused leaves them out, and Megatron's opt-out
    spellings never reach MindSpeed's command line."""
    from dataclasses import replace

    model = CAT.model("mixtral-s")
    plan = Plan("mixtral-s", "16-2-h", "megatron", stages([12, 12], ParallelConfig(tp=2, dp=2, ep=4)), 256, 4096, 1)
    st = replace(plan.settings(), fused_swiglu=fused, fused_rope=fused)
    argv = mindspeed_args(replace(plan, run_settings=st), model, A16)
    assert ("--use-fused-swiglu" in argv) is fused and ("--use-fused-rotary-pos-emb" in argv) is fused
    assert "--no-bias-swiglu-fusion" not in argv and "--no-rope-fusion" not in argv
    a = mindspeed_accepts(argv, world=plan.devices_used)
    assert a.use_fused_swiglu is fused and a.use_fused_rotary_pos_emb is fused


def test_even_split_needs_no_list_and_a_wrong_list_is_refused() -> None:
    model = CAT.model("mixtral-s")
    plan = Plan("mixtral-s", "16-2-h", "megatron", stages([12, 12], ParallelConfig(tp=2, dp=4, ep=8)), 256, 4096, 1)
    argv = mindspeed_args(plan, model, A16)
    assert "--num-layer-list" not in argv
    mindspeed_accepts(argv, world=16)
    with pytest.raises(Refused, match="sum"):
        mindspeed_accepts([*argv, "--num-layer-list", "12,11"], world=16)
    with pytest.raises(Refused, match=r"unrecognized arguments"):
        mindspeed_accepts([*argv, "--pipeline-model-parallel-layout", "Et*12|t*12L"], world=16)


def test_vpp_plans_are_not_mindspeeds() -> None:
    model = CAT.model("mixtral-s")
    cfg = ParallelConfig(tp=2, dp=2, ep=4)
    plan = Plan("mixtral-s", "16-2-h", "megatron", stages([6, 6, 6, 6], cfg), 256, 4096, 1, vpp=2)
    assert "rule_runtime_vpp" in {v.rule for v in validate(plan, model, A16, "mindspeed")}


MODELS = ["mixtral-s", "mixtral-l", "deepseek-v3", "qwen3-235b-a22b", "deepseek-v2-lite"]


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_ascend_plans_export_and_pass_mindspeeds_checks(model: str, tmp_path: Path) -> None:
    """``solve --export mindspeed`` on the 910B-only cluster: the search's plan exports, and the command
    line and hostfile pass the re-enacted parsing and validation."""
    from hapmoe_milp.errors import InfeasibleError

    try:
        sol = solve(model, "16-2-h", time_limit=20, export="mindspeed", catalog=CAT)
    except InfeasibleError as exc:  # too large for 16 devices: said, not exported
        assert exc.constraint != "time", exc
        pytest.skip(f"{model} does not fit 16 910B: {exc}")
    assert sol.plan is not None and sol.plan.runtime == "mindspeed" and sol.plan.vpp == 1
    files = export_plan(sol.plan, CAT.model(model), A16, "mindspeed", tmp_path)
    assert {f.name for f in files} >= {"mindspeed_args.txt", "hostfile", "launch_node0.sh", "plan.json"}
    argv = (tmp_path / "mindspeed_args.txt").read_text().split()
    world = sum(n for _host, n in parse_hostfile((tmp_path / "hostfile").read_text()))
    assert world == sol.plan.devices_used
    mindspeed_accepts(argv, world=world)
    script = (tmp_path / "launch_node0.sh").read_text()
    assert '"$MINDSPEED_LLM/pretrain_gpt.py"' in script and "PYTORCH_NPU_ALLOC_CONF" in script
