"""The model spec: Megatron-named architecture fields, layer kinds, parameter and FLOP counts.

Parameter counts follow the weight-by-weight formula in reference/moe-models.yaml (it reproduces every
lab's published total); FLOPs per token follow Megatron-LM's ``num_floating_point_operations`` so our
MFU/TFLOP/s numbers are directly comparable with Megatron's own logs and NVIDIA's tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from hapmoe_milp.specs.mixers import GatedDeltaNetShape, Mamba1Shape, Mamba2Shape

# A placeable layer's kind: a token mixer and an MLP. GPT-style models have both in one layer ("dense",
# "moe", and with gated-DeltaNet linear attention "gdn_dense", "gdn_moe"); Megatron's hybrid models
# (``--hybrid-override-pattern``) have one sub-layer per layer: "mamba" (M), "attention" (*), "mlp" (-) and
# "moe_mlp" (E). "mtp" is a multi-token-prediction layer (attention + the last decoder layer's MLP).
LayerKind = Literal["dense", "moe", "mtp", "gdn_dense", "gdn_moe", "mamba", "attention", "mlp", "moe_mlp"]
Mixer = Literal["attention", "gdn", "mamba"]
Mlp = Literal["dense", "moe"]
ActiveConvention = Literal["all_embeddings", "excl_input_embedding", "non_embedding"]

KIND_PARTS: dict[str, tuple[Mixer | None, Mlp | None]] = {
    "dense": ("attention", "dense"),
    "moe": ("attention", "moe"),
    "gdn_dense": ("gdn", "dense"),
    "gdn_moe": ("gdn", "moe"),
    "mamba": ("mamba", None),
    "attention": ("attention", None),
    "mlp": (None, "dense"),
    "moe_mlp": (None, "moe"),
}
# Megatron's hybrid layer symbols (megatron/core/ssm/mamba_hybrid_layer_allocation.py Symbols)
HYBRID_SYMBOLS: dict[str, LayerKind] = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe_mlp"}

__all__ = ["HYBRID_SYMBOLS", "KIND_PARTS", "LayerKind", "ModelSpec", "OfficialCounts", "TrainingDefaults"]


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
    # --- fields below have Megatron's names; a model that leaves them at their defaults is written without
    # them (model_to_dict), so older plan files keep their model hash
    rotary_percent: float = 1.0  # partial rotary (GLM-4.5 0.5, Qwen3-Next 0.25): no weights, no FLOPs
    no_rope_freq: int | None = None  # every N-th layer has no RoPE (Llama 4 iRoPE)
    # chunked attention (Llama 4): RoPE layers attend within blocks of this many tokens, NoPE layers to all
    attention_chunk_size: int | None = None
    qk_l2_norm: bool = False  # Llama 4's weightless L2 norm of Q and K
    attention_output_gate: bool = False  # sigmoid gate on the attention output (Qwen3-Next): + h*q weights
    squared_relu: bool = False  # non-gated squared-ReLU MLP (Nemotron-H)
    # Megatron's --position-embedding-type learned_absolute (its default until core 0.x recipes pass rope): a
    # seq_length x h table on the first stage, replicated over TP (megatron/core/models/common/embeddings/
    # language_model_embedding.py at core_v0.6.0 cac60ce4c8, L51-53); False: RoPE or none, no weights
    learned_absolute_position_embedding: bool = False
    # group-limited routing (DeepSeek n_group/topk_group): experts in num_groups groups, a token's top-k
    # drawn from its group_topk best groups
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    # hybrid models (Megatron MambaModel): one symbol per layer, M mamba, * attention, - MLP, E MoE
    hybrid_override_pattern: str | None = None
    mamba_version: int = 2  # 2: Mamba-2 (SSD, Megatron's MambaMixer); 1: Mamba-1 (Jamba), not in Megatron
    mamba_state_dim: int = 128
    mamba_head_dim: int = 64
    mamba_num_groups: int = 8
    mamba_num_heads: int | None = None  # default: mamba_expand * hidden_size / mamba_head_dim (Megatron's)
    mamba_conv_kernel: int = 4
    mamba_expand: int = 2
    mamba_dt_rank: int | None = None  # Mamba-1 only; default ceil(hidden_size / 16)
    # gated DeltaNet linear attention in a GPT model (Megatron experimental_attention_variant)
    experimental_attention_variant: str | None = None
    linear_attention_freq: int | tuple[int, ...] | None = None  # int N: every N-th layer is softmax attention
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    make_vocab_size_divisible_by: int = 128
    description: str = ""
    sources: tuple[str, ...] = ()
    official: OfficialCounts | None = None
    defaults: TrainingDefaults = field(default_factory=TrainingDefaults)
    origin: str = ""

    # ------------------------------------------------------------------ derived shape
    def attention_span(self, layer: int, seq: int) -> float:
        """Mean keys a query of attention layer ``layer`` attends to, relative to full causal attention
        (``S/2``): 1 for full attention, less under a sliding window or chunked attention.

        With a sliding window of W <= S tokens a query at position i sees min(i+1, W) keys, on average
        ``(W(W+1)/2 + (S-W)W) / S``; in blocks of C tokens it sees (i mod C) + 1, on average
        ``(q C(C+1)/2 + r(r+1)/2) / S`` with ``S = qC + r``.
        """
        w, c = self.window_size, self.attention_chunk_size
        if w and w < seq and not (self.window_attn_skip_freq and (layer + 1) % self.window_attn_skip_freq == 0):
            return (w * (w + 1) / 2 + (seq - w) * w) / seq / (seq / 2)
        if c and c < seq and not (self.no_rope_freq and (layer + 1) % self.no_rope_freq == 0):
            q, r = divmod(seq, c)
            return (q * c * (c + 1) / 2 + r * (r + 1) / 2) / seq / (seq / 2)
        return 1.0

    def attention_keys_factor(self, seq: int) -> float:
        """Mean of :meth:`attention_span` over the layers that have softmax attention.

        Layers differ only in this, so the cost model prices every attention layer at the average (exact
        for a stage's total when its layers alternate evenly).
        """
        layers = [i for i, mx in enumerate(self.mixer_pattern) if mx == "attention"]
        if not layers:
            return 1.0
        return sum(self.attention_span(i, seq) for i in layers) / len(layers)

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

    @property
    def is_hybrid(self) -> bool:
        """A Megatron hybrid (MambaModel) layer stack: one sub-layer per layer."""
        return bool(self.hybrid_override_pattern)

    @property
    def has_linear_attention(self) -> bool:
        return self.experimental_attention_variant == "gated_delta_net"

    @cached_property
    def linear_pattern(self) -> tuple[int, ...]:
        """1 for a gated-DeltaNet layer, 0 for softmax attention (Megatron's ``linear_attention_freq``: an
        int N makes every N-th layer, 1-based, softmax attention)."""
        f = self.linear_attention_freq
        if not self.has_linear_attention or f is None:
            return (0,) * self.num_layers
        if isinstance(f, int):
            return tuple(0 if (i + 1) % f == 0 else 1 for i in range(self.num_layers))
        return tuple(f)

    @cached_property
    def moe_pattern(self) -> tuple[int, ...]:
        if self.is_hybrid:
            return tuple(1 if ch == "E" else 0 for ch in self.hybrid_override_pattern or "")
        if not self.is_moe:
            return (0,) * self.num_layers
        if isinstance(self.moe_layer_freq, int):
            return tuple(1 if i % self.moe_layer_freq == 0 else 0 for i in range(self.num_layers))
        return tuple(self.moe_layer_freq)

    @cached_property
    def decoder_kinds(self) -> tuple[LayerKind, ...]:
        """Kind of every decoder layer (MTP layers excluded)."""
        if self.is_hybrid:
            return tuple(HYBRID_SYMBOLS[ch] for ch in self.hybrid_override_pattern or "")
        out: list[LayerKind] = []
        for lin, moe in zip(self.linear_pattern, self.moe_pattern):
            if lin:
                out.append("gdn_moe" if moe else "gdn_dense")
            else:
                out.append("moe" if moe else "dense")
        return tuple(out)

    @cached_property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """Kind of every pipeline-placeable layer, decoder layers first, then MTP layers."""
        return self.decoder_kinds + ("mtp",) * self.mtp_num_layers

    def kind_parts(self, kind: str) -> tuple[Mixer | None, Mlp | None]:
        """(token mixer, MLP) of a layer kind; an MTP layer is attention plus the last layer's MLP."""
        if kind == "mtp":
            return "attention", ("moe" if self.mtp_is_moe else "dense")
        return KIND_PARTS[kind]

    def kind_is_moe(self, kind: str) -> bool:
        return self.kind_parts(kind)[1] == "moe"

    @cached_property
    def mixer_pattern(self) -> tuple[Mixer | None, ...]:
        return tuple(KIND_PARTS[k][0] for k in self.decoder_kinds)

    @property
    def mtp_is_moe(self) -> bool:
        return bool(self.moe_pattern and self.moe_pattern[-1])

    @property
    def num_moe_layers(self) -> int:
        """Decoder layers with a MoE MLP."""
        return sum(self.moe_pattern)

    @property
    def num_dense_layers(self) -> int:
        """Decoder layers with a dense MLP."""
        return sum(1 for k in self.decoder_kinds if KIND_PARTS[k][1] == "dense")

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
        if self.attention_output_gate:
            p += h * q  # the gate is a second Q-wide output of the QKV projection
        return p

    @cached_property
    def mamba_shape(self) -> Mamba1Shape | Mamba2Shape:
        h = self.hidden_size
        if self.mamba_version == 1:
            rank = self.mamba_dt_rank or math.ceil(h / 16)
            return Mamba1Shape(h, self.mamba_expand * h, self.mamba_state_dim, rank, self.mamba_conv_kernel)
        heads = self.mamba_num_heads or self.mamba_expand * h // self.mamba_head_dim
        return Mamba2Shape(
            h, heads, self.mamba_head_dim, self.mamba_num_groups, self.mamba_state_dim, self.mamba_conv_kernel
        )

    @cached_property
    def gdn_shape(self) -> GatedDeltaNetShape:
        return GatedDeltaNetShape(
            self.hidden_size,
            self.linear_num_key_heads,
            self.linear_num_value_heads,
            self.linear_key_head_dim,
            self.linear_value_head_dim,
            self.linear_conv_kernel_dim,
        )

    def mixer_params(self, mixer: Mixer | None) -> int:
        """Weights of one token mixer (TP-sharded), without its pre-norm."""
        if mixer == "attention":
            return self.attention_params
        if mixer == "gdn":
            return self.gdn_shape.params()
        if mixer == "mamba":
            return self.mamba_shape.params()
        return 0

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

        Keys: ``tp`` (sharded by TP: token mixer, dense MLP, shared experts), ``replicated`` (norms, router),
        ``expert`` (routed experts, sharded by EP*ETP). ``active`` counts only top-k experts. Every
        sub-layer (mixer, MLP) has its own pre-norm.
        """
        mixer, mlp = self.kind_parts(kind)
        tp = self.mixer_params(mixer)
        rep = self.hidden_size * self.norm_params * ((mixer is not None) + (mlp is not None))
        exp = 0
        if mlp == "moe":
            tp += self.shared_expert_params
            rep += self.router_params
            n_exp = self.moe_router_topk if active else (self.num_experts or 0)
            exp = n_exp * self.expert_params
        elif mlp == "dense":
            tp += self.dense_mlp_params
        if kind == "mtp":
            tp += 2 * self.hidden_size * self.hidden_size
            rep += 3 * self.hidden_size * self.norm_params  # enorm, hnorm and the block's final norm
        return {"tp": tp, "replicated": rep, "expert": exp}

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def first_stage_embedding_params(self, tp: int, seq_length: int) -> float:
        """Input-embedding parameters on one TP rank of the first stage: the padded vocabulary shard, and a
        learned absolute position table of ``seq_length`` rows (exports set ``--max-position-embeddings`` to
        the sequence length), which Megatron keeps whole on every TP rank (a plain ``torch.nn.Embedding``)."""
        positions = seq_length if self.learned_absolute_position_embedding else 0
        return self.padded_vocab(tp) * self.hidden_size / tp + positions * self.hidden_size

    @property
    def output_params(self) -> int:
        return self.vocab_size * self.hidden_size if self.untie_embeddings_and_output_weights else 0

    # ------------------------------------------------------------------ totals
    def _count(self, *, active: bool, include_mtp: bool, input_embedding: bool, output: bool = True) -> int:
        total = sum(sum(self.layer_params(k, active=active).values()) for k in self.layer_kinds if k != "mtp")
        if include_mtp:
            total += sum(sum(self.layer_params("mtp", active=active).values()) for _ in range(self.mtp_num_layers))
        total += self.hidden_size * self.norm_params  # final norm
        if not output:
            return total
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

    @cached_property
    def active_params_non_embedding(self) -> int:
        """Active weights without either embedding matrix (IBM Granite, NVIDIA's "3.2B active" style)."""
        return self._count(active=True, include_mtp=False, input_embedding=False, output=False)

    def active_count(self, convention: ActiveConvention) -> int:
        """The active count under a lab's convention (``OfficialCounts.active_convention``)."""
        return {
            "all_embeddings": self.active_params,
            "excl_input_embedding": self.active_params_no_input_embedding,
            "non_embedding": self.active_params_non_embedding,
        }[convention]

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
        n_attn = self.mixer_pattern.count("attention") + d
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
            a_lin = 6 * (h * (q + 2 * kv) + q * h + (h * q if self.attention_output_gate else 0))
            a_core = 6 * q
        per_token = mlp + a_lin * n_attn + 6 * d * (3 * h + 2 * h * h) + 6 * h * v * (d + 1)
        per_token += s * a_core * n_attn
        per_token += self._other_mixer_flops()
        return float(per_token)

    def _other_mixer_flops(self) -> float:
        """Gated-DeltaNet and Mamba layers, counted the same way (6 FLOPs per multiply-accumulate, forward
        and backward): their projections plus their chunked scan, which does not grow with the sequence."""
        n_gdn, n_mamba = self.mixer_pattern.count("gdn"), self.mixer_pattern.count("mamba")
        out = 0.0
        if n_gdn:
            g = self.gdn_shape
            out += 6 * n_gdn * (g.gemm_macs() + g.scan_macs())
        if n_mamba:
            mb = self.mamba_shape
            out += 6 * n_mamba * (mb.gemm_macs() + mb.scan_macs())
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "layers": self.num_layers,
            "mtp_layers": self.mtp_num_layers,
            "hidden_size": self.hidden_size,
            "experts": self.num_experts or 0,
            "topk": self.moe_router_topk if self.is_moe else 0,
            "attention": self._attention_label(),
            "total_params": self.total_params,
            "total_params_main": self.total_params_main,
            "active_params": self.active_params,
            "active_params_no_input_embedding": self.active_params_no_input_embedding,
            "active_params_non_embedding": self.active_params_non_embedding,
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

    def _attention_label(self) -> str:
        base = "MLA" if self.multi_latent_attention else ("GQA" if self.groups < self.num_attention_heads else "MHA")
        if self.is_hybrid:
            return f"hybrid Mamba-{self.mamba_version} + {base}"
        if self.has_linear_attention:
            return f"gated DeltaNet + {base}"
        return base
