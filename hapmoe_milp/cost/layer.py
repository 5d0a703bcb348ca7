"""A layer's price in two parts, composed by :meth:`CostModel._layer <hapmoe_milp.cost.model.CostModel>`:
the kernel time of its mixer, MLP or routed experts, FP8 casts and MTP extras (:func:`layer_compute`), and
its TP / CP / EP communication before any overlap (:func:`layer_comm`). They live apart from the model so
each reads as one section of the formula sheet (reference/papers.md §13.2); the primitives and the model's
own pricing helpers (GEMMs, the mixer, the EP dispatcher) come from the :class:`CostModel` passed in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from hapmoe_milp.config import ParallelConfig
from hapmoe_milp.cost.mixers import mixer_cp_bytes, mixer_out_width
from hapmoe_milp.cost.primitives import BF16, FP32, gemm_time, memory_time
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.model import LayerKind

if TYPE_CHECKING:
    from hapmoe_milp.cost.model import CostModel

# Element-wise passes over a [t, h] bf16 tensor per layer forward: two norms (read+write each), two
# residual adds (2 reads + 1 write), rotary embedding on Q/K, dropout/bias fusions -- an assumption.
ELEMENTWISE_PASSES_H = 14
# Permute + unpermute of routed tokens, read + write each, forward (of the rows the dispatcher permutes).
PERMUTE_PASSES = 4
# HBM bytes per quantised element by FP8 recipe: read the BF16 tensor, write the FP8 copy the GEMM reads
# and the transposed (column-wise) copy the other backward GEMM reads; per-tensor recipes first read the
# tensor once more for its amax; block-scaled recipes write a scale per block (1/32 or 1/128 byte).
FP8_CAST_BYTES = {"tensorwise": 6.0, "blockwise": 4.0, "mxfp8": 4.0}
FUSED_CAST_BYTES = 3.0  # a cast folded into the producing kernel: read BF16 once more, write FP8
# HBM passes (elements read + written, per element of the tensor) that the unfused element-wise chains add over
# the fused kernel, (forward, backward). Derived from the code paths of MindSpeed-LLM (ModelLink) @104cd47479:
# - gated activation (modellink/model/transformer.py parallel_mlp_init_wrapper): without --use-fused-swiglu,
#   ``chunk`` then ``F.silu(x0) * x1`` (GeGLU: ``F.gelu(x0) * x1``, no fused form), per element of the
#   [t, F] output: forward silu 2 + mul 3 = 5 against npu_swiglu's 3 (read 2F, write F); backward the two mul
#   gradients 3 + 3, silu's 3 and the chunk's concatenation of both halves 4 = 13 against the fused 5
#   (read the output gradient and 2F inputs, write 2F).
# - rotary (modellink/core/models/common/embeddings/rotary_pos_embedding.py apply_rotary_pos_emb): without
#   --use-fused-rotary-pos-emb, ``t * cos`` 2, ``_rotate_half`` (neg of one half 1, cat 2) 3, ``* sin`` 2, the
#   add 3 and ``cat((t, t_pass))`` 2 = 12 against npu_rotary_mul's 2 per element of Q and K; backward the
#   two product gradients 2 + 2, neg 1, the half-concatenation 2 and the sum of both paths 3 = 10 against 2.
UNFUSED_GLU_PASSES = (2.0, 8.0)
UNFUSED_ROPE_PASSES = (10.0, 8.0)


# ModelLink's legacy GShard MoE (MindSpeed ascendspeed/components/moe @224ae35e, gate.py top2gating): the
# [S, E, C] FP32 tensors the gate builds per token, expert and capacity slot, in HBM bytes per element forward:
# combine1_sec and combine2_sec written (4 + 4), their sum (read 8, write 4), dispatch_mask = .bool() (read 4,
# write 1), dispatch_mask.type_as(bf16) (read 1, write 2), combine_weights.type_as(bf16) (read 4, write 2)
GSHARD_MASK_BYTES = 34.0


def gshard_dispatch(dev: DeviceSpec, s: float, ec: float, h: float) -> tuple[float, float]:
    """(forward, backward) seconds of the legacy GShard layer's token dispatch and combine on one rank.

    moe_layer.py and utils.einsum (MindSpeed ascendspeed/components/moe @224ae35e) run both as dense matmuls
    over every (token, expert, capacity slot): dispatch ``[E*C, S] @ [S, h]`` and combine ``[S, E*C] @ [E*C, h]``,
    with ``E*C = capacity factor x k x S`` for the ``S`` tokens the gate sees, plus the gate's ``[S, E, C]``
    masks (:data:`GSHARD_MASK_BYTES`). Backward: the dispatch mask carries no gradient (one matmul, for the
    input), the combine weights do (two matmuls); the mask passes at twice the forward, as every element-wise
    pass here.
    """
    disp = gemm_time(dev, ec, h, s, "bf16")
    comb = gemm_time(dev, s, h, ec, "bf16")
    masks = memory_time(dev, GSHARD_MASK_BYTES * s * ec)
    return disp + comb + masks, disp + 2 * comb + 2 * masks


class Compute(NamedTuple):
    """A layer's kernel time (forward, backward) and the pieces its communication and recompute need."""

    f_comp: float
    b_comp: float
    attn_core_f: float
    attn_core_b: float
    elem: float
    routed_rows: float
    n_tp_coll: int
    # forward seconds of the pieces Megatron's recompute modules re-run (cost/recompute.py)
    mlp_f: float = 0.0
    shared_f: float = 0.0
    moe_f: float = 0.0
    sublayers: int = 2


