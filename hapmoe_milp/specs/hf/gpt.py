"""GPT-style families: dense Llama/Qwen, and MoE models whose every layer is attention + (MoE) MLP.

Each function maps one ``model_type``; sources for the field meanings are the families' transformers
configuration classes (``configuration_<family>.py``).
"""

from __future__ import annotations

from hapmoe_milp.specs.hf.common import Hf, Kw, base, periodic_freq


def dense(h: Hf) -> Kw:
    """llama, qwen2, qwen3: dense decoders."""
    kw = base(h)
    kw["ffn_hidden_size"] = h.f.int_("intermediate_size")
    kw["add_qkv_bias"] = h.model_type == "qwen2" or bool(h.f.raw("attention_bias", False))
    kw["qk_layernorm"] = h.model_type == "qwen3"
    return kw


def _experts(h: Hf, experts: str, topk: str, width: str) -> Kw:
    w = h.f.int_(width)
    return {
        "num_experts": h.f.int_(experts),
        "moe_router_topk": h.f.int_(topk),
        "moe_ffn_hidden_size": w,
        "ffn_hidden_size": w,
    }


def mixtral(h: Hf) -> Kw:
    return base(h) | _experts(h, "num_local_experts", "num_experts_per_tok", "intermediate_size")


def olmoe(h: Hf) -> Kw:
    return base(h) | _experts(h, "num_experts", "num_experts_per_tok", "intermediate_size") | {"qk_layernorm": True}


def granitemoe(h: Hf) -> Kw:
    """IBM Granite 3.x MoE (``granitemoe``; ``granitemoeshared`` adds a shared expert). Its embedding,
    attention, residual and logit multipliers scale activations, not weights."""
    kw = base(h, tied_default=True) | _experts(h, "num_local_experts", "num_experts_per_tok", "intermediate_size")
    kw["add_qkv_bias"] = bool(h.f.raw("attention_bias", False))
    if h.model_type == "granitemoeshared":
        kw["moe_shared_expert_intermediate_size"] = h.f.int_("shared_intermediate_size", 0, minimum=0)
    return kw


def gpt_oss(h: Hf) -> Kw:
    kw = base(h) | _experts(h, "num_local_experts", "num_experts_per_tok", "intermediate_size")
    kw.update(add_bias_linear=True, attention_sinks=True, moe_router_bias=True)
    types = h.f.raw("layer_types", None)
    sw = h.f.int_("sliding_window", None)
    if sw and isinstance(types, list) and types:
        freq = periodic_freq([t == "full_attention" for t in types])
        if freq:
            kw.update(window_size=sw, window_attn_skip_freq=freq)
        elif "full_attention" not in types:
            kw.update(window_size=sw)
    return kw


def dbrx(h: Hf) -> Kw:
    """Databricks DBRX: the attention and FFN settings are nested (``attn_config``, ``ffn_config``), the
    norms are LayerNorms, and ``clip_qkv`` clamps activations (no weights)."""
    f = h.f
    att = f.sub("attn_config")
    ffn = f.sub("ffn_config")
    assert att is not None and ffn is not None  # required sub-mappings: Fields.sub raised otherwise
    nh = f.int_("n_heads")
    w = ffn.int_("ffn_hidden_size")
    return {
        "num_layers": f.int_("n_layers"),
        "hidden_size": f.int_("d_model"),
        "num_attention_heads": nh,
        "num_query_groups": att.int_("kv_n_heads", nh),
        "vocab_size": f.int_("vocab_size"),
        "untie_embeddings_and_output_weights": not f.bool_("tie_word_embeddings", False),
        "num_experts": ffn.int_("moe_num_experts"),
        "moe_router_topk": ffn.int_("moe_top_k"),
        "moe_ffn_hidden_size": w,
        "ffn_hidden_size": w,
        "normalization": "LayerNorm",
    }


