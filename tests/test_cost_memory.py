"""Memory per rank: weights + optimizer state, stored activations x micro-batches in flight.

The reference is Megatron's own theoretical-memory formula (``theoretical_memory_usage.py``, transcribed in
reference/megatron.md §3.2), written out below in its own variables, on a model where that formula is exact:
dense, MHA, non-gated MLP (``swiglu=False``), sequence parallelism, flash attention, CP = 1.

What matches exactly (first pipeline stage, PP > 1):

- weights: ``(6 + 12/DP)`` bytes per parameter with the distributed optimizer (18 without), of
  ``((attn + mlp)*L/PP + embedding)/TP + ln*L/PP``;
- activations of the transformer layers: ``s*b*h*(18 + 4F/h)*L/TP`` (the stage holds PP micro-batches of
  L/PP layers), times ``min(1, M/PP)`` when M < PP, times ``1 + (PP-1)/(PP*VPP)`` when interleaved -- with
  dropout on, as Megatron's default (its formula counts the two dropout masks).

Where our accounting deliberately differs from Megatron's formula, and why (model.py ``_activations`` says
the same):

- embedding: Megatron counts the token ids (8 bytes) and the embedding dropout mask (1 byte) per token over
  TP; we count the ids undivided (every TP rank holds them) and the mask over TP. Megatron's ``final_ln/PP`` appears on the first stage; we
  put the final norm with the head on the last stage. Megatron's PP = 1 output-layer terms are replaced by
  the last stage's logits working set.
- MoE layers: Megatron's formula uses the dense ``ffn_hidden_size`` for every layer and ignores top-k, the
  expert width and the dispatcher; we store the routed tokens (k copies per token, imbalance-weighted) at the
  expert width plus fp32 router probabilities, and count dispatch/combine buffers as working set.
- GQA / MLA and gated MLPs: stored at their real widths (K/V at ``groups*head_dim``, SwiGLU's fc1 output 2F).
- CP: we divide tokens by CP and shard the distributed optimizer over DP*CP (Megatron's formula ignores CP
  in the activations and uses DP without CP as the optimizer divisor, although the optimizer shards over
  the DP x CP group).
- recompute: our ``none`` is Megatron's formula (flash attention already avoids the s^2 terms Megatron's
  selective recompute drops); ``selective`` also drops the norm outputs and expert activation outputs;
  ``full`` keeps only each layer's input. Megatron's formula has no full-recompute case.
"""

from __future__ import annotations

import pytest

from hapmoe_milp.config import ParallelConfig, Settings
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.cost.pipeline import in_flight
from hapmoe_milp.cost.stage import stage_totals
from tests.helpers import dense_mha, synthetic_cluster, tiny_moe

S = 4096
H, F, V, L = 1024, 4096, 32000, 8


