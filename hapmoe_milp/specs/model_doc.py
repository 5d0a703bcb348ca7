"""Model specs to and from documents: cross-field validation, YAML/JSON catalog entries, plan embedding.

The spec's types and arithmetic live in :mod:`hapmoe_milp.specs.model`; this module reads and writes
them, and checks every value once (whatever route it came by: catalog YAML, a plan file, a Hugging Face
config through :mod:`hapmoe_milp.specs.hf`, the Python API).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from hapmoe_milp.config import DISPATCHERS, Settings
from hapmoe_milp.errors import HapmoeError, SpecError
from hapmoe_milp.limits import (
    MAX_EXPERTS,
    MAX_EXPR_NESTING,
    MAX_FREQ_EXPR_LEN,
    MAX_HEADS,
    MAX_HIDDEN_SIZE,
    MAX_LAYERS,
    MAX_VOCAB,
    RANGE_PARAMS_B,
)
from hapmoe_milp.specs._fields import Fields, check_name, nesting, show, spec_hash
from hapmoe_milp.specs.model import HYBRID_SYMBOLS, ModelSpec, OfficialCounts, TrainingDefaults

__all__ = ["model_from_dict", "model_hash", "model_to_dict", "validate_model"]

_ARCH_INT = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "vocab_size",
)
_ARCH_OPT_INT = (
    "num_query_groups",
    "kv_channels",
    "ffn_hidden_size",
    "num_experts",
    "moe_ffn_hidden_size",
    "q_lora_rank",
)


def validate_model(m: ModelSpec, source: str) -> None:
    """Cross-field rules; raise SpecError naming the field."""

    def bad(fld: str, msg: str) -> SpecError:
        return SpecError(msg, source=source, field=fld)

    check_name(m.name, source, "name")
    for fld, cap in (
        ("num_layers", MAX_LAYERS),
        ("hidden_size", MAX_HIDDEN_SIZE),
        ("num_attention_heads", MAX_HEADS),
        ("vocab_size", MAX_VOCAB),
        ("num_query_groups", MAX_HEADS),
        ("kv_channels", MAX_HIDDEN_SIZE),
        ("ffn_hidden_size", MAX_HIDDEN_SIZE),
        ("num_experts", MAX_EXPERTS),
        ("moe_ffn_hidden_size", MAX_HIDDEN_SIZE),
        ("moe_shared_expert_intermediate_size", MAX_HIDDEN_SIZE),
        ("q_lora_rank", MAX_HIDDEN_SIZE),
        ("kv_lora_rank", MAX_HIDDEN_SIZE),
        ("qk_head_dim", MAX_HIDDEN_SIZE),
        ("qk_pos_emb_head_dim", MAX_HIDDEN_SIZE),
        ("v_head_dim", MAX_HIDDEN_SIZE),
        ("mtp_num_layers", MAX_LAYERS),
        ("moe_router_topk", MAX_EXPERTS),
        ("make_vocab_size_divisible_by", MAX_VOCAB),
    ):
        v = getattr(m, fld)
        if v is None:
            continue
        low = 0 if fld in ("moe_shared_expert_intermediate_size", "mtp_num_layers") else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise bad(fld, f"must be {'a positive' if low else 'a non-negative'} integer, got {v!r}")
        if v > cap:
            raise bad(fld, f"{v:,} exceeds the supported maximum of {cap:,}")
    if m.num_layers + m.mtp_num_layers > MAX_LAYERS:
        raise bad("mtp_num_layers", f"num_layers + mtp_num_layers exceeds the supported maximum of {MAX_LAYERS:,}")
    if not m.multi_latent_attention and not m.kv_channels and m.hidden_size % m.num_attention_heads:
        raise bad(
            "hidden_size",
            f"{m.hidden_size} is not divisible by num_attention_heads {m.num_attention_heads} "
            "(Megatron's kv_channels = hidden_size / heads); set kv_channels",
        )
    if m.num_attention_heads and m.groups > m.num_attention_heads:
        raise bad("num_query_groups", f"{m.groups} exceeds num_attention_heads {m.num_attention_heads}")
    if m.num_attention_heads % m.groups:
        raise bad("num_query_groups", f"num_attention_heads {m.num_attention_heads} is not a multiple of {m.groups}")
    if m.is_moe:
        e = m.num_experts or 0
        if not 1 <= m.moe_router_topk <= e:
            raise bad("moe_router_topk", f"must be between 1 and num_experts ({e}), got {m.moe_router_topk}")
        if isinstance(m.moe_layer_freq, tuple):
            if len(m.moe_layer_freq) != m.num_layers:
                raise bad("moe_layer_freq", f"list has {len(m.moe_layer_freq)} entries, num_layers is {m.num_layers}")
            if any(v not in (0, 1) for v in m.moe_layer_freq):
                raise bad("moe_layer_freq", "list entries must be 0 or 1")
        elif m.moe_layer_freq < 1:
            raise bad("moe_layer_freq", f"must be a positive integer, got {m.moe_layer_freq}")
        if m.num_moe_layers == 0:
            raise bad("moe_layer_freq", "num_experts is set but no layer is MoE")
    d = m.defaults
    try:  # the defaults become run settings: the settings layer checks them, under their names here
        Settings(
            seq_length=d.seq_length,
            global_batch_size=d.global_batch_size,
            micro_batch_size=d.micro_batch_size,
            dispatcher=d.moe_token_dispatcher_type,
        )
    except HapmoeError as exc:
        names = {"dispatcher": "moe_token_dispatcher_type"}
        raise exc.at(source=source, field=f"defaults.{names.get(exc.field or '', exc.field)}") from None
    if m.normalization not in ("RMSNorm", "LayerNorm"):
        raise bad("normalization", f"must be RMSNorm or LayerNorm, got {m.normalization!r}")
    _validate_routing_groups(m, bad)
    _validate_mixers(m, bad)


def _positive_ints(m: ModelSpec, bad: Any, names: tuple[str, ...]) -> None:
    for fld in names:
        v = getattr(m, fld)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_HIDDEN_SIZE):
            raise bad(fld, f"must be an integer between 1 and {MAX_HIDDEN_SIZE:,}, got {show(v)}")


def _validate_routing_groups(m: ModelSpec, bad: Any) -> None:
    """Megatron's group-limited routing rules (TransformerConfig.__post_init__, megatron-core 0.16.1): the
    group top-k needs the number of groups, experts split evenly into groups, group_topk <= num_groups; and
    the router takes the top ``topk // group_topk`` scores of every group, so that must be at least one
    and the chosen groups must hold ``topk`` experts."""
    g, gk = m.moe_router_num_groups, m.moe_router_group_topk
    _positive_ints(m, bad, ("moe_router_num_groups", "moe_router_group_topk"))
    if g is None and gk is None:
        return
    if not m.is_moe:
        raise bad("moe_router_num_groups", "group-limited routing needs num_experts")
    if g is None or gk is None:
        raise bad("moe_router_group_topk", "set both moe_router_num_groups and moe_router_group_topk, or neither")
    e = m.num_experts or 0
    if e % g:
        raise bad("moe_router_num_groups", f"num_experts {e} is not divisible by {g} groups")
    if gk > g:
        raise bad("moe_router_group_topk", f"{gk} exceeds moe_router_num_groups {g}")
    if m.moe_router_topk < gk or gk * (e // g) < m.moe_router_topk:
        raise bad(
            "moe_router_group_topk",
            f"{gk} groups of {e // g} experts cannot supply moe_router_topk {m.moe_router_topk} "
            "(needs group_topk <= topk <= group_topk * experts per group)",
        )


def _validate_mixers(m: ModelSpec, bad: Any) -> None:
    """Hybrid (Mamba) and linear-attention layers, partial rotary and chunked attention."""
    if not 0 < m.rotary_percent <= 1:
        raise bad("rotary_percent", f"must be in (0, 1], got {m.rotary_percent!r}")
    _positive_ints(
        m,
        bad,
        (
            "no_rope_freq",
            "attention_chunk_size",
            "mamba_state_dim",
            "mamba_head_dim",
            "mamba_num_groups",
            "mamba_num_heads",
            "mamba_conv_kernel",
            "mamba_expand",
            "mamba_dt_rank",
            "linear_conv_kernel_dim",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
        ),
    )
    if m.mamba_version not in (1, 2):
        raise bad("mamba_version", f"must be 1 or 2, got {show(m.mamba_version)}")
    pat = m.hybrid_override_pattern
    if pat is not None:
        if not isinstance(pat, str) or any(ch not in HYBRID_SYMBOLS for ch in pat):
            raise bad(
                "hybrid_override_pattern", f"{show(pat)} may hold only M (mamba), * (attention), - (MLP), E (MoE)"
            )
        if len(pat) != m.num_layers:
            raise bad("hybrid_override_pattern", f"has {len(pat)} layers, num_layers is {m.num_layers}")
        if "E" in pat and not m.is_moe:
            raise bad("hybrid_override_pattern", "has MoE layers (E) but num_experts is not set")
        if m.is_moe and "E" not in pat:
            raise bad("hybrid_override_pattern", "num_experts is set but no layer is MoE (E)")
        if m.mtp_num_layers:
            raise bad("mtp_num_layers", "multi-token prediction on a hybrid (Mamba) model is not supported")
        if m.has_linear_attention:
            raise bad("experimental_attention_variant", "a hybrid (Mamba) model has no linear-attention layers")
        shape = m.mamba_shape
        if m.mamba_version == 2 and getattr(shape, "heads", 0) % m.mamba_num_groups:
            raise bad(
                "mamba_num_groups", f"mamba heads {getattr(shape, 'heads', 0)} not divisible by {m.mamba_num_groups}"
            )
    v = m.experimental_attention_variant
    if v is not None and v != "gated_delta_net":
        raise bad("experimental_attention_variant", f"only gated_delta_net is supported, got {show(v)}")
    if m.has_linear_attention:
        f = m.linear_attention_freq
        if f is None:
            raise bad("linear_attention_freq", "must be set for gated_delta_net (Megatron requires it)")
        if isinstance(f, tuple):
            if len(f) != m.num_layers or any(x not in (0, 1) for x in f):
                raise bad("linear_attention_freq", f"must be num_layers ({m.num_layers}) entries of 0 or 1")
        elif isinstance(f, bool) or not isinstance(f, int) or f < 1:
            raise bad("linear_attention_freq", f"must be a positive integer or a 0/1 list, got {show(f)}")
        if m.linear_num_value_heads % m.linear_num_key_heads:
            raise bad(
                "linear_num_value_heads",
                f"{m.linear_num_value_heads} is not a multiple of linear_num_key_heads {m.linear_num_key_heads}",
            )


def _parse_layer_freq(f: Fields, key: str = "moe_layer_freq", default: Any = 1) -> Any:
    """An int N or a 0/1 list, in any of Megatron's forms (``moe_layer_freq``, ``linear_attention_freq``)."""
    v = f.raw(key, default)
    if v is None:
        return None
    if isinstance(v, bool):
        raise f.err(key, f"must be an integer or a 0/1 list, got {v!r}")
    if isinstance(v, int):
        if v < 1:
            raise f.err(key, f"must be a positive integer, got {v}")
        return v
    if isinstance(v, str):
        return _parse_freq_expr(v, f, key)
    if isinstance(v, list):
        out = []
        for i, x in enumerate(v):
            if isinstance(x, bool) or x not in (0, 1):
                raise f.err(f"{key}[{i}]", f"must be 0 or 1, got {x!r}")
            out.append(int(x))
        return tuple(out)
    raise f.err(key, f"must be an integer or a 0/1 list, got {type(v).__name__}")


