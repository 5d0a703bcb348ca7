"""What every Hugging Face family mapping shares: the base fields, layer patterns, refusals.

A family's mapping reads its ``config.json`` through :class:`Hf` and returns keyword arguments of
:class:`~hapmoe_milp.specs.model.ModelSpec` (Megatron's names). Errors name the config file, the key and,
for an architecture feature we cannot price, the ``model_type`` and the feature.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hapmoe_milp.errors import SpecError
from hapmoe_milp.limits import MAX_LAYERS
from hapmoe_milp.specs._fields import Fields, show

Kw = dict[str, Any]


@dataclass
class Hf:
    """One config (or its ``text_config``) being read, with its model_type for messages."""

    f: Fields
    model_type: str

    def unsupported(self, key: str, feature: str) -> SpecError:
        """A refusal that names the model type and the feature, at the key that turns it on."""
        return self.f.err(key, f"model_type {self.model_type!r}: {feature} is not supported")

    def int_list_or_int(self, key: str, n: int, default: Any = None) -> int:
        """Some configs (Hunyuan) repeat a per-layer value as a list; we need it to be one value."""
        v = self.f.raw(key, default)
        if isinstance(v, list):
            if len(v) != n or not v or any(isinstance(x, bool) or not isinstance(x, int) for x in v):
                raise self.f.err(key, f"must be an integer or {n} integers, got {show(v)}")
            if len(set(v)) != 1:
                raise self.unsupported(key, f"different values per layer ({show(v)})")
            return int(v[0])
        return int(self.f.int_(key, default, minimum=0))

    def flag(self, key: str, default: bool = False) -> bool:
        return bool(self.f.bool_(key, default))


def base(
    h: Hf,
    *,
    layers: str = "num_hidden_layers",
    hidden: str = "hidden_size",
    heads: str = "num_attention_heads",
    kv_heads: str = "num_key_value_heads",
    head_dim: str | None = "head_dim",
    tied_default: bool = False,
) -> Kw:
    """The fields every decoder shares: depth, width, attention heads, vocabulary, tied embeddings."""
    f = h.f
    nh = f.int_(heads)
    kw: Kw = {
        "num_layers": f.int_(layers, maximum=MAX_LAYERS),
        "hidden_size": f.int_(hidden),
        "num_attention_heads": nh,
        "num_query_groups": f.int_(kv_heads, nh) if kv_heads else nh,
        "vocab_size": f.int_("vocab_size"),
        "untie_embeddings_and_output_weights": not f.bool_("tie_word_embeddings", tied_default),
    }
    if head_dim:
        hd = f.int_(head_dim, None)
        if hd:
            kw["kv_channels"] = hd
    return kw


def first_dense_pattern(n_layers: int, first_dense: int, every: int = 1) -> int | tuple[int, ...]:
    """DeepSeek-style MoE placement: layers before ``first_dense`` are dense, then every ``every``-th."""
    return pattern([i >= first_dense and i % every == 0 for i in range(n_layers)])


def pattern(flags: Sequence[bool]) -> int | tuple[int, ...]:
    """Megatron's ``moe_layer_freq``: 1 when every layer is MoE, else the explicit 0/1 list."""
    pat = tuple(int(x) for x in flags)
    return 1 if all(pat) else pat


def periodic_freq(flags: Sequence[bool]) -> int | None:
    """N when exactly the layers with ``(i + 1) % N == 0`` are flagged (Megatron's int frequencies)."""
    hits = [i for i, x in enumerate(flags) if x]
    if not hits:
        return None
    n = hits[0] + 1
    return n if hits == list(range(n - 1, len(flags), n)) else None


def routing_groups(h: Hf, kw: Kw) -> None:
    """DeepSeek's group-limited routing (``n_group``/``topk_group``), as Megatron's router groups."""
    g = h.f.int_("n_group", None)
    gk = h.f.int_("topk_group", None)
    if g and g > 1:
        kw["moe_router_num_groups"] = g
        kw["moe_router_group_topk"] = gk or g


def mtp_layers(h: Hf, *keys: str) -> int:
    for k in keys:
        if h.f.has(k):
            return int(h.f.int_(k, 0, minimum=0))
    return 0


def dt_rank(h: Hf, key: str, hidden: int) -> int | None:
    """Mamba-1's dt rank: an int, or ``"auto"`` (ceil(hidden / 16), as mamba_ssm and transformers do)."""
    v = h.f.raw(key, "auto")
    if v == "auto":
        return math.ceil(hidden / 16)
    return int(h.f.int_(key))
