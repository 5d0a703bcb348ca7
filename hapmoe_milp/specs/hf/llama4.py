"""Llama 4 (Scout, Maverick): interleaved MoE and dense layers, a shared expert, iRoPE.

The published config is a multimodal ``Llama4ForConditionalGeneration`` whose ``text_config`` holds the
language model; only that is imported (the vision encoder is not trained by a text pipeline plan).
Every ``no_rope`` layer uses full causal attention without RoPE; the others use RoPE with attention
chunked into blocks of ``attention_chunk_size`` tokens (transformers' Llama4TextAttention).
"""

from __future__ import annotations

from hapmoe_milp.specs.hf.common import Hf, Kw, base, pattern, periodic_freq


def _moe_layers(h: Hf, n: int) -> int | tuple[int, ...]:
    f = h.f
    explicit = f.list_("moe_layers", None)
    if explicit is not None:
        if any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < n for x in explicit):
            raise f.err("moe_layers", f"must be layer indices in 0..{n - 1}")
        return pattern([i in set(explicit) for i in range(n)])
    step = f.int_("interleave_moe_layer_step", 1)
    # transformers: moe_layers = range(step - 1, n, step)
    return pattern([(i + 1) % step == 0 for i in range(n)])


def _no_rope_freq(h: Hf, n: int) -> int | None:
    """Megatron's ``no_rope_freq``: every N-th layer has no RoPE. transformers' ``no_rope_layers`` holds 1
    for a RoPE layer and 0 for a NoPE one; by default every ``no_rope_layer_interval``-th (4) is NoPE."""
    f = h.f
    flags = f.list_("no_rope_layers", None)
    if not flags:
        interval = f.int_("no_rope_layer_interval", 4)
        return interval
    if len(flags) != n or any(x not in (0, 1) for x in flags):
        raise f.err("no_rope_layers", f"must be {n} entries of 0 or 1")
    nope = [x == 0 for x in flags]
    freq = periodic_freq(nope)
    if freq is None and any(nope):
        raise h.unsupported("no_rope_layers", "a NoPE layer pattern that is not every N-th layer")
    return freq


def llama4(h: Hf) -> Kw:
    f = h.f
    kw = base(h)
    n = kw["num_layers"]
    w = f.int_("intermediate_size")
    kw.update(
        num_experts=f.int_("num_local_experts"),
        moe_router_topk=f.int_("num_experts_per_tok"),
        moe_ffn_hidden_size=w,
        moe_shared_expert_intermediate_size=w,
        ffn_hidden_size=f.int_("intermediate_size_mlp"),
        moe_layer_freq=_moe_layers(h, n),
        qk_l2_norm=h.flag("use_qk_norm"),
        no_rope_freq=_no_rope_freq(h, n),
        attention_chunk_size=f.int_("attention_chunk_size", None),
        add_qkv_bias=bool(f.raw("attention_bias", False)),
    )
    return kw