def _parse_freq_expr(expr: str, f: Fields, key: str = "moe_layer_freq") -> int | tuple[int, ...]:
    """Megatron's ``--moe-layer-freq`` string forms without eval: ``"3"``, ``"([0]*3+[1]*58)"``,
    ``"([1]*3+[0]*1)*3"``. Grammar: expr = term ('+' term)*; term = atom ('*' int)?;
    atom = '[' 0/1 (',' 0/1)* ']' | '(' expr ')'."""
    text = expr.replace(" ", "")
    if text.isdigit():
        v = int(text[:7]) if len(text) <= 7 else 0
        if v < 1:
            raise f.err(key, f"must be a positive integer, got {show(expr)}")
        return v
    pos = 0

    def fail(msg: str) -> SpecError:
        return f.err(key, f"cannot parse list expression {show(expr)}: {msg}")

    if nesting(text) > MAX_EXPR_NESTING:  # before the recursive parser meets Python's stack limit
        raise fail(f"parentheses nest deeper than {MAX_EXPR_NESTING} levels")

    def parse_int() -> int:
        nonlocal pos
        start = pos
        while pos < len(text) and text[pos].isdigit():
            pos += 1
        digits = text[start:pos]
        if not digits or len(digits) > 6:
            raise fail("expected a repeat count of at most 6 digits")
        return int(digits)

    def atom() -> list[int]:
        nonlocal pos
        if pos < len(text) and text[pos] == "[":
            pos += 1
            vals: list[int] = []
            while True:
                if pos < len(text) and text[pos] in "01":
                    vals.append(int(text[pos]))
                    pos += 1
                else:
                    raise fail("list entries must be 0 or 1")
                if pos < len(text) and text[pos] == ",":
                    pos += 1
                    continue
                if pos < len(text) and text[pos] == "]":
                    pos += 1
                    return vals
                raise fail("expected ',' or ']'")
        if pos < len(text) and text[pos] == "(":
            pos += 1
            vals = expression()
            if pos >= len(text) or text[pos] != ")":
                raise fail("missing ')'")
            pos += 1
            return vals
        raise fail("expected '[' or '('")

    def term() -> list[int]:
        nonlocal pos
        vals = atom()
        if pos < len(text) and text[pos] == "*":
            pos += 1
            n = parse_int()
            if len(vals) * n > MAX_FREQ_EXPR_LEN:
                raise fail("expands to too many layers")
            vals = vals * n
        return vals

    def expression() -> list[int]:
        nonlocal pos
        vals = term()
        while pos < len(text) and text[pos] == "+":
            pos += 1
            vals.extend(term())  # in place: a long sum of terms must not copy the list each time
            if len(vals) > MAX_FREQ_EXPR_LEN:
                raise fail("expands to too many layers")
        return vals

    out = expression()
    if pos != len(text):
        raise fail(f"unexpected {text[pos]!r}")
    return tuple(out)


