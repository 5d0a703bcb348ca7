"""The model spec: Megatron-named architecture fields, layer kinds, parameter and FLOP counts.

Parameter counts follow the weight-by-weight formula in reference/moe-models.yaml (it reproduces every
lab's published total); FLOPs per token follow Megatron-LM's ``num_floating_point_operations`` so our
MFU/TFLOP/s numbers are directly comparable with Megatron's own logs and NVIDIA's tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from hapmoe_milp.config import DISPATCHERS, Settings
from hapmoe_milp.errors import HapmoeError, SpecError
from hapmoe_milp.limits import MAX_EXPERTS, MAX_FREQ_EXPR_LEN, MAX_HEADS, MAX_HIDDEN_SIZE, MAX_LAYERS, MAX_VOCAB
from hapmoe_milp.specs._fields import Fields, check_name, show, spec_hash

LayerKind = Literal["dense", "moe", "mtp"]
ActiveConvention = Literal["all_embeddings", "excl_input_embedding"]

__all__ = [
    "DISPATCHERS",
    "MAX_FREQ_EXPR_LEN",
    "MAX_LAYERS",
    "ModelSpec",
    "model_from_dict",
    "model_hash",
    "model_to_dict",
]


@dataclass(frozen=True)
class OfficialCounts:
    """Parameter counts as the model's authors report them (units of 1e9), with the lab's convention."""

    total_b: float
    active_b: float
    active_convention: ActiveConvention = "all_embeddings"
    includes_mtp: bool = False
    source: str = ""


@dataclass(frozen=True)
class TrainingDefaults:
    """Defaults for `solve`/`estimate` when the user gives none (HAPMoE's settings for its two models)."""

    seq_length: int = 4096
    global_batch_size: int = 256
    micro_batch_size: int = 1
    moe_token_dispatcher_type: str = "alltoall"


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only (MoE) transformer in Megatron-LM's vocabulary.

    ``moe_layer_freq`` is either an int N (layer i is MoE iff i % N == 0, Megatron's rule) or an explicit
    0/1 tuple of length ``num_layers``. MTP layers are extra trailing layers of the last layer's kind.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    num_query_groups: int | None = None
    kv_channels: int | None = None
    ffn_hidden_size: int | None = None
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int = 0
    moe_shared_expert_gate: bool = False
    moe_layer_freq: int | tuple[int, ...] = 1
    moe_router_bias: bool = False
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    mtp_num_layers: int = 0
    untie_embeddings_and_output_weights: bool = True
    swiglu: bool = True
    normalization: str = "RMSNorm"
    add_qkv_bias: bool = False
    add_bias_linear: bool = False
    qk_layernorm: bool = False
    attention_sinks: bool = False
    # sliding-window attention (Megatron --window-size / --window-attn-skip-freq): layers attend to the last
    # ``window_size`` tokens, except every ``window_attn_skip_freq``-th layer, which attends to all
    window_size: int | None = None
    window_attn_skip_freq: int = 0
    make_vocab_size_divisible_by: int = 128
    description: str = ""
    sources: tuple[str, ...] = ()
    official: OfficialCounts | None = None
    defaults: TrainingDefaults = field(default_factory=TrainingDefaults)
    origin: str = ""

    # ------------------------------------------------------------------ derived shape
    def attention_keys_factor(self, seq: int) -> float:
        """Mean keys a query attends to, over all layers, relative to full causal attention (``S/2``).

        With a sliding window of W <= S tokens a query at position i sees min(i+1, W) keys; averaged over
        the S positions that is ``(W(W+1)/2 + (S-W)W) / S``. Layers differ only in this, so the cost model
        prices every layer at the average (exact for a stage's total when its layers alternate evenly).
        """
        w = self.window_size
        if not w or w >= seq:
            return 1.0
        windowed = (w * (w + 1) / 2 + (seq - w) * w) / seq / (seq / 2)
        n = self.num_layers
        full = n // self.window_attn_skip_freq if self.window_attn_skip_freq else 0
        return (full + (n - full) * windowed) / n

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts)

    @property
    def groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def ffn(self) -> int:
        """Dense-layer FFN width; Megatron's default when unset (4h, or int(4h*2/3/64)*64 with SwiGLU)."""
        if self.ffn_hidden_size:
            return self.ffn_hidden_size
        h = self.hidden_size
        return int(4 * h * 2 / 3 / 64) * 64 if self.swiglu else 4 * h

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn

    @property
    def glu(self) -> int:
        """Number of h x F matrices in one MLP (3 for gated SwiGLU, 2 otherwise)."""
        return 3 if self.swiglu else 2

    @property
    def norm_params(self) -> int:
        return 2 if self.normalization == "LayerNorm" else 1

    @cached_property
    def moe_pattern(self) -> tuple[int, ...]:
        if not self.is_moe:
            return (0,) * self.num_layers
        if isinstance(self.moe_layer_freq, int):
            return tuple(1 if i % self.moe_layer_freq == 0 else 0 for i in range(self.num_layers))
        return tuple(self.moe_layer_freq)

    @cached_property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """Kind of every pipeline-placeable layer, decoder layers first, then MTP layers."""
        kinds: list[LayerKind] = ["moe" if m else "dense" for m in self.moe_pattern]
        kinds += ["mtp"] * self.mtp_num_layers
        return tuple(kinds)

    @property
    def mtp_is_moe(self) -> bool:
        return bool(self.moe_pattern and self.moe_pattern[-1])

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_pattern)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def padded_vocab(self, tp: int = 1) -> int:
        m = self.make_vocab_size_divisible_by * tp
        return int(math.ceil(self.vocab_size / m) * m)

    # ------------------------------------------------------------------ attention dims
    @property
    def q_dim(self) -> int:
        """Width of Q (= attention output before the projection) for GQA/MHA."""
        if self.multi_latent_attention:
            return self.num_attention_heads * (self.qk_head_dim + self.qk_pos_emb_head_dim)
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V) per token as stored for attention."""
        if self.multi_latent_attention:
            return self.num_attention_heads * (self.qk_head_dim + self.qk_pos_emb_head_dim)
        return self.groups * self.head_dim

    @property
    def v_dim(self) -> int:
        if self.multi_latent_attention:
            return self.num_attention_heads * self.v_head_dim
        return self.groups * self.head_dim

    @property
    def attn_out_dim(self) -> int:
        if self.multi_latent_attention:
            return self.num_attention_heads * self.v_head_dim
        return self.q_dim

    # ------------------------------------------------------------------ parameters per block
    @cached_property
    def attention_params(self) -> int:
        """Attention weights of one layer (TP-sharded), without its norms."""
        h, n = self.hidden_size, self.num_attention_heads
        if self.multi_latent_attention:
            d_qk, d_rope, d_v = self.qk_head_dim, self.qk_pos_emb_head_dim, self.v_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank * self.norm_params + self.q_lora_rank * n * (d_qk + d_rope)
            else:
                q = h * n * (d_qk + d_rope)
            kv = h * (self.kv_lora_rank + d_rope) + self.kv_lora_rank * self.norm_params
            kv += self.kv_lora_rank * n * (d_qk + d_v)
            return q + kv + n * d_v * h
        q, kv = self.q_dim, self.groups * self.head_dim
        p = h * (q + 2 * kv) + q * h
        if self.add_qkv_bias or self.add_bias_linear:
            p += q + 2 * kv
        if self.add_bias_linear:
            p += h
        if self.qk_layernorm:
            p += 2 * self.head_dim * self.norm_params
        if self.attention_sinks:
            p += n
        return p

    def _mlp_params(self, width: int) -> int:
        p = self.glu * self.hidden_size * width
        if self.add_bias_linear:
            p += (self.glu - 1) * width + self.hidden_size
        return p

    @cached_property
    def dense_mlp_params(self) -> int:
        return self._mlp_params(self.ffn)

    @cached_property
    def expert_params(self) -> int:
        """One routed expert."""
        return self._mlp_params(self.expert_ffn) if self.is_moe else 0

    @cached_property
    def shared_expert_params(self) -> int:
        if not self.moe_shared_expert_intermediate_size:
            return 0
        p = self._mlp_params(self.moe_shared_expert_intermediate_size)
        if self.moe_shared_expert_gate:
            p += self.hidden_size
        return p

    @cached_property
    def router_params(self) -> int:
        if not self.is_moe:
            return 0
        e = self.num_experts or 0
        return self.hidden_size * e + (e if self.moe_router_bias else 0)

    @property
    def layer_norm_params(self) -> int:
        return 2 * self.hidden_size * self.norm_params

    @property
    def mtp_extra_params(self) -> int:
        """Per MTP layer: the 2h->h projection and its three norms (embedding and head are shared)."""
        h = self.hidden_size
        return 2 * h * h + 3 * h * self.norm_params

    def layer_params(self, kind: LayerKind, *, active: bool = False) -> dict[str, int]:
        """Parameters of one placeable layer split by how they are sharded.

        Keys: ``tp`` (sharded by TP: attention, dense MLP, shared experts), ``replicated`` (norms, router),
        ``expert`` (routed experts, sharded by EP*ETP). ``active`` counts only top-k experts.
        """
        is_moe = kind == "moe" or (kind == "mtp" and self.mtp_is_moe)
        tp = self.attention_params
        rep = self.layer_norm_params
        exp = 0
        if is_moe:
            tp += self.shared_expert_params
            rep += self.router_params
            n_exp = self.moe_router_topk if active else (self.num_experts or 0)
            exp = n_exp * self.expert_params
        else:
            tp += self.dense_mlp_params
        if kind == "mtp":
            tp += 2 * self.hidden_size * self.hidden_size
            rep += 3 * self.hidden_size * self.norm_params  # enorm, hnorm and the block's final norm
        return {"tp": tp, "replicated": rep, "expert": exp}

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def output_params(self) -> int:
        return self.vocab_size * self.hidden_size if self.untie_embeddings_and_output_weights else 0

    # ------------------------------------------------------------------ totals
    def _count(self, *, active: bool, include_mtp: bool, input_embedding: bool) -> int:
        total = sum(sum(self.layer_params(k, active=active).values()) for k in self.layer_kinds if k != "mtp")
        if include_mtp:
            total += sum(sum(self.layer_params("mtp", active=active).values()) for _ in range(self.mtp_num_layers))
        total += self.hidden_size * self.norm_params  # final norm
        total += self.output_params
        if input_embedding or not self.untie_embeddings_and_output_weights:
            # with tied embeddings the one matrix is also the LM head, which every token touches
            total += self.embedding_params
        return total

    @cached_property
    def total_params(self) -> int:
        """All weights, MTP included."""
        return self._count(active=False, include_mtp=True, input_embedding=True)

    @cached_property
    def total_params_main(self) -> int:
        """All weights except MTP layers (how DeepSeek reports "671B")."""
        return self._count(active=False, include_mtp=False, input_embedding=True)

    @cached_property
    def active_params(self) -> int:
        """Weights a token touches, both embedding matrices included (Mistral/Qwen/AllenAI convention)."""
        return self._count(active=True, include_mtp=False, input_embedding=True)

    @cached_property
    def active_params_no_input_embedding(self) -> int:
        """Active weights without the input-embedding lookup table (DeepSeek/OpenAI convention)."""
        return self._count(active=True, include_mtp=False, input_embedding=False)

    # ------------------------------------------------------------------ FLOPs (Megatron accounting)
    def flops_per_token(self, seq_length: int | None = None, tp: int = 1) -> float:
        """Training FLOPs per token, exactly Megatron-LM's ``num_floating_point_operations`` / tokens.

        Forward + backward (3 x 2 FLOPs per MAC), causal attention, logits for the main and MTP heads;
        router, norms and the dispatcher are not counted (as in Megatron).
        """
        s = seq_length or self.defaults.seq_length
        h = self.hidden_size
        f = 3 if self.swiglu else 2
        k = self.moe_router_topk if self.is_moe else 0
        d = self.mtp_num_layers
        n_moe = self.num_moe_layers + (d if self.mtp_is_moe else 0)
        n_dense = self.num_dense_layers + (0 if self.mtp_is_moe else d)
        n_attn = self.num_layers + d
        v = self.padded_vocab(tp)
        mlp = 6 * h * (self.ffn * f * n_dense + self.expert_ffn * k * f * n_moe)
        mlp += 6 * h * (self.moe_shared_expert_intermediate_size * f * n_moe)
        n = self.num_attention_heads
        if self.multi_latent_attention:
            d_qk, d_rope, d_v = self.qk_head_dim, self.qk_pos_emb_head_dim, self.v_head_dim
            q_term = self.q_lora_rank * (h + n * (d_qk + d_rope) + 1) if self.q_lora_rank else h * n * (d_qk + d_rope)
            a_lin = 6 * (q_term + self.kv_lora_rank * (h + n * (d_qk + d_v) + 1) + h * d_rope + n * d_v * h)
            a_core = 6 * (n * (d_qk + d_rope) / 2 + n * d_v / 2)
        else:
            q = self.head_dim * n
            kv = self.head_dim * self.groups
            a_lin = 6 * (h * (q + 2 * kv) + q * h)
            a_core = 6 * q
        per_token = mlp + a_lin * n_attn + 6 * d * (3 * h + 2 * h * h) + 6 * h * v * (d + 1)
        per_token += s * a_core * n_attn
        return float(per_token)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "layers": self.num_layers,
            "mtp_layers": self.mtp_num_layers,
            "hidden_size": self.hidden_size,
            "experts": self.num_experts or 0,
            "topk": self.moe_router_topk if self.is_moe else 0,
            "attention": "MLA"
            if self.multi_latent_attention
            else ("GQA" if self.groups < self.num_attention_heads else "MHA"),
            "total_params": self.total_params,
            "total_params_main": self.total_params_main,
            "active_params": self.active_params,
            "active_params_no_input_embedding": self.active_params_no_input_embedding,
            "flops_per_token": self.flops_per_token(),
            "seq_length": self.defaults.seq_length,
            "global_batch_size": self.defaults.global_batch_size,
        }

    def describe(self) -> dict[str, Any]:
        """:meth:`summary` plus the sources and the officially reported parameter counts -- what
        ``models NAME`` shows (``model_to_dict`` is the file format)."""
        d = self.summary()
        d["sources"] = list(self.sources)
        if self.official:
            d["official"] = {
                "total_b": self.official.total_b,
                "active_b": self.official.active_b,
                "active_convention": self.official.active_convention,
            }
        return d


# ---------------------------------------------------------------------- validation + YAML loading
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


def _parse_layer_freq(f: Fields) -> int | tuple[int, ...]:
    v = f.raw("moe_layer_freq", 1)
    if isinstance(v, bool):
        raise f.err("moe_layer_freq", f"must be an integer or a 0/1 list, got {v!r}")
    if isinstance(v, int):
        if v < 1:
            raise f.err("moe_layer_freq", f"must be a positive integer, got {v}")
        return v
    if isinstance(v, str):
        return _parse_freq_expr(v, f)
    if isinstance(v, list):
        out = []
        for i, x in enumerate(v):
            if isinstance(x, bool) or x not in (0, 1):
                raise f.err(f"moe_layer_freq[{i}]", f"must be 0 or 1, got {x!r}")
            out.append(int(x))
        return tuple(out)
    raise f.err("moe_layer_freq", f"must be an integer or a 0/1 list, got {type(v).__name__}")


def _parse_freq_expr(expr: str, f: Fields) -> int | tuple[int, ...]:
    """Megatron's ``--moe-layer-freq`` string forms without eval: ``"3"``, ``"([0]*3+[1]*58)"``,
    ``"([1]*3+[0]*1)*3"``. Grammar: expr = term ('+' term)*; term = atom ('*' int)?;
    atom = '[' 0/1 (',' 0/1)* ']' | '(' expr ')'."""
    text = expr.replace(" ", "")
    if text.isdigit():
        v = int(text[:7]) if len(text) <= 7 else 0
        if v < 1:
            raise f.err("moe_layer_freq", f"must be a positive integer, got {show(expr)}")
        return v
    pos = 0

    def fail(msg: str) -> SpecError:
        return f.err("moe_layer_freq", f"cannot parse list expression {show(expr)}: {msg}")

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
            vals = vals + term()
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
            total_b=off.float_("total_b"),
            active_b=off.float_("active_b"),
            active_convention=off.choice(
                "active_convention", ("all_embeddings", "excl_input_embedding"), "all_embeddings"
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


def load_model_file(path: str | Path) -> ModelSpec:
    from hapmoe_milp.specs._fields import load_document

    doc = load_document(path)
    if "architectures" in doc or "model_type" in doc:
        from hapmoe_milp.specs.hf_import import model_from_hf_config

        return model_from_hf_config(doc, str(path))
    return model_from_dict(doc, str(path))


# ---------------------------------------------------------------------- writing a spec back (plan files)
_NOT_ARCH = ("name", "description", "sources", "official", "defaults", "origin")


def model_to_dict(m: ModelSpec) -> dict[str, Any]:
    """The model as a document ``model_from_dict`` reads back to an equal spec (plan files embed it)."""
    out: dict[str, Any] = {"name": m.name}
    for f in fields(m):
        if f.name in _NOT_ARCH:
            continue
        v = getattr(m, f.name)
        if v is None:
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
