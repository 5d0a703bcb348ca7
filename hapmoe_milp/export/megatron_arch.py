"""Megatron-LM flags for the architecture features of current MoE families, and what Megatron cannot run.

Flag names are Megatron-LM's (``megatron/training/arguments.py``; the TransformerConfig fields they set
are megatron-core 0.16.1's): partial rotary ``--rotary-percent``, Llama 4's ``--no-rope-freq`` and
``--qk-l2-norm``, Qwen3-Next's ``--attention-output-gate`` and gated DeltaNet
(``--experimental-attention-variant gated_delta_net`` with ``--linear-*``), group-limited routing
(``--moe-router-num-groups``/``--moe-router-group-topk``), and the hybrid (Mamba) models, which run under
``pretrain_mamba.py`` with the Mamba stack spec, ``--hybrid-override-pattern`` and ``--mamba-*`` (as in
NVIDIA's Nemotron-H recipes: no position embedding, squared-ReLU MLPs).

Features Megatron-Core does not implement are :class:`Gap` s naming the runtime that does; a blocking gap
(the model cannot be built at all) stops the Megatron export, a non-blocking one (Megatron would run a
different attention than the plan priced) is a validation warning.
"""

from __future__ import annotations

from dataclasses import dataclass

from hapmoe_milp.specs.model import ModelSpec

ENTRY_GPT = "pretrain_gpt.py"
ENTRY_HYBRID = "pretrain_mamba.py"
MAMBA_STACK_SPEC = ("megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec")


@dataclass(frozen=True)
class Gap:
    """An architecture feature Megatron-Core (0.16) does not build, and where it runs instead."""

    feature: str
    runtime: str
    blocking: bool


def megatron_gaps(m: ModelSpec) -> list[Gap]:
    out: list[Gap] = []
    if m.is_hybrid and m.mamba_version == 1:
        out.append(
            Gap(
                "Mamba-1 (selective-scan) mixers: Megatron-Core's MambaMixer is Mamba-2 only",
                "Hugging Face transformers (JambaForCausalLM, https://huggingface.co/docs/transformers/model_doc/jamba) "
                "with FSDP or DeepSpeed",
                blocking=True,
            )
        )
    if m.attention_chunk_size:
        out.append(
            Gap(
                f"chunked attention (blocks of {m.attention_chunk_size} tokens on the RoPE layers): Megatron-Core "
                "has none and would run full causal attention there",
                "NVIDIA Megatron-Bridge's Llama 4 layer spec (bridge.models.llama.llama4_utils, "
                "https://docs.nvidia.com/nemo/megatron-bridge/latest/apidocs/bridge/bridge.models.llama.llama4_utils.html)",
                blocking=False,
            )
        )
    return out


def entry_script(m: ModelSpec) -> str:
    """The Megatron-LM training script for the model: hybrid (Mamba) models have their own."""
    return ENTRY_HYBRID if m.is_hybrid else ENTRY_GPT


def feature_args(m: ModelSpec) -> list[str]:
    """Flags beyond the classic GPT layer (``megatron.model_args`` emits those)."""
    a: list[str] = []
    if m.rotary_percent != 1.0 and not m.is_hybrid:
        a += ["--rotary-percent", f"{m.rotary_percent:g}"]
    if m.no_rope_freq:
        a += ["--no-rope-freq", str(m.no_rope_freq)]
    if m.qk_l2_norm:
        a += ["--qk-l2-norm"]
    if m.attention_output_gate:
        a += ["--attention-output-gate"]
    if m.squared_relu:
        a += ["--squared-relu"]
    if m.moe_router_num_groups and m.moe_router_group_topk:
        a += ["--moe-router-num-groups", str(m.moe_router_num_groups)]
        a += ["--moe-router-group-topk", str(m.moe_router_group_topk)]
    if m.has_linear_attention:
        a += ["--experimental-attention-variant", "gated_delta_net"]
        a += ["--linear-attention-freq", _freq_arg(m.linear_attention_freq)]
        a += ["--linear-conv-kernel-dim", str(m.linear_conv_kernel_dim)]
        a += [
            "--linear-key-head-dim",
            str(m.linear_key_head_dim),
            "--linear-value-head-dim",
            str(m.linear_value_head_dim),
        ]
        a += ["--linear-num-key-heads", str(m.linear_num_key_heads)]
        a += ["--linear-num-value-heads", str(m.linear_num_value_heads)]
    if m.is_hybrid:
        a += ["--is-hybrid-model", "--spec", *MAMBA_STACK_SPEC]
        a += ["--hybrid-override-pattern", m.hybrid_override_pattern or ""]
        shape = m.mamba_shape
        a += ["--mamba-state-dim", str(m.mamba_state_dim), "--mamba-head-dim", str(m.mamba_head_dim)]
        a += ["--mamba-num-groups", str(m.mamba_num_groups)]
        a += ["--mamba-num-heads", str(getattr(shape, "heads", 0) or m.mamba_num_heads)]
    return a


def position_embedding(m: ModelSpec) -> str:
    """Megatron's ``--position-embedding-type``: Nemotron-H's hybrid stacks use none (NVIDIA's recipes); a
    model (or a measured run) with learned absolute position embeddings says so."""
    if m.learned_absolute_position_embedding:
        return "learned_absolute"
    return "none" if m.is_hybrid else "rope"


def _freq_arg(f: int | tuple[int, ...] | None) -> str:
    """An int, or a list expression Megatron evaluates (``moe_freq_type``), run-length encoded."""
    if f is None or isinstance(f, int):
        return str(f)
    runs: list[list[int]] = []
    for v in f:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return "(" + "+".join(f"[{v}]*{n}" for v, n in runs) + ")"
