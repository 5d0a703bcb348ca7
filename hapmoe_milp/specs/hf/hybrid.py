"""Hybrid state-space families, as Megatron's hybrid models lay them out (one sub-layer per layer,
``--hybrid-override-pattern``: M Mamba, * attention, - MLP, E MoE).

``nemotron_h`` (Nemotron-H, Nemotron 3 Nano) already has that pattern; its MLPs are non-gated squared
ReLU and its Mamba layers Mamba-2. ``jamba`` interleaves Mamba-1 and attention mixers, each followed by a
dense or MoE MLP: Jamba layer i becomes two layers here (its mixer, then its MLP).
"""

from __future__ import annotations

from hapmoe_milp.specs.hf.common import Hf, Kw, base, dt_rank, routing_groups
from hapmoe_milp.specs.model import HYBRID_SYMBOLS

_BLOCK_TYPES = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


def _nemotron_pattern(h: Hf, n: int) -> str:
    f = h.f
    pat = f.raw("hybrid_override_pattern", None)
    if pat is None:
        types = f.list_("layers_block_type")
        if any(t not in _BLOCK_TYPES for t in types):
            raise f.err("layers_block_type", f"entries must be one of {', '.join(_BLOCK_TYPES)}")
        pat = "".join(_BLOCK_TYPES[t] for t in types)
    if not isinstance(pat, str) or any(ch not in HYBRID_SYMBOLS for ch in pat):
        raise f.err("hybrid_override_pattern", "may hold only M, *, - and E")
    if len(pat) != n:
        raise f.err("hybrid_override_pattern", f"has {len(pat)} layers, num_hidden_layers is {n}")
    return pat


def nemotron_h(h: Hf) -> Kw:
    f = h.f
    kw = base(h)
    pat = _nemotron_pattern(h, kw["num_layers"])
    act = f.str_("mlp_hidden_act", "relu2")
    if act != "relu2":
        raise h.unsupported("mlp_hidden_act", f"MLP activation {act!r} (Megatron's hybrid models use relu2)")
    kw.update(
        hybrid_override_pattern=pat,
        swiglu=False,
        squared_relu=True,
        ffn_hidden_size=f.int_("intermediate_size"),
        mamba_num_heads=f.int_("mamba_num_heads"),
        mamba_head_dim=f.int_("mamba_head_dim"),
        mamba_state_dim=f.int_("ssm_state_size"),
        mamba_num_groups=f.int_("n_groups"),
        mamba_conv_kernel=f.int_("conv_kernel", 4),
        add_bias_linear=h.flag("use_bias") or h.flag("mlp_bias"),
        add_qkv_bias=bool(f.raw("attention_bias", False)),
    )
    f.raw("time_step_limit", None)  # Python JSON writes its default (0.0, inf) as [0.0, Infinity]: harmless
    if "E" in pat:
        kw.update(
            num_experts=f.int_("n_routed_experts"),
            moe_router_topk=f.int_("num_experts_per_tok"),
            moe_ffn_hidden_size=f.int_("moe_intermediate_size"),
            moe_shared_expert_intermediate_size=f.int_("moe_shared_expert_intermediate_size", 0, minimum=0),
            moe_router_bias=True,  # NemotronH's router keeps DeepSeek's e_score_correction_bias
        )
        routing_groups(h, kw)
    return kw


def jamba(h: Hf) -> Kw:
    f = h.f
    kw = base(h, head_dim=None)
    n = kw["num_layers"]
    ap, ao = f.int_("attn_layer_period"), f.int_("attn_layer_offset", 0, minimum=0)
    ep, eo = f.int_("expert_layer_period"), f.int_("expert_layer_offset", 0, minimum=0)
    pat = "".join(("*" if i % ap == ao else "M") + ("E" if i % ep == eo else "-") for i in range(n))
    if f.bool_("mamba_proj_bias", False):
        raise h.unsupported("mamba_proj_bias", "biases on the Mamba projections")
    w = f.int_("intermediate_size")
    kw.update(
        num_layers=2 * n,
        hybrid_override_pattern=pat,
        mamba_version=1,
        mamba_state_dim=f.int_("mamba_d_state"),
        mamba_conv_kernel=f.int_("mamba_d_conv", 4),
        mamba_expand=f.int_("mamba_expand", 2),
        mamba_dt_rank=dt_rank(h, "mamba_dt_rank", kw["hidden_size"]),
        ffn_hidden_size=w,
        moe_ffn_hidden_size=w,
        num_experts=f.int_("num_experts"),
        moe_router_topk=f.int_("num_experts_per_tok"),
    )
    f.raw("mamba_conv_bias", True)
    return kw
