"""Qwen MoE families: qwen2_moe, qwen3_moe, and qwen3_next (gated DeltaNet + gated attention).

Qwen places MoE layers with ``decoder_sparse_step`` and ``mlp_only_layers``; Qwen3-Next's layers are
gated-DeltaNet linear attention except every ``full_attention_interval``-th (or as ``layer_types`` says),
whose softmax attention has an output gate, QK-norm and partial rotary.
"""

from __future__ import annotations

from hapmoe_milp.specs.hf.common import Hf, Kw, base, mtp_layers, pattern


def _moe_layers(h: Hf, n_layers: int) -> int | tuple[int, ...]:
    f = h.f
    step = f.int_("decoder_sparse_step", 1)
    mlp_only_raw = f.list_("mlp_only_layers", [])
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in mlp_only_raw):
        raise f.err("mlp_only_layers", "must be a list of layer indices")
    outside = [x for x in mlp_only_raw if not 0 <= x < n_layers]
    if outside:
        raise f.err(
            "mlp_only_layers", f"layer index {outside[0]} is outside 0..{n_layers - 1} (num_hidden_layers {n_layers})"
        )
    mlp_only = set(mlp_only_raw)
    return pattern([(i not in mlp_only) and (i + 1) % step == 0 for i in range(n_layers)])


def qwen_moe(h: Hf) -> Kw:
    f = h.f
    kw = base(h)
    kw.update(
        num_experts=f.int_("num_experts"),
        moe_router_topk=f.int_("num_experts_per_tok"),
        moe_ffn_hidden_size=f.int_("moe_intermediate_size"),
        ffn_hidden_size=f.int_("intermediate_size"),
        moe_layer_freq=_moe_layers(h, kw["num_layers"]),
    )
    if h.model_type in ("qwen2_moe", "qwen3_next"):
        sh = f.int_("shared_expert_intermediate_size", 0, minimum=0)
        kw["moe_shared_expert_intermediate_size"] = sh
        kw["moe_shared_expert_gate"] = sh > 0
    if h.model_type == "qwen2_moe":
        kw["add_qkv_bias"] = True
    else:
        kw["qk_layernorm"] = True
    return kw


def qwen3_next(h: Hf) -> Kw:
    f = h.f
    kw = qwen_moe(h)
    n = kw["num_layers"]
    types = f.list_("layer_types", None)
    if types is not None:
        if len(types) != n or any(t not in ("linear_attention", "full_attention") for t in types):
            raise f.err("layer_types", f"must be {n} entries of linear_attention / full_attention")
        freq: int | tuple[int, ...] = tuple(int(t == "linear_attention") for t in types)
    else:
        freq = f.int_("full_attention_interval", 4)
    kw.update(
        experimental_attention_variant="gated_delta_net",
        linear_attention_freq=freq,
        linear_conv_kernel_dim=f.int_("linear_conv_kernel_dim", 4),
        linear_key_head_dim=f.int_("linear_key_head_dim"),
        linear_value_head_dim=f.int_("linear_value_head_dim"),
        linear_num_key_heads=f.int_("linear_num_key_heads"),
        linear_num_value_heads=f.int_("linear_num_value_heads"),
        attention_output_gate=True,
        rotary_percent=float(f.float_("partial_rotary_factor", 1.0)),
        mtp_num_layers=mtp_layers(h, "num_nextn_predict_layers", "mtp_num_hidden_layers"),
    )
    return kw
