"""The plans tools/megatron_memory_oracle.py runs through Megatron-LM's own code (and the test re-prices).

One megatron-family plan per catalog model (TP2, PP2 when the layers split evenly, EP up to 8, on 64 H100),
plus plans that exercise each memory lever's flags (recompute modules, block/uniform recompute, Megatron-FSDP,
activation offload, state precision) for ``validate_args``, and a dense MHA non-gated model with dropout
on -- the layer Megatron's activation formula describes exactly.
"""

from __future__ import annotations

from typing import Any

from hapmoe_milp.specs.model import ModelSpec


def catalog_knobs(m: ModelSpec) -> dict[str, Any]:
    """A valid megatron-family layout for any catalog model on 64 GPUs: TP2 when heads and groups split,
    PP2 when the layers split evenly, EP up to 8 (ETP1) for MoE models."""
    tp = 2 if m.num_attention_heads % 2 == 0 and (m.multi_latent_attention or m.groups % 2 == 0) else 1
    pp = 2 if len(m.layer_kinds) % 2 == 0 else 1
    knobs: dict[str, Any] = {"tp": tp, "pp": pp}
    if m.is_moe:
        dp = 64 // (tp * pp)
        knobs["ep"] = next(e for e in (8, 4, 2, 1) if (m.num_experts or 1) % e == 0 and dp % e == 0)
        knobs["etp"] = 1
    return knobs


def is_hybrid(m: ModelSpec) -> bool:
    """Models with Mamba / gated-DeltaNet mixers or sub-layer-only layers: Megatron's theoretical-memory
    report returns early for them ("not yet supported"), so the weights comparison skips them."""
    return any(k not in ("dense", "moe", "mtp") for k in m.layer_kinds)


def _case(name: str, model: str, knobs: dict[str, Any], **settings: Any) -> dict[str, Any]:
    return {"name": name, "model": model, "cluster": "64xh100", "knobs": knobs,
            "settings": {"global_batch_size": 256, "seq_length": 4096, **settings}}  # fmt: skip


def catalog_cases(catalog: Any) -> list[dict[str, Any]]:
    """One plan per catalog model (the catalog is read when the cases are built: new models join)."""
    return [_case(n, n, catalog_knobs(catalog.model(n))) for n in catalog.model_names()]


LEVER_CASES: list[dict[str, Any]] = [
    _case("qwen3-30b-sel-moe", "qwen3-30b-a3b", {"tp": 2, "pp": 2, "ep": 8, "etp": 1, "recompute": "sel-moe"}),
    _case("moonlight-sel-mlp", "moonlight-16b-a3b", {"tp": 2, "ep": 8, "etp": 1, "recompute": "sel-mlp"}),
    _case(
        "deepseek-v3-modules",
        "deepseek-v3",
        {"tp": 2, "pp": 2, "ep": 8, "etp": 1, "recompute": "mla_up_proj,shared_experts,moe_act"},
    ),
    # tied embeddings at PP = 1: one vocabulary matrix on the only stage (issue 23's double count)
    _case("qwen1.5-0.5b-tied-pp1", "qwen1.5-0.5b", {"tp": 2, "pp": 1}),
    _case("gemma-2b-tied-pp1", "gemma-2b", {"tp": 1, "pp": 1}),
    _case("llama-3-70b-block", "llama-3-70b", {"tp": 4, "pp": 4, "recompute": "full:2"}),
    _case("llama-3-70b-uniform", "llama-3-70b", {"tp": 4, "pp": 4, "recompute": "uniform:2"}),
    _case("mixtral-8x7b-fsdp", "mixtral-8x7b", {"tp": 2, "ep": 8, "etp": 1}, fsdp="optim_grads_params"),
    _case("llama-3-8b-fsdp-optim-grads", "llama-3-8b", {"tp": 1}, fsdp="optim_grads"),
    _case(
        "qwen3-30b-fsdp-cp2-sel-moe",
        "qwen3-30b-a3b",
        {"cp": 2, "ep": 8, "etp": 1, "recompute": "sel-moe"},
        fsdp="optim_grads_params",
    ),
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
