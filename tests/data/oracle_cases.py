"""The plans tools/megatron_memory_oracle.py runs through Megatron-LM's own code (and the test re-prices).

One megatron-family plan per catalog model (TP2, PP2 when the layers split evenly, EP up to 8, on 64 H100),
plus plans that exercise each memory lever's flags (recompute modules, block/uniform recompute, Megatron-FSDP,
activation offload, state precision) for ``validate_args``, and a dense MHA non-gated model with dropout
on -- the layer Megatron's activation formula describes exactly.
"""

from __future__ import annotations

from typing import Any

from hapmoe_milp.specs.model import ModelSpec

CATALOG_MODELS = (
    "dbrx", "deepseek-v2-lite", "deepseek-v2", "deepseek-v3", "gpt-oss-120b", "llama-2-13b", "llama-2-70b",
    "llama-2-7b", "llama-3-70b", "llama-3-8b", "llama-3.1-405b", "mixtral-8x22b", "mixtral-8x7b", "mixtral-l",
    "mixtral-s", "moonlight-16b-a3b", "olmoe-1b-7b", "qwen2-57b-a14b", "qwen3-235b-a22b", "qwen3-30b-a3b",
)  # fmt: skip

# (layers incl. MTP, experts) per model, so the knobs below are valid without loading the catalog here
_EP = {"dbrx": 8, "deepseek-v2-lite": 8, "deepseek-v2": 8, "deepseek-v3": 8, "gpt-oss-120b": 8, "mixtral-8x22b": 8,
       "mixtral-8x7b": 8, "mixtral-l": 8, "mixtral-s": 8, "moonlight-16b-a3b": 8, "olmoe-1b-7b": 8,
       "qwen2-57b-a14b": 8, "qwen3-235b-a22b": 8, "qwen3-30b-a3b": 8}  # fmt: skip
_PP1 = {"deepseek-v2-lite", "moonlight-16b-a3b"}  # 27 layers: no even split over 2 stages


def _case(name: str, model: str, knobs: dict[str, Any], **settings: Any) -> dict[str, Any]:
    return {"name": name, "model": model, "cluster": "64xh100", "knobs": knobs,
            "settings": {"global_batch_size": 256, "seq_length": 4096, **settings}}  # fmt: skip


CASES: list[dict[str, Any]] = [
    _case(m, m, {"tp": 2, "pp": 1 if m in _PP1 else 2, "ep": _EP.get(m, 1), "etp": 1 if m in _EP else None})
    for m in CATALOG_MODELS
]
CASES += [
    _case("qwen3-30b-sel-moe", "qwen3-30b-a3b", {"tp": 2, "pp": 2, "ep": 8, "etp": 1, "recompute": "sel-moe"}),
    _case("moonlight-sel-mlp", "moonlight-16b-a3b", {"tp": 2, "ep": 8, "etp": 1, "recompute": "sel-mlp"}),
    _case(
        "deepseek-v3-modules",
        "deepseek-v3",
        {"tp": 2, "pp": 2, "ep": 8, "etp": 1, "recompute": "mla_up_proj,shared_experts,moe_act"},
    ),
    _case("llama-3-70b-block", "llama-3-70b", {"tp": 4, "pp": 4, "recompute": "full:2"}),
    _case("llama-3-70b-uniform", "llama-3-70b", {"tp": 4, "pp": 4, "recompute": "uniform:2"}),
    _case("mixtral-8x7b-fsdp", "mixtral-8x7b", {"tp": 2, "ep": 8, "etp": 1}, fsdp="optim_grads_params"),
    _case("llama-3-8b-fsdp-optim-grads", "llama-3-8b", {"tp": 1}, fsdp="optim_grads"),
    _case(
        "qwen3-30b-offload",
        "qwen3-30b-a3b",
        {"tp": 2, "pp": 2, "ep": 8, "etp": 1},
        offload_modules=("expert_fc1", "moe_act"),
    ),
    _case(
        "llama-3-70b-fp8-states",
        "llama-3-70b",
        {"tp": 4, "pp": 4},
        precision="fp8",
        fp8_param_gather=True,
        grad_reduce_in_bf16=True,
        optimizer_state_dtype="bf16",
    ),
]

DENSE_CASE = _case("dense-mha-core-attn", "dense-mha", {"tp": 2, "pp": 2, "recompute": "core_attn"}, dropout=True)


def dense_mha_model() -> ModelSpec:
    """h 1024, 8 MHA heads of 128, F 4096, non-gated, 8 layers: Korthikanti's / Megatron's textbook layer."""
    return ModelSpec(name="dense-mha", num_layers=8, hidden_size=1024, num_attention_heads=8, vocab_size=32000,
                     ffn_hidden_size=4096, swiglu=False)  # fmt: skip