def model_from_dict(doc: dict[str, Any], source: str) -> ModelSpec:
    f = Fields(doc, source)
    kw: dict[str, Any] = {"name": f.str_("name")}
    check_name(kw["name"], source, "name")
    for k in _ARCH_INT:
        kw[k] = f.int_(k)
    if kw["num_layers"] > MAX_LAYERS:
        raise f.err("num_layers", f"{kw['num_layers']:,} exceeds the supported maximum of {MAX_LAYERS:,}")
    for k in _ARCH_OPT_INT:
        v = f.int_(k, None, minimum=0 if k == "num_experts" else 1)
        if v is not None:
            kw[k] = v
    if kw.get("num_experts") == 0:
        kw["num_experts"] = None
    kw["moe_router_topk"] = f.int_("moe_router_topk", 2)
    kw["moe_shared_expert_intermediate_size"] = f.int_("moe_shared_expert_intermediate_size", 0, minimum=0)
    kw["moe_layer_freq"] = _parse_layer_freq(f)
    kw["mtp_num_layers"] = f.int_("mtp_num_layers", 0, minimum=0)
    kw["kv_lora_rank"] = f.int_("kv_lora_rank", 512)
    kw["qk_head_dim"] = f.int_("qk_head_dim", 128)
    kw["qk_pos_emb_head_dim"] = f.int_("qk_pos_emb_head_dim", 64)
    kw["v_head_dim"] = f.int_("v_head_dim", 128)
    kw["make_vocab_size_divisible_by"] = f.int_("make_vocab_size_divisible_by", 128)
    kw["window_size"] = f.int_("window_size", None)
    kw["window_attn_skip_freq"] = f.int_("window_attn_skip_freq", 0, minimum=0)
    _read_variants(f, kw)
    for b, d in (
        ("moe_shared_expert_gate", False),
        ("moe_router_bias", False),
        ("multi_latent_attention", False),
        ("untie_embeddings_and_output_weights", True),
        ("swiglu", True),
        ("add_qkv_bias", False),
        ("add_bias_linear", False),
        ("qk_layernorm", False),
        ("attention_sinks", False),
    ):
        kw[b] = f.bool_(b, d)
    kw["normalization"] = f.choice("normalization", ("RMSNorm", "LayerNorm"), "RMSNorm")
    kw["description"] = f.str_("description", "")
    src = f.raw("source", [])
    if isinstance(src, str):
        src = [src]
    if not isinstance(src, list) or not all(isinstance(s, str) for s in src):
        raise f.err("source", "must be a URL or a list of URLs")
    kw["sources"] = tuple(src)
    off = f.sub("official", None)
    if off is not None:
        kw["official"] = OfficialCounts(
            total_b=off.float_("total_b", within=RANGE_PARAMS_B),
            active_b=off.float_("active_b", within=RANGE_PARAMS_B),
            active_convention=off.choice(
                "active_convention", ("all_embeddings", "excl_input_embedding", "non_embedding"), "all_embeddings"
            ),
            includes_mtp=off.bool_("includes_mtp", False),
            source=off.str_("source", ""),
        )
        off.reject_unknown()
    dfl = f.sub("defaults", None)
    if dfl is not None:
        kw["defaults"] = TrainingDefaults(
            seq_length=dfl.int_("seq_length", 4096),
            global_batch_size=dfl.int_("global_batch_size", 256),
            micro_batch_size=dfl.int_("micro_batch_size", 1),
            moe_token_dispatcher_type=dfl.choice("moe_token_dispatcher_type", DISPATCHERS, "alltoall"),
        )
        dfl.reject_unknown()
    f.reject_unknown(allowed_extra=("notes",))
    kw["origin"] = source
    m = ModelSpec(**kw)
    validate_model(m, source)
    return m


