"""MindSpeed-LLM export for Ascend-only plans, checked against MindSpeed-LLM's own argument handling.

MindSpeed-LLM is not installable here (it needs torch_npu and its Megatron core_v0.12.1), so the tests
re-enact, in our own code, what its ``pretrain_gpt.py`` does with our command line before training:

* argument parsing: the flags we emit, each one checked to exist with this arity/choices in Megatron-LM
  core_v0.12.1 ``megatron/training/arguments.py`` (NVIDIA/Megatron-LM a845aa7e) or in MindSpeed-LLM's
  features (Ascend/MindSpeed-LLM c77308a1: ``--num-layer-list`` in
  ``features_manager/pipeline_parallel/num_layer_list.py``, ``--context-parallel-algo`` in
  ``features_manager/context_parallel/context_parallel_feature.py``, ``--shared-expert-gate`` in
  ``features_manager/moe/shared_expert.py``); an unknown flag or a value outside the choices fails as
  argparse would;
* validation: the num-layer-list feature (``pre_validate_args`` sets ``num_layers`` to the list's length,
  ``validate_args`` wants one entry per stage, PP > 1 and no virtual pipeline, and the config wrapper in
  ``training/arguments.py`` wants the entries to sum to the real ``--num-layers``), then core 0.12.1's
  world-size, batch, expert and context-parallel arithmetic and its MoE/TP sequence-parallel rule.
"""

from __future__ import annotations

import argparse
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

CAT = Catalog()
A16 = CAT.cluster("16-2-h")  # 16 Ascend 910B

# value flags (argparse type) and bare flags; checked present in the sources the module doc names
INT_FLAGS = [
    "tensor-model-parallel-size",
    "pipeline-model-parallel-size",
    "context-parallel-size",
    "expert-model-parallel-size",
    "expert-tensor-parallel-size",
    "micro-batch-size",
    "global-batch-size",
    "seq-length",
    "max-position-embeddings",
    "num-layers",
    "hidden-size",
    "ffn-hidden-size",
    "num-attention-heads",
    "num-query-groups",
    "kv-channels",
    "q-lora-rank",
    "kv-lora-rank",
    "qk-head-dim",
    "qk-pos-emb-head-dim",
    "v-head-dim",
    "make-vocab-size-divisible-by",
    "mtp-num-layers",
    "num-experts",
    "moe-router-topk",
    "moe-ffn-hidden-size",
    "moe-shared-expert-intermediate-size",
    "recompute-num-layers",
    "vocab-size",
]
STR_FLAGS = ("moe-layer-freq", "optimizer-offload-fraction", "num-layer-list", "tokenizer-type")
BARE_FLAGS = [
    "sequence-parallel",
    "multi-latent-attention",
    "group-query-attention",
    "swiglu",
    "untie-embeddings-and-output-weights",
    "disable-bias-linear",
    "add-qkv-bias",
    "qk-layernorm",
    "moe-router-pre-softmax",
    "moe-router-enable-expert-bias",
    "moe-grouped-gemm",
    "use-distributed-optimizer",
    "optimizer-cpu-offload",
    "use-precision-aware-optimizer",
    "overlap-grad-reduce",
    "overlap-param-gather",
    "bf16",
    "mock-data",
    "use-mcore-models",
    "shared-expert-gate",
]
CHOICES = {
    "normalization": ("LayerNorm", "RMSNorm"),
    "position-embedding-type": ("learned_absolute", "rope", "mrope", "none"),
    "moe-token-dispatcher-type": ("allgather", "alltoall", "flex", "alltoall_seq"),
    "moe-router-score-function": ("softmax", "sigmoid"),
    "recompute-granularity": ("full", "selective"),
    "recompute-method": ("uniform", "block"),
    "transformer-impl": ("local", "transformer_engine"),
    "context-parallel-algo": ("megatron_cp_algo", "hybrid_cp_algo", "kvallgather_cp_algo"),
}
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe")


class Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits; the re-enactment raises instead
        raise Refused(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(allow_abbrev=False)
    for f in INT_FLAGS:
        p.add_argument(f"--{f}", type=int)
    for f in STR_FLAGS:
        p.add_argument(f"--{f}", type=str)
    for f in BARE_FLAGS:
        p.add_argument(f"--{f}", action="store_true")
    for f, ch in CHOICES.items():
        p.add_argument(f"--{f}", choices=ch)
    p.add_argument("--recompute-modules", nargs="*", choices=RECOMPUTE_MODULES)
    return p


def mindspeed_accepts(argv: list[str], world: int) -> argparse.Namespace:
    """Parse and validate as MindSpeed-LLM would (see the module doc); raise Refused where it refuses."""
    a = parser().parse_args(argv)
    tp, pp, cp = a.tensor_model_parallel_size or 1, a.pipeline_model_parallel_size or 1, a.context_parallel_size or 1
    real_layers = a.num_layers
    if a.num_layer_list:  # pre_validate_args
        a.num_layers = len(a.num_layer_list.split(","))
        if len(a.num_layer_list.split(",")) != pp:
            raise Refused("len(args.num_layer_list) != args.pipeline_model_parallel_size")
        if pp <= 1:
            raise Refused("Dynamic pipeline model should work with pipeline parallel.")
    if world % (tp * pp * cp):
        raise Refused(f"world size {world} is not divisible by tp*pp*cp {tp * pp * cp}")
    dp = world // (tp * pp * cp)
    if a.num_layers % pp:
        raise Refused("num_layers must be divisible by pipeline_model_parallel_size")
    if a.global_batch_size % (a.micro_batch_size * dp):
        raise Refused("global batch size is not divisible by micro batch size times data parallel size")
    if cp > 1 and a.seq_length % (2 * cp):
        raise Refused("seq-length should be a multiple of 2 * context-parallel-size")
    if a.num_experts:
        ep, etp = a.expert_model_parallel_size or 1, a.expert_tensor_parallel_size or tp
        if a.num_experts % ep:
            raise Refused("num_experts must be divisible by expert_model_parallel_size")
        if world % (etp * ep * pp):
            raise Refused("world size is not divisible by expert_tensor x expert x pipeline parallel size")
        if tp > 1 and not a.sequence_parallel:
            raise Refused("expert parallelism with tensor parallelism needs sequence parallelism")
    if a.optimizer_cpu_offload and not a.use_precision_aware_optimizer:
        raise Refused("--optimizer-cpu-offload needs --use-precision-aware-optimizer")
    if a.recompute_granularity == "full" and (a.recompute_method is None or not a.recompute_num_layers):
        raise Refused("full recompute needs a method and a layer count")
    if a.num_layer_list:  # post_validate_args restores num_layers; the config wrapper checks the sum
        a.num_layers = real_layers
        if sum(int(x) for x in a.num_layer_list.split(",")) != real_layers:
            raise Refused("Incorrect num_layer_list config since its sum is unequal to total num layers")
    return a


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