def layer_compute(
    cm: CostModel,
    dev: DeviceSpec,
    did: str,
    cfg: ParallelConfig,
    t: float,
    ts: float,
    kind: LayerKind,
    mixer: Any,
    mlp_kind: Any,
) -> Compute:
    """Forward and backward kernel time of a layer's mixer, MLP or experts, FP8 casts and MTP extras."""
    m, st = cm.model, cm.settings
    prec, h, tp = st.precision, m.hidden_size, cfg.tp
    is_moe = mlp_kind == "moe"

    # ---- token mixer: attention (projections and flash-style core), or gated DeltaNet / Mamba
    f_comp, b_comp, attn_core_f, attn_core_b = cm._mixer_time(dev, mixer, t, tp, prec, cfg.cp)
    # two norms and two residual adds per attention+MLP layer; half for a one-sub-layer hybrid layer
    sublayers = (mixer is not None) + (mlp_kind is not None)
    elem = memory_time(dev, ELEMENTWISE_PASSES_H * sublayers / 2 * ts * h * BF16)
    f_comp += elem
    b_comp += 2 * elem

    # ---- MLP: dense, or router + routed experts + shared experts
    n_tp_coll = 2 if mixer else 0  # the mixer's AG + RS (forward)
    routed_rows = 0.0
    mlp_f = shared_f = moe_f = 0.0
    if is_moe:
        E = m.num_experts or 1
        k = m.moe_router_topk
        local = E // cfg.ep
        rows_per_expert = k * t * cfg.ep * cfg.etp / (tp * E)
        routed_rows = rows_per_expert * local
        imb = st.expert_rows_factor
        router = gemm_time(dev, ts, E, h, "bf16") + memory_time(dev, 4 * ts * E * FP32)
        if st.gshard_capacity_factor:
            exp_f = cm.expert_gemms(did, rows_per_expert, local, cfg.etp, grouped=False)
            disp_f, disp_b = gshard_dispatch(dev, ts, k * st.gshard_capacity_factor * ts, h)
        else:
            exp_f = cm.expert_gemms(did, rows_per_expert, local, cfg.etp)
            # the alltoall and flex dispatchers permute the k copies of the rank's own tokens before sending them;
            # the allgather dispatcher permutes after gathering the EP x TP group's tokens, the rows its local
            # experts take (MoEAllGatherTokenDispatcher.token_permutation: permute(hidden_states, local_map) on
            # the gathered set, NVIDIA/Megatron-LM megatron/core/transformer/moe/token_dispatcher.py@0014f137;
            # MindSpeed's allgather_token_permutation indexes it by global_local_map, then by the sort indices,
            # mindspeed/core/transformer/moe/token_dispatcher.py@4ea42a23; unpermute scatters them back)
            rows = routed_rows if st.dispatcher == "allgather" else k * ts
            disp_f = memory_time(dev, PERMUTE_PASSES * rows * h * BF16)
            disp_b = 2 * disp_f
        f_comp += imb * exp_f + router + disp_f
        b_comp += imb * 2 * exp_f + 2 * router + disp_b
        moe_f = imb * exp_f + router + disp_f
        if m.moe_shared_expert_intermediate_size:
            sh = shared_f = cm._mlp_gemms(dev, t, m.moe_shared_expert_intermediate_size / tp, prec)
            f_comp += sh
            b_comp += 2 * sh
            n_tp_coll += 2
    elif mlp_kind == "dense":
        mlp = mlp_f = cm._mlp_gemms(dev, t, m.ffn / tp, prec)
        f_comp += mlp
        b_comp += 2 * mlp
        n_tp_coll += 2
        if m.glu == 3 and not st.fused_swiglu:
            uf, ub = (memory_time(dev, n * t * m.ffn / tp * BF16) for n in UNFUSED_GLU_PASSES)
            mlp_f += uf
            f_comp += uf
            b_comp += ub
    if mixer == "attention" and not m.multi_latent_attention and not st.fused_rope:
        qk = t * (m.q_dim + m.kv_dim) / tp
        f_comp += memory_time(dev, UNFUSED_ROPE_PASSES[0] * qk * BF16)
        b_comp += memory_time(dev, UNFUSED_ROPE_PASSES[1] * qk * BF16)

    # ---- FP8: every GEMM input is quantised first, activations forward and output gradients backward.
    # Dense inputs come out of fused norm / activation kernels (one extra read + write of the tensor);
    # routed tokens arrive by permute and are quantised per expert on their own, at the recipe's full
    # cost (FP8_CAST_BYTES: amax read, cast, row- and column-wise copies).
    if prec == "fp8":
        ins = t * h + t * mixer_out_width(m, mixer) / tp if mixer else 0.0
        routed = 0.0
        if is_moe:
            routed = routed_rows * (h + m.expert_ffn / cfg.etp)
            if m.moe_shared_expert_intermediate_size:
                ins += t * (h + m.moe_shared_expert_intermediate_size / tp)
        elif mlp_kind == "dense":
            ins += t * (h + m.ffn / tp)
        cast = memory_time(dev, FUSED_CAST_BYTES * ins + FP8_CAST_BYTES[st.fp8_recipe] * routed * st.expert_rows_factor)
        f_comp += cast
        b_comp += 2 * cast

    # ---- MTP extras: 2h->h projection and its own logits + loss
    if kind == "mtp":
        proj = gemm_time(dev, t, h / tp, 2 * h, prec)
        head_f, head_b = cm._head(dev, t, tp, prec)
        f_comp += proj + head_f
        b_comp += 2 * proj + head_b
    # ---- the software stack's achieved share of the micro-benchmarked kernel speed
    scale = dev.runtime.stack_compute_scale
    f_comp /= scale
    b_comp /= scale
    return Compute(
        f_comp, b_comp, attn_core_f, attn_core_b, elem, routed_rows, n_tp_coll,
        mlp_f / scale, shared_f / scale, moe_f / scale, sublayers,
    )  # fmt: skip