# Megatron-named fields a catalog entry may leave out (their defaults are ModelSpec's); model_to_dict writes
# them only when they differ from the default, so adding one never changes an older model's hash.
_OPTIONAL_INT = (
    "no_rope_freq",
    "attention_chunk_size",
    "moe_router_num_groups",
    "moe_router_group_topk",
    "mamba_num_heads",
    "mamba_dt_rank",
)
_DEFAULT_INT = (
    "mamba_version",
    "mamba_state_dim",
    "mamba_head_dim",
    "mamba_num_groups",
    "mamba_conv_kernel",
    "mamba_expand",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
)
_DEFAULT_BOOL = ("qk_l2_norm", "attention_output_gate", "squared_relu", "learned_absolute_position_embedding")
_DEFAULT_OTHER = (
    "rotary_percent",
    "hybrid_override_pattern",
    "experimental_attention_variant",
    "linear_attention_freq",
)
_OMIT_AT_DEFAULT = frozenset((*_OPTIONAL_INT, *_DEFAULT_INT, *_DEFAULT_BOOL, *_DEFAULT_OTHER))


def _read_variants(f: Fields, kw: dict[str, Any]) -> None:
    """The optional Megatron fields of newer architectures (hybrid, linear attention, routing groups)."""
    dflt = {x.name: x.default for x in fields(ModelSpec)}
    for k in _OPTIONAL_INT:
        kw[k] = f.int_(k, None)
    for k in _DEFAULT_INT:
        kw[k] = f.int_(k, dflt[k])
    for k in _DEFAULT_BOOL:
        kw[k] = f.bool_(k, False)
    kw["rotary_percent"] = f.float_("rotary_percent", 1.0)
    kw["hybrid_override_pattern"] = f.str_("hybrid_override_pattern", None)
    variant = "experimental_attention_variant"
    kw[variant] = f.choice(variant, ("gated_delta_net",)) if f.has(variant) else f.raw(variant, None)
    kw["linear_attention_freq"] = _parse_layer_freq(f, "linear_attention_freq", None)


