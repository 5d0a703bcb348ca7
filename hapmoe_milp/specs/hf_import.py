"""Map a Hugging Face ``config.json`` onto the same :class:`ModelSpec` the YAML catalog uses.

Each family names the same quantity differently (``num_local_experts`` vs ``n_routed_experts`` vs
``num_experts``; ``intermediate_size`` is the expert width in Mixtral but the dense width in Qwen). The
mapping lives here, once, so everything downstream sees Megatron's names.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hapmoe_milp.errors import SpecError
from hapmoe_milp.limits import MAX_LAYERS
from hapmoe_milp.specs._fields import Fields, load_document
from hapmoe_milp.specs.model import ModelSpec, TrainingDefaults, validate_model

SUPPORTED = (
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "olmoe",
    "gpt_oss",
    "llama",
    "qwen2",
    "qwen3",
)


def _safe_name(text: str) -> str:
    """A catalog-safe name from a folder name (spaces and other characters become '-')."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-._+")[:128]


def _pattern(n_layers: int, moe: list[bool]) -> tuple[int, ...] | int:
    pat = tuple(int(m) for m in moe)
    return 1 if all(pat) else pat


def model_from_hf_config(doc: dict[str, Any], source: str, name: str | None = None) -> ModelSpec:
    f = Fields(doc, source)
    mt = f.str_("model_type", "")
    if mt not in SUPPORTED:
        raise f.err("model_type", f"unsupported model_type {mt!r}; supported: {', '.join(SUPPORTED)}")
    L = f.int_("num_hidden_layers", maximum=MAX_LAYERS)
    h = f.int_("hidden_size")
    nh = f.int_("num_attention_heads")
    nkv = f.int_("num_key_value_heads", nh)
    V = f.int_("vocab_size")
    tied = f.bool_("tie_word_embeddings", False)
    head_dim = f.int_("head_dim", None)
    kw: dict[str, Any] = {
        "name": name or _safe_name(Path(source).parent.name) or mt,
        "num_layers": L,
        "hidden_size": h,
        "num_attention_heads": nh,
        "num_query_groups": nkv,
        "vocab_size": V,
        "untie_embeddings_and_output_weights": not tied,
        "origin": source,
        "description": f"imported from Hugging Face config ({mt})",
    }
    if head_dim and not mt.startswith("deepseek"):
        kw["kv_channels"] = head_dim
    if mt in ("llama", "qwen2", "qwen3"):
        kw["ffn_hidden_size"] = f.int_("intermediate_size")
        kw["add_qkv_bias"] = mt == "qwen2" or bool(f.raw("attention_bias", False))
        kw["qk_layernorm"] = mt == "qwen3"
    elif mt == "mixtral":
        w = f.int_("intermediate_size")
        kw.update(
            num_experts=f.int_("num_local_experts"),
            moe_router_topk=f.int_("num_experts_per_tok"),
            moe_ffn_hidden_size=w,
            ffn_hidden_size=w,
        )
    elif mt in ("qwen2_moe", "qwen3_moe"):
        E = f.int_("num_experts")
        step = f.int_("decoder_sparse_step", 1)
        mlp_only_raw = f.list_("mlp_only_layers", [])
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in mlp_only_raw):
            raise f.err("mlp_only_layers", "must be a list of layer indices")
        outside = [x for x in mlp_only_raw if not 0 <= x < L]
        if outside:
            raise f.err("mlp_only_layers", f"layer index {outside[0]} is outside 0..{L - 1} (num_hidden_layers {L})")
        mlp_only = set(mlp_only_raw)
        moe = [(i not in mlp_only) and (i + 1) % step == 0 for i in range(L)]
        kw.update(
            num_experts=E,
            moe_router_topk=f.int_("num_experts_per_tok"),
            moe_ffn_hidden_size=f.int_("moe_intermediate_size"),
            ffn_hidden_size=f.int_("intermediate_size"),
            moe_layer_freq=_pattern(L, moe),
        )
        if mt == "qwen2_moe":
            kw["add_qkv_bias"] = True
            sh = f.int_("shared_expert_intermediate_size", 0, minimum=0)
            kw["moe_shared_expert_intermediate_size"] = sh
            kw["moe_shared_expert_gate"] = sh > 0
        else:
            kw["qk_layernorm"] = True
    elif mt in ("deepseek_v2", "deepseek_v3"):
        E = f.int_("n_routed_experts")
        first_dense = f.int_("first_k_dense_replace", 0, minimum=0)
        freq = f.int_("moe_layer_freq", 1)
        moe = [i >= first_dense and i % freq == 0 for i in range(L)]
        w = f.int_("moe_intermediate_size")
        kw.update(
            num_experts=E,
            moe_router_topk=f.int_("num_experts_per_tok"),
            moe_ffn_hidden_size=w,
            ffn_hidden_size=f.int_("intermediate_size"),
            moe_shared_expert_intermediate_size=f.int_("n_shared_experts", 0, minimum=0) * w,
            moe_layer_freq=_pattern(L, moe),
            multi_latent_attention=True,
            q_lora_rank=f.int_("q_lora_rank", None),
            kv_lora_rank=f.int_("kv_lora_rank"),
            qk_head_dim=f.int_("qk_nope_head_dim"),
            qk_pos_emb_head_dim=f.int_("qk_rope_head_dim"),
            v_head_dim=f.int_("v_head_dim"),
            mtp_num_layers=f.int_("num_nextn_predict_layers", 0, minimum=0),
            moe_router_bias=f.str_("topk_method", "") == "noaux_tc",
        )
    elif mt == "olmoe":
        w = f.int_("intermediate_size")
        kw.update(
            num_experts=f.int_("num_experts"),
            moe_router_topk=f.int_("num_experts_per_tok"),
            moe_ffn_hidden_size=w,
            ffn_hidden_size=w,
            qk_layernorm=True,
        )
    elif mt == "gpt_oss":
        w = f.int_("intermediate_size")
        kw.update(
            num_experts=f.int_("num_local_experts"),
            moe_router_topk=f.int_("num_experts_per_tok"),
            moe_ffn_hidden_size=w,
            ffn_hidden_size=w,
            add_bias_linear=True,
            attention_sinks=True,
            moe_router_bias=True,
        )
        types = f.raw("layer_types", None)
        sw = f.int_("sliding_window", None)
        if sw and isinstance(types, list) and types:
            full = [i for i, t in enumerate(types) if t == "full_attention"]
            # Megatron's skip frequency N makes every N-th layer (1-based) full attention
            if full and all((i + 1) % (full[0] + 1) == 0 for i in full) and len(full) == len(types) // (full[0] + 1):
                kw.update(window_size=sw, window_attn_skip_freq=full[0] + 1)
            elif not full:
                kw.update(window_size=sw)
    seq = f.int_("max_position_embeddings", 4096)
    kw["defaults"] = TrainingDefaults(seq_length=min(seq, 4096))
    m = ModelSpec(**kw)
    validate_model(m, source)
    return m


def load_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    doc = load_document(path)
    if not isinstance(doc, dict) or "model_type" not in doc:
        raise SpecError("not a Hugging Face config.json (no model_type)", source=str(path))
    return model_from_hf_config(doc, str(path), name)