def minimax_m2(h: Hf) -> Kw:
    """MiniMax-M2: full attention on every layer (``attn_type_list`` all 1), QK-norm, partial rotary
    (``rotary_dim`` of ``head_dim``), sigmoid routing with a per-expert bias, and MTP modules."""
    f = h.f
    kw = base(h) | _experts(h, "num_local_experts", "num_experts_per_tok", "intermediate_size")
    types = f.list_("attn_type_list", [])
    if any(t != 1 for t in types):
        raise h.unsupported("attn_type_list", "lightning (linear) attention layers (attn_type_list entries 0)")
    if f.int_("shared_intermediate_size", 0, minimum=0):
        kw["moe_shared_expert_intermediate_size"] = f.int_("shared_intermediate_size", 0, minimum=0)
    hd = kw.get("kv_channels") or kw["hidden_size"] // kw["num_attention_heads"]
    rot = f.int_("rotary_dim", hd)
    kw["rotary_percent"] = min(1.0, rot / hd)
    kw["qk_layernorm"] = h.flag("use_qk_norm")
    kw["moe_router_bias"] = h.flag("use_routing_bias")
    if h.flag("use_mtp"):
        kw["mtp_num_layers"] = f.int_("num_mtp_modules", 1) * f.int_("mtp_transformer_layers", 1)
    return kw


def hunyuan(h: Hf) -> Kw:
    """Tencent Hunyuan-A13B (``hunyuan``; transformers calls it ``hunyuan_v1_moe``): per-layer lists for the
    expert settings, a shared MLP of ``intermediate_size * num_shared_expert`` beside the experts
    (``use_mixed_mlp_moe``), QK-norm. Cross-layer KV sharing (``use_cla``) is not modelled."""
    f = h.f
    if h.flag("use_cla"):
        raise h.unsupported("use_cla", "cross-layer attention (KV shared between layers)")
    kw = base(h, head_dim="head_dim" if f.has("head_dim") else "attention_head_dim", tied_default=True)
    n = kw["num_layers"]
    w = h.int_list_or_int("moe_intermediate_size", n)
    kw.update(
        num_experts=h.int_list_or_int("num_experts", n),
        moe_router_topk=h.int_list_or_int("moe_topk", n),
        moe_ffn_hidden_size=w,
        ffn_hidden_size=f.int_("intermediate_size"),
        qk_layernorm=h.flag("use_qk_norm"),
        add_qkv_bias=bool(f.raw("attention_bias", False)),
    )
    skipped = f.int_("moe_layer_num_skipped", 0, minimum=0)
    if skipped:
        kw["moe_layer_freq"] = tuple(int(i >= skipped) for i in range(n))
    if h.flag("use_mixed_mlp_moe"):
        shared = h.int_list_or_int("num_shared_expert", n, 1)
        kw["moe_shared_expert_intermediate_size"] = shared * kw["ffn_hidden_size"]
    return kw


def bailing_moe(h: Hf) -> Kw:
    """inclusionAI Ling (``bailing_moe``: Ling-lite, Ling-plus): shared experts beside the routed ones,
    optional first dense layers, QKV bias switch ``use_qkv_bias``."""
    f = h.f
    kw = base(h)
    n = kw["num_layers"]
    first = f.int_("first_k_dense_replace", 0, minimum=0)
    w = f.int_("moe_intermediate_size")
    kw.update(
        num_experts=f.int_("num_experts"),
        moe_router_topk=f.int_("num_experts_per_tok"),
        moe_ffn_hidden_size=w,
        ffn_hidden_size=f.int_("intermediate_size"),
        moe_shared_expert_intermediate_size=f.int_("num_shared_experts", 0, minimum=0) * w,
        add_qkv_bias=h.flag("use_qkv_bias"),
        add_bias_linear=h.flag("use_bias"),
    )
    if first:
        kw["moe_layer_freq"] = tuple(int(i >= first) for i in range(n))
    return kw
