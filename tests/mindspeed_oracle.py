"""MindSpeed-LLM, re-enacted for the tests: what its ``pretrain_gpt.py`` does with our command line before
training, written in our own code from reading the sources (MindSpeed-LLM needs torch_npu and its Megatron
core_v0.12.1, so it is not installable here):

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

# Megatron _add_regularization_args (core_v0.12.1 as everywhere since 2020): dropout probabilities
FLOAT_FLAGS = ("attention-dropout", "hidden-dropout")


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
    # Megatron-LM core_v0.12.1 (a845aa7e) arguments.py _add_training_args
    "cross-entropy-loss-fusion",
    # MindSpeed features_manager/megatron_basic/megatron_basic.py (also mindspeed/arguments.py since 2024)
    "use-fused-swiglu",
    # MindSpeed-LLM c77308a1 features_manager/common/rotary.py
    "use-fused-rotary-pos-emb",
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
    for f in FLOAT_FLAGS:
        p.add_argument(f"--{f}", type=float)
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