# ---------------------------------------------------------------------- writing a spec back (plan files)
_NOT_ARCH = ("name", "description", "sources", "official", "defaults", "origin")


def model_to_dict(m: ModelSpec) -> dict[str, Any]:
    """The model as a document ``model_from_dict`` reads back to an equal spec (plan files embed it)."""
    out: dict[str, Any] = {"name": m.name}
    for f in fields(m):
        if f.name in _NOT_ARCH:
            continue
        v = getattr(m, f.name)
        if v is None or (f.name in _OMIT_AT_DEFAULT and v == f.default):
            continue
        out[f.name] = list(v) if isinstance(v, tuple) else v
    if m.description:
        out["description"] = m.description
    if m.sources:
        out["source"] = list(m.sources)
    if m.official is not None:
        o = m.official
        out["official"] = {
            "total_b": o.total_b,
            "active_b": o.active_b,
            "active_convention": o.active_convention,
            "includes_mtp": o.includes_mtp,
            "source": o.source,
        }
    d = m.defaults
    out["defaults"] = {
        "seq_length": d.seq_length,
        "global_batch_size": d.global_batch_size,
        "micro_batch_size": d.micro_batch_size,
        "moe_token_dispatcher_type": d.moe_token_dispatcher_type,
    }
    return out


def model_hash(m: ModelSpec) -> str:
    """Content hash of what a plan depends on: the name and every architecture field (not the description,
    sources, published counts or training defaults)."""
    doc = model_to_dict(m)
    for k in ("description", "source", "official", "defaults"):
        doc.pop(k, None)
    return spec_hash(doc)