def padded_vocab(v: int, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by (128) x TP."""
    return -(-v // (128 * tp)) * 128 * tp


def cm_for(model, nodes: int = 4, **st) -> CostModel:
    """Megatron's defaults where its formula assumes them: dropout on."""
    st.setdefault("dropout", True)
    return CostModel(model, synthetic_cluster(nodes=nodes), Settings(seq_length=S, **st))


def totals(cm, c, counts, *, index, pp, m, vpp=1, b=1, recompute="none"):
    return stage_totals(cm, "syn", c, b, recompute, counts, index=index, pp=pp, num_microbatches=m, vpp=vpp)


# ------------------------------------------------------------------ Megatron's formula, in its own variables
def megatron_weights_first_stage(*, h, F, V, L, n, g, kv_ch, TP, PP, DP, norm=1, dist_opt=True) -> dict[str, float]:
    r_q = kv_ch * n / h
    attn = 2 * h * h * (1 + g / n) * r_q
    dense_mlp = 2 * h * F * 1  # glu = 1 without swiglu
    ln = 2 * h * norm
    final_ln = norm * h
    embedding = h * V
    tp_sharded = ((attn + dense_mlp) * L / PP + embedding) / TP
    replicated_layers = ln * L / PP
    bpp = 6 + 12 / DP if dist_opt else 18
    return {
        "layers_and_embedding": (tp_sharded + replicated_layers) * bpp,
        "final_ln_share": final_ln / PP * bpp,
    }


def megatron_activations_sp(*, s, b, h, F, L, PP, TP, M, VPP=1) -> dict[str, float]:
    """compute_activation_memory (SP formula), first stage, split into its layer and embedding terms."""
    layers = s * b * h * (18 + 4 * F / h) * L
    embedding = 8 * s * b * PP + s * b * h * PP
    factor = 1.0
    if VPP > 1:
        factor = 1 + (PP - 1) / (PP * VPP)
    elif PP > 1:
        factor = min(1, M / PP)
    return {"layers": layers * factor / TP, "embedding": embedding * factor / TP}


# ================================================================== weights
@pytest.mark.parametrize(("tp", "dp", "dist_opt"), [(1, 8, True), (2, 4, True), (4, 2, True), (2, 4, False)])
def test_weights_match_megatrons_formula_on_a_dense_model(tp, dp, dist_opt):
    m = dense_mha()  # 8 layers, MHA, F = 4h, non-gated, RMSNorm, untied
    pp = 2
    cm = cm_for(m, distributed_optimizer=dist_opt)
    t0 = totals(cm, ParallelConfig(tp=tp, dp=dp), {"dense": L // pp}, index=0, pp=pp, m=8)
    vp = padded_vocab(V, tp)  # 32000, or 32256 at TP 4
    ref = megatron_weights_first_stage(h=H, F=F, V=vp, L=L, n=8, g=8, kv_ch=128, TP=tp, PP=pp, DP=dp, dist_opt=dist_opt)
    assert t0.weights == pytest.approx(ref["layers_and_embedding"], rel=1e-12)
    # Megatron charges final_ln/PP to the first stage; we keep the whole final norm on the last stage
    last = totals(cm, ParallelConfig(tp=tp, dp=dp), {"dense": L // pp}, index=1, pp=pp, m=8)
    head = H * vp / tp + H  # output matrix (untied) + final norm
    layers_only = ref["layers_and_embedding"] - (6 + 12 / dp if dist_opt else 18) * H * vp / tp
    assert last.weights == pytest.approx(layers_only + (6 + 12 / dp if dist_opt else 18) * head, rel=1e-12)


def test_moe_weights_shard_experts_over_ep_etp_and_their_optimizer_over_edp():
    """Megatron: expert = routed*N_moe/PP/(ETP*EP) at 6 + 12/EDP; attention/TP + norms + router at 6 + 12/DP."""
    m = tiny_moe()  # GQA 8 heads / 2 groups of 128, 8 SwiGLU experts of 2048
    tp, dp, ep, etp = 2, 4, 2, 2
    edp = tp * dp // (ep * etp)
    cm = cm_for(m)
    # a single stage (PP = 1) of 4 MoE layers holds the embedding and the head as well
    only = totals(cm, ParallelConfig(tp=tp, dp=dp, ep=ep, etp=etp), {"moe": 4}, index=0, pp=1, m=8)
    n_moe = 4
    attn = 2 * H * H * (1 + 2 / 8) * (128 * 8 / H)
    routed = 2 * H * 2048 * 8 * 1.5  # glu = 3/2 with swiglu
    replicated = 2 * H + H * 8  # norms + router
    first_edge = (6 + 12 / dp) * (V * H / tp)
    head = (6 + 12 / dp) * (V * H / tp + H)
    expected = n_moe * ((6 + 12 / dp) * (attn / tp + replicated) + (6 + 12 / edp) * routed / (ep * etp))
    assert only.weights == pytest.approx(expected + first_edge + head, rel=1e-12)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize(("tp", "dp"), [(1, 8), (2, 4)])
def test_one_stage_holds_the_vocabulary_matrix_once_when_tied(tied, tp, dp):
    """PP = 1: parameters counted by hand -- 8 layers of 4h^2 (MHA) + 2hF (non-gated) over TP and two RMSNorms
    of h, the final norm, and the vocabulary matrix V x h over TP once when tied (the head reads the input
    embedding's weight), twice when untied -- at 6 + 12/DP bytes each (distributed optimizer). The search's
    coefficient is the same number (the instance's option reads :meth:`CostModel.single_edge`)."""
    m = dense_mha(untie_embeddings_and_output_weights=not tied)
    cm = cm_for(m)
    c = ParallelConfig(tp=tp, dp=dp)
    vp = padded_vocab(V, tp)
    params = L * ((4 * H * H + 2 * H * F) / tp + 2 * H) + H + (1 if tied else 2) * vp * H / tp
    only = totals(cm, c, {"dense": L}, index=0, pp=1, m=8)
    assert only.weights == pytest.approx((6 + 12 / dp) * params, rel=1e-12)
    single = cm.single_edge("syn", c, 1)
    assert single.params_dense == (1 if tied else 2) * vp * H / tp + H
    # a deeper pipeline keeps a copy on its last stage either way (tied: Megatron's word_embeddings_for_head)
    assert cm.last_edge("syn", c, 1).params_dense == vp * H / tp + H


@pytest.mark.parametrize(("tp", "dp", "pp"), [(1, 8, 2), (2, 4, 2), (4, 2, 1), (8, 1, 4)])
def test_a_learned_position_table_is_seq_by_h_on_the_first_stage_whole_on_every_tp_rank(tp, dp, pp):
    """Megatron core_v0.6.0's default ``--position-embedding-type learned_absolute`` (arguments.py L709 at
    cac60ce4c8) builds ``torch.nn.Embedding(max_sequence_length, hidden_size)`` in the first stage's
    embedding (language_model_embedding.py L51-53): S x h more parameters there, not divided by TP, at
    6 + 12/DP bytes each with the distributed optimizer; no other stage changes."""
    plain, learned = dense_mha(), dense_mha(learned_absolute_position_embedding=True)
    c = ParallelConfig(tp=tp, dp=dp)
    counts = {"dense": L // pp}
    gap = [
        totals(cm_for(learned), c, counts, index=i, pp=pp, m=8).weights
        - totals(cm_for(plain), c, counts, index=i, pp=pp, m=8).weights
        for i in range(pp)
    ]
    assert gap[0] == pytest.approx(S * H * (6 + 12 / dp), rel=1e-12)  # 4096 x 1024 x (6 + 12/DP) bytes
    assert gap[1:] == [0.0] * (pp - 1)


def test_distributed_optimizer_shards_over_dp_times_cp():
    m = dense_mha()
    cm = cm_for(m)
    a = cm.layer("syn", ParallelConfig(tp=2, cp=2, dp=2), 1, "dense", "none")
    local = (4 * H * H + 2 * H * F) / 2 + 2 * H
    assert a.weights == pytest.approx((6 + 12 / 4) * local, rel=1e-12)  # DP*CP = 4, not DP = 2


# ================================================================== activations vs Megatron
@pytest.mark.parametrize(
    ("tp", "pp", "m", "b"), [(2, 2, 8, 1), (2, 4, 16, 1), (4, 4, 4, 2), (1, 2, 8, 1), (8, 4, 32, 1)]
)
def test_first_stage_activations_match_megatrons_sp_formula(tp, pp, m, b):
    model = dense_mha()
    cm = cm_for(model)
    t0 = totals(cm, ParallelConfig(tp=tp, dp=8 // tp), {"dense": L // pp}, index=0, pp=pp, m=m, b=b)
    ref = megatron_activations_sp(s=S, b=b, h=H, F=F, L=L, PP=pp, TP=tp, M=m)
    ours_embedding = min(m, pp) * (8 * S * b + S * b * H / tp)  # token ids (not over TP) + dropout mask
    assert t0.activations == pytest.approx(ref["layers"] + ours_embedding, rel=1e-12)
    # Megatron's embedding terms (token ids + dropout mask) differ from our stored embedding output:
    assert ref["embedding"] == pytest.approx(pp * (8 * S * b + S * b * H) / tp, rel=1e-12)


def test_fewer_microbatches_than_stages_scale_like_megatrons_min_m_over_pp():
    model = dense_mha()
    cm = cm_for(model)
    pp, m = 4, 2
    t0 = totals(cm, ParallelConfig(tp=2, dp=4), {"dense": 2}, index=0, pp=pp, m=m)
    ref = megatron_activations_sp(s=S, b=1, h=H, F=F, L=L, PP=pp, TP=2, M=m)
    assert t0.activations == pytest.approx(ref["layers"] + m * (8 * S + S * H / 2), rel=1e-12)


@pytest.mark.parametrize(("pp", "vpp", "m"), [(4, 2, 8), (4, 4, 16), (2, 2, 4), (8, 2, 16)])
def test_interleaved_first_stage_matches_megatrons_vpp_factor(pp, vpp, m):
    model = dense_mha(num_layers=16)
    cm = cm_for(model)
    t0 = totals(cm, ParallelConfig(tp=2, dp=4), {"dense": 16 // pp}, index=0, pp=pp, m=m, vpp=vpp)
    ref = megatron_activations_sp(s=S, b=1, h=H, F=F, L=16, PP=pp, TP=2, M=m, VPP=vpp)
    factor = 1 + (pp - 1) / (pp * vpp)
    assert t0.activations == pytest.approx(ref["layers"] + factor * pp * (8 * S + S * H / 2), rel=1e-12)


def test_per_layer_dense_activation_is_18_plus_4f_over_h():
    cm = cm_for(dense_mha())
    for tp in (1, 2, 4, 8):
        act = cm.layer("syn", ParallelConfig(tp=tp, dp=8 // tp), 1, "dense", "none").act
        assert act == pytest.approx(S * H * (18 + 4 * F / H) / tp, rel=1e-12)


# ================================================================== in flight
def megatron_1f1b_peak_inputs(rank: int, pp: int, m: int) -> int:
    """Replays the list bookkeeping of Megatron-Core's ``forward_backward_pipelining_without_interleaving``
    (core_v0.6.0 cac60ce4c8, megatron/core/pipeline_parallel/schedules.py L1151-1156 and L1226-1315): the
    warm-up runs ``min(P - rank - 1, M)`` forwards, each appending its input to ``input_tensors``; every
    steady-state step appends one more before its backward pops the oldest; the cool-down only pops. The
    stage's activations live exactly as long as their input is in the list."""
    warm = min(pp - rank - 1, m)
    held = peak = 0
    for _ in range(warm):
        held += 1
        peak = max(peak, held)
    for _ in range(m - warm):
        held += 1  # forward of the next micro-batch
        peak = max(peak, held)
        held -= 1  # backward of the oldest
    return peak


@pytest.mark.parametrize(("pp", "m"), [(2, 128), (4, 256), (8, 512), (4, 3), (8, 1), (3, 3)])
def test_1f1b_in_flight_count_is_megatrons_schedule(pp, m):
    """The FlagPerf LLaMA-3-8B pipelines (PP 2/4/8, M = 512/DP) and short runs: stage s of Megatron's 1F1B
    holds min(M, P - s) micro-batches at its peak, so stage 0 holds P micro-batches of L/P layers."""
    assert [in_flight(s, pp, m) for s in range(pp)] == [megatron_1f1b_peak_inputs(s, pp, m) for s in range(pp)]


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (4, 3), (8, 8), (3, 1)])
def test_stage_activations_scale_with_min_m_p_minus_s(pp, m):
    cm = cm_for(dense_mha())
    c = ParallelConfig(tp=2, dp=4)
    per_layer = cm.layer("syn", c, 1, "dense", "none").act
    for s in range(1, pp - 1):  # middle stages carry no embedding/head terms
        t = totals(cm, c, {"dense": 2}, index=s, pp=pp, m=m)
        assert t.activations == pytest.approx(min(m, pp - s) * 2 * per_layer, rel=1e-12)


def test_in_flight_formulas():
    for pp in (1, 2, 4, 8):
        for m in (1, 2, 4, 8, 64):
            for s in range(pp):
                assert in_flight(s, pp, m) == min(m, pp - s)
    # interleaved, Megatron's warm-up: 2(P-s-1) + (v-1)P forward chunks, then one more before the first
    # backward; each chunk holds 1/v of the rank's layers
    assert in_flight(0, 4, 8, 2) == (2 * 3 + 4 + 1) / 2
    assert in_flight(3, 4, 8, 2) == (0 + 4 + 1) / 2
    assert in_flight(0, 4, 1, 2) == 1.0  # capped at all M*v chunks


# ================================================================== recompute
def test_full_recompute_keeps_only_layer_inputs():
    for cp, tp in ((1, 1), (1, 2), (2, 2), (2, 4)):
        cm = cm_for(dense_mha())
        c = ParallelConfig(tp=tp, cp=cp, dp=8 // (tp * cp))
        assert cm.layer("syn", c, 1, "dense", "full").act == pytest.approx(2 * S * H / (tp * cp), rel=1e-12)
    moe = cm_for(tiny_moe()).layer("syn", ParallelConfig(tp=2, dp=4, ep=4), 1, "moe", "full")
    assert moe.act == pytest.approx(2 * S * H / 2, rel=1e-12)


def test_selective_recompute_drops_the_norm_outputs():
    """Megatron `--recompute-modules layernorm` on a dense layer: the two norm outputs (QKV-GEMM and fc1
    inputs, 2h bytes each per token) are regenerated; everything else stays: ts*(18h + 4F - 4h)."""
    cm = cm_for(dense_mha())
    act = cm.layer("syn", ParallelConfig(tp=2, dp=4), 1, "dense", "selective").act
    assert act == pytest.approx(S / 2 * (14 * H + 4 * F), rel=1e-12)


def test_selective_recompute_on_moe_also_drops_the_expert_activation_output():
    """`layernorm` + `moe_act`: the two norm outputs (QKV input, router input: 2h each) and the routed rows'
    SwiGLU output (the fc2 input, fe wide, bf16; k = 2 rows per token) are regenerated."""
    cm = cm_for(tiny_moe())
    c = ParallelConfig(tp=1, dp=8, ep=4)
    none = cm.layer("syn", c, 1, "moe", "none").act
    sel = cm.layer("syn", c, 1, "moe", "selective").act
    assert none - sel == pytest.approx(S * (4 * H + 2 * 2 * 2048), rel=1e-12)


# ================================================================== where we go beyond Megatron's formula
def test_gqa_stores_k_and_v_at_group_width():
    mha = cm_for(dense_mha()).layer("syn", ParallelConfig(), 1, "dense", "none").act
    gqa = cm_for(dense_mha(num_query_groups=2)).layer("syn", ParallelConfig(), 1, "dense", "none").act
    kv = 2 * 128
    assert mha - gqa == pytest.approx(S * 2 * 2 * (H - kv), rel=1e-12)  # K and V, bf16


def test_gated_mlp_stores_a_2f_wide_fc1_output():
    plain = cm_for(dense_mha()).layer("syn", ParallelConfig(), 1, "dense", "none").act
    gated = cm_for(dense_mha(swiglu=True)).layer("syn", ParallelConfig(), 1, "dense", "none").act
    assert gated - plain == pytest.approx(S * 2 * F, rel=1e-12)


def test_legacy_model_keeps_full_width_kv_a_second_attention_output_and_the_silu_output():
    """Megatron-LM's pre-Core transformer (FlagScale 26cd664 ``megatron/model/transformer.py``): K and V
    repeated to all heads before flash attention, flash attention's (b, s) output and the projection's
    contiguous (s, b) copy, and plain-PyTorch SwiGLU's SiLU output -- per token ``4(q - kv) + 2q + 2F``."""
    model = dense_mha(num_query_groups=2, swiglu=True)
    base, legacy = (
        cm_for(model, dropout=False, legacy_model=lg).layer("syn", ParallelConfig(), 1, "dense", "none").act
        for lg in (False, True)
    )
    assert legacy - base == pytest.approx(S * (2 * 2 * (H - 256) + 2 * H + 2 * F), rel=1e-12)
    # MLP recompute regenerates the SiLU output with the rest of the MLP
    mlp = [cm_for(model, dropout=False, legacy_model=lg).layer("syn", ParallelConfig(), 1, "dense", "mlp").act
           for lg in (False, True)]  # fmt: skip
    assert mlp[1] - mlp[0] == pytest.approx(S * (2 * 2 * (H - 256) + 2 * H), rel=1e-12)


def test_legacy_llama2_70b_layer_is_46h_bytes_per_token_against_core_33_5h():
    """Tallied by hand from the FlagScale source on Llama-2-70B (h 8192, 64 heads, 8 KV groups, F 3.5h),
    BF16, no dropout, per token of the TP shard: norm inputs and GEMM inputs 4 x 2h, Q/K/V 2(h + 2h), flash
    output and its copy 2 x 2h, fc1 output 2 x 7h, SiLU output 7h, fc2 input 7h = 46h; Megatron-Core with
    Transformer Engine: 4 x 2h + 2(h + 2h/8) + 2h + 14h + 7h = 33.5h."""
    from hapmoe_milp.specs import Catalog

    m = Catalog().model("llama-2-70b")
    h, tp = m.hidden_size, 8
    for legacy, per_h in ((False, 33.5), (True, 46.0)):
        cm = CostModel(m, synthetic_cluster(nodes=4), Settings(seq_length=S, legacy_model=legacy))
        act = cm.layer("syn", ParallelConfig(tp=tp, dp=4), 1, "dense", "none").act
        assert act == pytest.approx(S / tp * h * per_h, rel=1e-12)


@pytest.mark.parametrize("imb", [1.0, 1.3])
def test_moe_layer_stores_routed_tokens_at_the_expert_width(imb):
    """Per token of the shard: attention 5h + 2(q + 2kv) + 2q; MoE block 5h (norm input, router/permute
    input, dropout mask) + 4E (fp32 router probabilities) + k routed copies x imbalance x (2h fc1 input +
    2*2fe SwiGLU input + 2fe fc2 input)."""
    cm = cm_for(tiny_moe(), imbalance=imb)
    act = cm.layer("syn", ParallelConfig(), 1, "moe", "none").act
    q, kv, E, k, fe = 1024, 256, 8, 2, 2048
    attn = 5 * H + 2 * (q + 2 * kv) + 2 * q
    moe = 5 * H + 4 * E + k * imb * (2 * H + 2 * 2 * fe + 2 * fe)
    assert act == pytest.approx(S * (attn + moe), rel=1e-12)
    megatron = S * H * (18 + 4 * F / H)  # what Megatron's formula would charge (dense F, no top-k)
    assert act > megatron


def test_expert_tp_gathers_tokens_but_shards_the_expert_width():
    cm = cm_for(tiny_moe())
    a = cm.layer("syn", ParallelConfig(tp=2, dp=4, ep=4, etp=1), 1, "moe", "none").act
    b = cm.layer("syn", ParallelConfig(tp=2, dp=4, ep=2, etp=2), 1, "moe", "none").act
    ts, k = S / 2, 2
    # ETP=2: twice the rows (gathered over ETP) of the 2h fc1 input; the fe-wide terms are unchanged
    assert b - a == pytest.approx(k * ts * 2 * H, rel=1e-12)


def test_dispatch_buffers_are_working_set_not_stored_and_fixed_memory_is_the_largest_working_set():
    cm = cm_for(tiny_moe())
    c = ParallelConfig(tp=2, dp=4, ep=4)
    lay = cm.layer("syn", c, 1, "moe", "none")
    ts, k = S / 2, 2
    assert lay.work - lay.act == pytest.approx(2 * k * ts * H * 2, rel=1e-12)  # dispatch + combine, bf16
    # no framework constant inside the allocator any more: context and fragmentation are device terms
    assert cm.fixed_memory("syn", c, 1) == pytest.approx(lay.work, rel=1e-12)


def test_context_parallel_halves_every_stored_activation():
    for model, kind in ((dense_mha(), "dense"), (tiny_moe(), "moe")):
        cm = cm_for(model)
        one = cm.layer("syn", ParallelConfig(tp=2, dp=4), 1, kind, "none").act
        two = cm.layer("syn", ParallelConfig(tp=2, cp=2, dp=2), 1, kind, "none").act
        assert two == pytest.approx(one / 2, rel=1e-12)


def test_state_bytes_arithmetic_covers_every_field():
    """__add__ and scaled are spelled out for speed: a new field must be added to both."""
    from dataclasses import fields

    from hapmoe_milp.cost.memory import StateBytes

    n = len(fields(StateBytes))
    a = StateBytes(*range(1, n + 1))
    assert (a + a).to_dict() == {k: 2 * v for k, v in a.to_dict().items()}
    assert a.scaled(3.0).to_dict() == {k: 3 * v for k, v in a.to_dict().items()}