def layer_comm(
    cm: CostModel,
    dev: DeviceSpec,
    did: str,
    cfg: ParallelConfig,
    t: float,
    ts: float,
    mixer: Any,
    is_moe: bool,
    c: Compute,
) -> tuple[float, float, float, float]:
    """(TP forward, CP forward, CP backward, EP forward) communication time of a layer, before overlap."""
    m, h, tp, cp = cm.model, cm.model.hidden_size, cfg.tp, cfg.cp
    attn_core_f, attn_core_b, n_tp_coll = c.attn_core_f, c.attn_core_b, c.n_tp_coll
    # ---- tensor-parallel collectives (sequence parallel: all-gather + reduce-scatter pairs)
    tp_f = 0.0
    if tp > 1:
        tp_f = (
            n_tp_coll
            / 2
            * (
                cm.collective(dev, did, "all_gather", t * h * BF16, tp, tp)
                + cm.collective(dev, did, "reduce_scatter", t * h * BF16, tp, tp)
            )
        )
    # ---- context parallel: ring exchange of K/V chunks, hidden behind the attention core when it can be
    cp_f = cp_b = 0.0
    if cp > 1 and mixer in ("gdn", "mamba"):
        # sequence shard -> head shard and back around the mixer, forward and backward
        a2a = mixer_cp_bytes(m, mixer, t, tp)
        cp_f = cp_b = 2 * cm.collective(dev, did, "all_to_all", a2a, cp, tp * cp)
    elif cp > 1 and mixer == "attention":
        kv_shards = tp if m.multi_latent_attention else min(tp, m.groups)
        kv_bytes = t * (m.kv_dim + m.v_dim) * BF16 / kv_shards
        step = cm.collective(dev, did, "p2p", kv_bytes, 2, tp * cp)
        cp_f = max(0.0, (cp - 1) * step - attn_core_f)
        cp_b = max(0.0, 2 * (cp - 1) * step - attn_core_b)
    # ---- expert parallel: dispatch + combine
    ep_f = 0.0
    if is_moe and cm.ep_comm_visible:
        ep_f = cm._ep_comm(dev, did, cfg, ts)
    return tp_f, cp_f, cp_b, ep_f
