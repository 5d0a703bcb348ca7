"""MindSpeed-LLM export for Ascend-only plans: ``pretrain_gpt.py`` arguments, launch scripts, hostfile.

MindSpeed-LLM (Ascend/MindSpeed-LLM @ :data:`~hapmoe_milp.runtimes.MINDSPEED_COMMIT`) runs Megatron-LM
core_v0.12.1 with its own features on top, so its command line is Megatron's with these differences:

* uneven layers per pipeline stage: ``--num-layer-list a,b,...`` (decoder layers per stage; MTP layers
  ride on the last stage). Its feature (``features_manager/pipeline_parallel/num_layer_list.py``) wants
  one entry per stage, pipeline size > 1 and no virtual pipeline, and the list must sum to
  ``--num-layers`` (``training/arguments.py``); core 0.12.1 has no ``--pipeline-model-parallel-layout``.
  An even split needs no flag (``num_layers % pp == 0``). The runtime does not search VPP.
* ``--context-parallel-algo megatron_cp_algo`` (ring attention, Megatron's own algorithm) when CP > 1
  (``features_manager/context_parallel/context_parallel_feature.py``);
* ``--use-mcore-models --transformer-impl local``, as every MindSpeed-LLM example launches, and its own
  spelling of the shared-expert gate (``--shared-expert-gate``, ``features_manager/moe/shared_expert.py``);
* the environment of its examples (``PYTORCH_NPU_ALLOC_CONF``, HCCL timeouts), and
  ``ASCEND_RT_VISIBLE_DEVICES`` for a launch unit that shares a node;
* synthetic data through core 0.12.1's NullTokenizer, which adds an EOD token to ``--vocab-size``.

:func:`parse_mindspeed_args` reads the command line back; ``validate`` checks it with
:mod:`hapmoe_milp.export.validate.mindspeed_rules`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hapmoe_milp.config import Settings
from hapmoe_milp.errors import ExportError
from hapmoe_milp.export.common import GENERATED_MARK, stage_layers
from hapmoe_milp.export.megatron import Flavor, megatron_args, parse_megatron_args
from hapmoe_milp.export.megatron_arch import position_embedding
from hapmoe_milp.plan import Plan
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

ARGS_FILE = "mindspeed_args.txt"
# Megatron-LM flags MindSpeed-LLM's core 0.12.1 does not have, or that num-layer-list replaces
SPLIT_FLAGS = (
    "--pipeline-model-parallel-layout",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--num-virtual-stages-per-pipeline-rank",
)
# Megatron-LM flags MindSpeed-LLM spells its own way (features_manager/moe/shared_expert.py)
RENAMED = {"--moe-shared-expert-gate": "--shared-expert-gate"}
# Megatron's opt-out fusion flags: under ``--transformer-impl local`` MindSpeed's NPU fusions are opt-in instead
# (``fusion_flags``), so these are dropped
MEGATRON_FUSION_OPT_OUTS = ("--no-bias-swiglu-fusion", "--no-rope-fusion")
MINDSPEED_ENV: tuple[tuple[str, str, str], ...] = (
    ("CUDA_DEVICE_MAX_CONNECTIONS", "1", "MindSpeed-LLM examples set it on every run"),
    ("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True", "MindSpeed-LLM examples: fewer fragmentation OOMs"),
    ("HCCL_CONNECT_TIMEOUT", "3600", "MindSpeed-LLM examples"),
    ("HCCL_EXEC_TIMEOUT", "3600", "MindSpeed-LLM examples"),
)
MINDSPEED_FLAVOR = Flavor(
    "mindspeed", "MINDSPEED_LLM", "your MindSpeed-LLM checkout", ARGS_FILE, MINDSPEED_ENV, probe_vocab=False
)


def num_layer_list(plan: Plan, model: ModelSpec) -> list[int] | None:
    """Decoder layers per stage for ``--num-layer-list``, or None when the even split gives them."""
    if plan.pp < 2:
        return None
    counts = [sl.decoder for sl in stage_layers(plan, model)]
    if model.num_layers % plan.pp == 0 and all(c == model.num_layers // plan.pp for c in counts):
        return None
    return counts


def mindspeed_args(plan: Plan, model: ModelSpec, cluster: ClusterSpec, settings: Settings | None = None) -> list[str]:
    """The ``pretrain_gpt.py`` arguments MindSpeed-LLM runs ``plan`` with (tokens, argv style)."""
    if plan.vpp > 1:
        raise ExportError(
            "[rule_runtime_vpp] MindSpeed-LLM's --num-layer-list excludes virtual pipeline stages", field="vpp"
        )
    out: list[str] = []
    skip = False
    for tok in megatron_args(plan, model, cluster, settings):
        if tok.startswith("--"):
            skip = tok in SPLIT_FLAGS or tok in MEGATRON_FUSION_OPT_OUTS
            tok = RENAMED.get(tok, tok)
        if not skip:
            out.append(tok)
    layers = num_layer_list(plan, model)
    if layers is not None:
        out += ["--num-layer-list", ",".join(str(n) for n in layers)]
    if plan.stages[0].cfg.cp > 1:
        out += ["--context-parallel-algo", "megatron_cp_algo"]
    out += fusion_flags(plan.settings(settings), model)
    return [*out, "--use-mcore-models", "--transformer-impl", "local"]


def fusion_flags(st: Settings, model: ModelSpec) -> list[str]:
    """MindSpeed's opt-in NPU fusions the cost model priced as fused (``Settings.fused_swiglu`` / ``fused_rope``,
    cost/layer.py): ``--use-fused-swiglu`` (MindSpeed ``features_manager/megatron_basic/megatron_basic.py``, with
    ``--swiglu``) and ``--use-fused-rotary-pos-emb`` (MindSpeed-LLM ``features_manager/common/rotary.py``@c77308a1);
    without them the run takes the element-wise chains, which the cost model prices when the settings say so."""
    a: list[str] = []
    if st.fused_swiglu and model.swiglu:
        a += ["--use-fused-swiglu"]
    if st.fused_rope and position_embedding(model) == "rope" and not model.multi_latent_attention:
        a += ["--use-fused-rotary-pos-emb"]
    return a


def parse_mindspeed_args(args: Sequence[str] | str) -> dict[str, Any]:
    """The command line as ``{dest: value}`` (Megatron's parsing; ``--num-layer-list`` stays a string,
    as MindSpeed-LLM's parser keeps it)."""
    out = parse_megatron_args(args)
    if "num_layer_list" in out:
        out["num_layer_list"] = str(out["num_layer_list"])
    return out


def readme(plan: Plan, model: ModelSpec, cluster: ClusterSpec, args: Sequence[str]) -> str:
    layers = num_layer_list(plan, model)
    lines = [
        f"{GENERATED_MARK}: MindSpeed-LLM launch for {plan.model} on {plan.cluster} (Ascend)",
        "",
        f"Mesh: {plan.stages[0].cfg.label()}, PP {plan.pp}; micro-batch {plan.micro_batch_size}, global batch "
        f"{plan.global_batch_size}, {plan.num_microbatches} micro-batches per iteration.",
        "Decoder layers per stage: "
        + (",".join(map(str, layers)) + " (--num-layer-list)" if layers else "even split (no flag needed)"),
        "",
        "Files:",
        f"  {ARGS_FILE}  model + parallelism flags for MindSpeed-LLM's pretrain_gpt.py (one flag per line)",
        "  hostfile             hosts in global rank order (replace the placeholder names)",
        "  launch_node<k>.sh    one torchrun agent per line of the hostfile",
        "  plan.json            the plan with its predicted cost",
        "",
        "Run launch_node<k>.sh on host k of the hostfile with MASTER_ADDR (host 0) and MINDSPEED_LLM (a",
        "MindSpeed-LLM checkout with its Megatron-LM core_v0.12.1 and MindSpeed installed). DATA_ARGS defaults to",
        f"synthetic data with a NullTokenizer of exactly {model.vocab_size} tokens; set it to your --data-path and",
        "tokenizer flags (e.g. --tokenizer-type PretrainedFromHF --tokenizer-name-or-path ...) for real data.",
    ]
    del cluster, args
    return "\n".join(lines) + "\n"
