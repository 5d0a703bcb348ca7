"""DeepSeek-V3-style families: routed + shared experts after ``first_k_dense_replace`` dense layers,
sigmoid routing with a per-expert bias (``noaux_tc``), group-limited routing, MTP.

``deepseek_v2``/``deepseek_v3``/``kimi_k2`` use MLA; ``glm4_moe`` (GLM-4.5) and ``dots1`` (dots.llm1) the
same MoE layout with GQA attention (GLM-4.5: partial rotary, QKV bias, optional QK-norm; dots.llm1:
QK-norm).
"""

from __future__ import annotations

from hapmoe_milp.specs.hf.common import Hf, Kw, base, first_dense_pattern, mtp_layers, routing_groups


def _moe(h: Hf, kw: Kw) -> None:
    f = h.f
    w = f.int_("moe_intermediate_size")
    first = f.int_("first_k_dense_replace", 0, minimum=0)
    kw.update(
        num_experts=f.int_("n_routed_experts"),
        moe_router_topk=f.int_("num_experts_per_tok"),
        moe_ffn_hidden_size=w,
        ffn_hidden_size=f.int_("intermediate_size"),
        moe_shared_expert_intermediate_size=f.int_("n_shared_experts", 0, minimum=0) * w,
        moe_layer_freq=first_dense_pattern(kw["num_layers"], first, f.int_("moe_layer_freq", 1)),
    )
    routing_groups(h, kw)


def deepseek(h: Hf) -> Kw:
    """deepseek_v2, deepseek_v3 and kimi_k2 (Kimi-K2 is the DeepSeek-V3 architecture)."""
    f = h.f
    if f.has("index_topk"):
        raise h.unsupported("index_topk", "DeepSeek sparse attention (DSA indexer)")
    kw = base(h, head_dim=None)
    _moe(h, kw)
    kw.update(
        multi_latent_attention=True,
        q_lora_rank=f.int_("q_lora_rank", None),
        kv_lora_rank=f.int_("kv_lora_rank"),
        qk_head_dim=f.int_("qk_nope_head_dim"),
        qk_pos_emb_head_dim=f.int_("qk_rope_head_dim"),
        v_head_dim=f.int_("v_head_dim"),
        mtp_num_layers=mtp_layers(h, "num_nextn_predict_layers"),
        moe_router_bias=f.str_("topk_method", "") == "noaux_tc",
    )
    return kw


def glm4_moe(h: Hf) -> Kw:
    """GLM-4.5 / GLM-4.5-Air: every MoE layer has the ``noaux_tc`` router bias (Glm4MoeTopkRouter)."""
    f = h.f
    kw = base(h)
    _moe(h, kw)
    kw.update(
        add_qkv_bias=bool(f.raw("attention_bias", False)),
        qk_layernorm=h.flag("use_qk_norm"),
        rotary_percent=float(f.float_("partial_rotary_factor", 1.0)),
        mtp_num_layers=mtp_layers(h, "num_nextn_predict_layers"),
        moe_router_bias=True,
    )
    return kw


def dots1(h: Hf) -> Kw:
    """dots.llm1: DeepSeek-V3's MoE with plain multi-head attention and QK-norm."""
    f = h.f
    f.raw("scoring_func", None)  # read, not needed: the router's bias is there whatever it says
    kw = base(h)
    _moe(h, kw)
    kw.update(
        add_qkv_bias=bool(f.raw("attention_bias", False)),
        qk_layernorm=True,
        moe_router_bias=True,  # Dots1TopkRouter always has the e_score_correction_bias
    )
    return kw
