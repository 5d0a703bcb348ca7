"""Per-layer costs (hapmoe_milp/cost/model.py, CostModel.layer and the edges) pinned term by term.

The device is synthetic: constant tables (GEMM efficiency 0.5, attention 0.4 forward / 0.25 backward), one
busbw per primitive and link class, and a memory bandwidth so high that element-wise kernels cost ~1e-9 of
a GEMM. Each term then has a closed form, written out below from the layer's shapes (Megatron's FLOP
accounting, nccl-tests' bus-bandwidth convention), never copied from the code's output.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from hapmoe_milp.config import ParallelConfig, Settings
from hapmoe_milp.cost.model import ADAM_BYTES_PER_PARAM, CostModel
from hapmoe_milp.specs import Catalog, ModelSpec
from hapmoe_milp.specs.device import DeviceSpec
from tests.helpers import (
    AEFF_B,
    AEFF_F,
    EFF,
    FP8_PEAK,
    HUGE_BW,
    INTER,
    INTRA,
    PEAK,
    dense_mha,
    synthetic_cluster,
    synthetic_device,
    tiny_moe,
)

S = 4096
REL = 1e-6


def cm_for(model: ModelSpec, dev: DeviceSpec | None = None, nodes: int = 2, **st) -> CostModel:
    return CostModel(model, synthetic_cluster(dev, nodes), Settings(seq_length=S, **st))


def cfg(tp=1, cp=1, dp=1, ep=1, etp=1) -> ParallelConfig:
    return ParallelConfig(tp=tp, cp=cp, dp=dp, ep=ep, etp=etp)


# ------------------------------------------------------------------ closed forms (forward FLOPs of one micro-batch)
def attn_linear_flops(t: float, h: int, q: int, kv: int) -> float:
    """QKV projection (h -> q + 2 kv) and output projection (q -> h): Megatron's A_lin / 3 per token."""
    return 2 * t * (h * (q + 2 * kv) + q * h)


def attn_core_flops(t: float, s: int, q: int) -> float:
    """Causal flash attention, forward: QK^T and PV, 2 FLOPs per MAC, half the keys on average: 2*t*s*q."""
    return 2 * t * s * q


# ================================================================== attention + dense MLP
def test_dense_layer_forward_and_backward_closed_form():
    m = dense_mha()
    L = cm_for(m).layer("syn", cfg(), 1, "dense", "none")
    t, h, F = S, 1024, 4096
    lin = attn_linear_flops(t, h, 1024, 1024) + 2 * t * h * F * 2  # non-gated MLP: fc1 h->F, fc2 F->h
    core = attn_core_flops(t, S, 1024)
    fwd = lin / (EFF * PEAK) + core / (AEFF_F * PEAK)
    bwd = 2 * lin / (EFF * PEAK) + 2.5 * core / (AEFF_B * PEAK)  # flash backward: 2.5x the forward core
    assert L.fwd == pytest.approx(fwd, rel=REL)
    assert L.bwd == pytest.approx(bwd, rel=REL)
    assert L.compute == pytest.approx(fwd + bwd, rel=REL)
    assert L.tp == L.cp == L.ep == 0.0


def test_dense_layer_flops_equal_megatrons_per_token_terms():
    """Forward FLOPs per token = (A_lin + 6*h*F*f)/3 + 2*q*s (megatron.md §3.1), f = 2 non-gated."""
    m = dense_mha()
    dev = synthetic_device(attn_eff=(EFF, EFF))  # one efficiency for everything: time * eff * peak = FLOPs
    L = cm_for(m, dev).layer("syn", cfg(), 1, "dense", "none")
    h, F, q = 1024, 4096, 1024
    a_lin = 6 * (h * (q + 2 * q) + q * h)
    fwd_per_token = (a_lin + 6 * h * F * 2) / 3 + 2 * q * S
    assert L.fwd * EFF * PEAK / S == pytest.approx(fwd_per_token, rel=REL)


def test_tensor_parallel_divides_per_rank_compute():
    m = dense_mha()
    cm = cm_for(m)
    one = cm.layer("syn", cfg(), 1, "dense", "none").compute
    for tp in (2, 4, 8):
        assert cm.layer("syn", cfg(tp=tp), 1, "dense", "none").compute == pytest.approx(one / tp, rel=REL)


# ================================================================== tensor-parallel collectives (SP)
def sp_pair(t: float, h: int, tp: int, intra=INTRA) -> float:
    """One all-gather + one reduce-scatter of the full [t, h] bf16 activation over TP ranks."""
    size = t * h * 2
    return (tp - 1) / tp * size / (intra["all_gather"] * 1e9) + (tp - 1) / tp * size / (intra["reduce_scatter"] * 1e9)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tp_with_sp_dense_layer_has_two_ag_rs_pairs_each_way(tp):
    m = dense_mha()
    cm = cm_for(m)
    L = cm.layer("syn", cfg(tp=tp), 1, "dense", "none")
    pair = sp_pair(S, 1024, tp)
    assert L.tp == pytest.approx(2 * 2 * pair, rel=REL)  # attention + MLP, forward + backward
    base = cm.layer("syn", cfg(), 1, "dense", "none")
    # the collectives sit on top of the TP-divided compute
    assert L.fwd == pytest.approx(base.fwd / tp + 2 * pair, rel=REL)
    assert L.bwd == pytest.approx(base.bwd / tp + 2 * pair, rel=REL)


def test_tp_moe_layer_pairs_attention_only_unless_shared_experts():
    """Routed experts run on the EP x ETP grid (no TP collectives); a shared expert is a TP-sharded MLP."""
    plain = cm_for(tiny_moe()).layer("syn", cfg(tp=2, dp=4, ep=1), 1, "moe", "none")
    shared = cm_for(tiny_moe(moe_shared_expert_intermediate_size=1024)).layer(
        "syn", cfg(tp=2, dp=4, ep=1), 1, "moe", "none"
    )
    pair = sp_pair(S, 1024, 2)
    assert plain.tp == pytest.approx(2 * 1 * pair, rel=REL)
    assert shared.tp == pytest.approx(2 * 2 * pair, rel=REL)


def test_tp_on_a_full_mesh_pays_for_the_links_it_cannot_use():
    mesh = synthetic_device(fabric="mesh")  # 7 links of 50 per device (350 total)
    L_mesh = cm_for(dense_mha(), mesh).layer("syn", cfg(tp=2), 1, "dense", "none")
    L_switch = cm_for(dense_mha()).layer("syn", cfg(tp=2), 1, "dense", "none")
    assert L_mesh.tp == pytest.approx(7 * L_switch.tp, rel=REL)  # TP=2 drives 1 of 7 links
    L4 = cm_for(dense_mha(), mesh).layer("syn", cfg(tp=4), 1, "dense", "none")
    assert L4.tp == pytest.approx(7 / 3 * 2 * 2 * sp_pair(S, 1024, 4), rel=REL)  # 3 of 7 links


# ================================================================== context parallel
def test_cp_ring_exchange_is_hidden_behind_the_attention_core_when_faster():
    m = dense_mha()
    L = cm_for(m).layer("syn", cfg(cp=2), 1, "dense", "none")
    t = S / 2
    kv_bytes = t * (1024 + 1024) * 2  # this rank's K and V chunk, bf16
    step = kv_bytes / (INTRA["p2p"] * 1e9)  # 21 us
    core_f = attn_core_flops(t, S, 1024) / (AEFF_F * PEAK)  # 430 us: hides the ring
    assert step < core_f
    assert L.cp == 0.0


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_exposed_time_is_comm_minus_attention_core(cp):
    slow = synthetic_device(intra=INTRA | {"p2p": 0.1})  # 0.1 GB/s ring: communication dominates
    m = dense_mha()
    L = cm_for(m, slow).layer("syn", cfg(cp=cp), 1, "dense", "none")
    t = S / cp
    step = t * 2048 * 2 / 0.1e9
    core_f = attn_core_flops(t, S, 1024) / (AEFF_F * PEAK)
    core_b = 2.5 * attn_core_flops(t, S, 1024) / (AEFF_B * PEAK)
    exp_f = max(0.0, (cp - 1) * step - core_f)  # K/V chunks travel cp-1 hops forward
    exp_b = max(0.0, 2 * (cp - 1) * step - core_b)  # backward also returns dK/dV
    assert exp_f > 0 and exp_b > 0
    assert L.cp == pytest.approx(exp_f + exp_b, rel=REL)


def test_cp_divides_tokens_and_gqa_shrinks_the_ring_payload():
    slow = synthetic_device(intra=INTRA | {"p2p": 0.1})
    L = cm_for(tiny_moe(), slow).layer("syn", cfg(cp=2, dp=1), 1, "moe", "none")
    t = S / 2
    step = t * (256 + 256) * 2 / 0.1e9  # 2 KV groups x 128 for K and for V
    core_f = attn_core_flops(t, S, 1024) / (AEFF_F * PEAK)
    core_b = 2.5 * attn_core_flops(t, S, 1024) / (AEFF_B * PEAK)
    assert L.cp == pytest.approx(max(0, step - core_f) + max(0, 2 * step - core_b), rel=REL)


# ================================================================== routed experts
def moe_flops(t: float, h=1024, q=1024, kv=256, E=8, k=2, fe=2048) -> tuple[float, float, float, float]:
    """(attention linear, attention core, router, routed experts) forward FLOPs of one micro-batch, all ranks."""
    return (
        attn_linear_flops(t, h, q, kv),
        attn_core_flops(t, S, q),
        2 * t * h * E,  # router GEMM (bf16, not counted by Megatron's FLOPs)
        2 * (k * t) * h * 3 * fe,  # k copies of every token through a SwiGLU expert (fc1 h->2fe, fc2 fe->h)
    )


@pytest.mark.parametrize("imb", [1.0, 1.5])
def test_moe_layer_forward_backward_with_imbalance(imb):
    L = cm_for(tiny_moe(), imbalance=imb).layer("syn", cfg(), 1, "moe", "none")
    lin, core, router, experts = moe_flops(S)
    fwd = (lin + router + imb * experts) / (EFF * PEAK) + core / (AEFF_F * PEAK)
    bwd = 2 * (lin + router + imb * experts) / (EFF * PEAK) + 2.5 * core / (AEFF_B * PEAK)
    assert L.fwd == pytest.approx(fwd, rel=REL)
    assert L.bwd == pytest.approx(bwd, rel=REL)


@pytest.mark.parametrize(("ep", "etp"), [(2, 1), (4, 1), (8, 1), (4, 2), (2, 4)])
def test_per_rank_expert_flops_do_not_depend_on_ep_or_etp(ep, etp):
    """E/EP local experts x k*t*EP*ETP/(TP*E) rows x (width fe/ETP) = k*t*fe FLOP units per rank."""
    cm = cm_for(tiny_moe())
    base = cm.layer("syn", cfg(dp=8), 1, "moe", "none").compute
    assert cm.layer("syn", cfg(dp=8, ep=ep, etp=etp), 1, "moe", "none").compute == pytest.approx(base, rel=REL)


def test_rows_per_expert_formula_shows_through_tile_padding():
    """16 experts, top-3, t = 4096: rows per expert = k*t*EP*ETP/(TP*E) = 768*EP. At EP=1 that is 768
    (not padded); with S = 1024 it is 192*EP: EP=1 pads 192 -> 256 rows (4/3 of the work), EP=2 gives
    384 = 3 tiles exactly."""
    m = tiny_moe(num_experts=16, moe_router_topk=3)
    cm = CostModel(m, synthetic_cluster(), Settings(seq_length=1024))
    t, h, fe, k = 1024, 1024, 2048, 3
    experts = 2 * k * t * h * 3 * fe / (EFF * PEAK)  # unpadded forward expert time
    c1 = cm.layer("syn", cfg(dp=2, ep=1), 1, "moe", "none").compute
    c2 = cm.layer("syn", cfg(dp=2, ep=2), 1, "moe", "none").compute
    assert c1 - c2 == pytest.approx(3 * (4 / 3 - 1) * experts, rel=REL)  # forward 1x + backward 2x


# ================================================================== expert-parallel communication
def dispatch(intra_bytes: float, inter_bytes: float = 0.0, flex: bool = False) -> float:
    """One dispatch (or combine): in-node and network parts move at once at the runtime bandwidths."""
    f = 2.0 if flex else 1.0
    return max(intra_bytes / (f * INTRA["all_to_all"] * 1e9), inter_bytes / (f * INTER["all_to_all"] * 1e9))


@pytest.mark.parametrize(("tp", "ep", "dp"), [(1, 2, 8), (1, 4, 8), (1, 8, 8), (2, 4, 4), (2, 2, 4)])
def test_ep_all_to_all_bytes_and_count(tp, ep, dp):
    """Per dispatch, a rank sends one copy of h bf16 values per routed (token, expert) pair of its t/TP
    tokens; inside one node all of them move over the scale-up fabric. Dispatch + combine forward, the same
    again backward."""
    L = cm_for(tiny_moe()).layer("syn", cfg(tp=tp, dp=dp, ep=ep), 1, "moe", "none")
    one = dispatch(2 * S / tp * 1024 * 2)
    assert L.ep == pytest.approx(4 * one, rel=REL)
    base = cm_for(tiny_moe()).layer("syn", cfg(tp=tp, dp=dp), 1, "moe", "none")
    assert L.fwd - base.fwd == pytest.approx(2 * one, rel=REL)


def test_ep_with_etp_adds_an_expert_tp_gather_and_scatter_but_not_all_to_all_bytes():
    """Megatron's alltoall dispatcher: all-to-all of the rank's own k*ts tokens over EP, then an all-gather
    (and after the experts a reduce-scatter) of those tokens over the ETP group."""
    L = cm_for(tiny_moe()).layer("syn", cfg(tp=2, dp=4, ep=4, etp=2), 1, "moe", "none")
    ts = S / 2
    one_a2a = dispatch(2 * ts * 1024 * 2)
    gathered = 2 * 2 * ts * 1024 * 2  # ETP x k x ts tokens of h bf16 after the gather
    etp = 0.5 * gathered / (INTRA["all_gather"] * 1e9) + 0.5 * gathered / (INTRA["reduce_scatter"] * 1e9)
    assert L.ep == pytest.approx(2 * (2 * one_a2a + etp), rel=REL)


def test_ep_group_spanning_nodes_sends_its_remote_share_over_the_network_and_imbalance_scales_bytes():
    cm = cm_for(tiny_moe(), nodes=2, imbalance=1.25)
    L = cm.layer("syn", cfg(dp=16, ep=8), 1, "moe", "none")
    D = S * 2 * 1024 * 2 * 1.25  # the busiest rank sends imbalance x the mean
    assert L.ep == pytest.approx(4 * dispatch(D), rel=REL)
    cm16 = cm_for(tiny_moe(num_experts=16), nodes=2)
    L16 = cm16.layer("syn", cfg(dp=16, ep=16), 1, "moe", "none")
    D16 = S * 2 * 1024 * 2
    assert L16.ep == pytest.approx(4 * dispatch(D16 / 2, D16 / 2), rel=REL)


def test_flex_dispatcher_sends_a_token_once_per_destination_node_and_rank():
    """DeepEP-style: over the network once per distinct remote node, over NVLink once per distinct rank.
    With 16 experts over 16 ranks on 2 nodes and top-2: E[distinct nodes] = 2(1 - C(8,2)/C(16,2)) = 1.4667,
    of which half are remote; E[distinct ranks] = 16(1 - C(15,2)/C(16,2)) = 2."""
    cm = cm_for(tiny_moe(num_experts=16), nodes=2, dispatcher="flex")
    L = cm.layer("syn", cfg(dp=16, ep=16), 1, "moe", "none")
    tok = S * 1024 * 2
    nodes = 2 * (1 - (8 * 7) / (16 * 15))
    ranks = 16 * (1 - (15 * 14) / (16 * 15))
    assert L.ep == pytest.approx(4 * dispatch(ranks * tok, nodes / 2 * tok, flex=True), rel=REL)


def test_allgather_dispatcher_gathers_all_tokens_over_the_ep_group():
    L = cm_for(tiny_moe(), dispatcher="allgather").layer("syn", cfg(dp=8, ep=4), 1, "moe", "none")
    size = 4 * S * 1024 * 2  # every rank ends up with the 4 ranks' tokens
    one = 0.75 * size / (INTRA["all_gather"] * 1e9) + 0.75 * size / (INTRA["reduce_scatter"] * 1e9)
    assert L.ep == pytest.approx(2 * one, rel=REL)


@pytest.mark.parametrize("share", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("a2a_GBps", [50.0, 0.05], ids=["comm<compute", "comm>compute"])
def test_overlapped_ep_communication_hides_a_share_of_what_the_other_micro_batch_computes(share, a2a_GBps):
    """Overlap runs one micro-batch's dispatch beside another's compute: it hides share x min(comm, compute)."""
    dev = synthetic_device()
    dev = replace(dev, runtime=replace(dev.runtime, ep_overlap=share, a2a_intra_GBps=a2a_GBps))
    a = cm_for(tiny_moe(), dev).layer("syn", cfg(dp=8, ep=4), 1, "moe", "none")
    b = cm_for(tiny_moe(), dev, overlap_ep_comm=True).layer("syn", cfg(dp=8, ep=4), 1, "moe", "none")
    hidden = share * min(a.ep, a.compute)
    assert b.ep == pytest.approx(a.ep - hidden, rel=REL)
    assert a.fwd + a.bwd - b.fwd - b.bwd == pytest.approx(hidden, rel=REL)


# ================================================================== recompute
@pytest.mark.parametrize("model", [dense_mha(), tiny_moe()], ids=["dense", "moe"])
def test_full_recompute_adds_exactly_the_forward(model):
    kind = "moe" if model.is_moe else "dense"
    c = cfg(tp=2, dp=4, ep=4 if model.is_moe else 1)
    cm = cm_for(model)
    none = cm.layer("syn", c, 1, kind, "none")
    full = cm.layer("syn", c, 1, kind, "full")
    assert full.fwd == pytest.approx(none.fwd, rel=1e-12)
    assert full.bwd == pytest.approx(none.bwd + none.fwd, rel=REL)
    # the re-run forward's collectives are reported as communication, its kernels as compute
    assert full.tp == pytest.approx(1.5 * none.tp, rel=REL)
    assert full.ep == pytest.approx(1.5 * none.ep, rel=REL)
    assert full.compute - none.compute == pytest.approx(none.fwd - none.tp / 2 - none.ep / 2, rel=REL)
    assert full.compute + full.tp + full.cp + full.ep == pytest.approx(full.fwd + full.bwd, rel=1e-12)


def test_selective_recompute_reruns_norms_and_expert_activation():
    """With a finite memory bandwidth B: the two re-run norms (`layernorm`: read and write [ts, h] each, four
    passes) plus the SwiGLU over the routed rows (`moe_act`: read 2 fe, write fe per row, bf16)."""
    B = 1000e9
    dev = synthetic_device(mem_GBps=B / 1e9)
    cm = cm_for(tiny_moe(), dev)
    none = cm.layer("syn", cfg(), 1, "moe", "none")
    sel = cm.layer("syn", cfg(), 1, "moe", "selective")
    ts, h, fe, k = S, 1024, 2048, 2
    extra = (4 * ts * h * 2 + 3 * k * ts * fe * 2) / B
    assert sel.bwd - none.bwd == pytest.approx(extra, rel=1e-9)
    assert sel.fwd == none.fwd


# ================================================================== precision
def test_fp8_uses_the_fp8_peak_for_linear_layers_only():
    """fp8 GEMMs for projections and experts; the router and the attention core stay bf16."""
    L = cm_for(tiny_moe(), precision="fp8").layer("syn", cfg(), 1, "moe", "none")
    lin, core, router, experts = moe_flops(S)
    fwd = (lin + experts) / (EFF * FP8_PEAK) + router / (EFF * PEAK) + core / (AEFF_F * PEAK)
    assert L.fwd == pytest.approx(fwd, rel=REL)


# ================================================================== weights, gradient sync, optimizer
def dense_layer_params(h=1024, F=4096) -> tuple[int, int]:
    """(TP-sharded, replicated) params of a dense MHA non-gated layer with RMSNorm, no biases."""
    return 4 * h * h + 2 * h * F, 2 * h


def test_distributed_optimizer_sync_times_closed_form():
    """fp32 gradient reduce-scatter + bf16 parameter all-gather over DP*CP, on the intra table (8 ranks)."""
    sharded, rep = dense_layer_params()
    L = cm_for(dense_mha()).layer("syn", cfg(tp=2, dp=4), 1, "dense", "none")
    local = sharded / 2 + rep
    assert L.params_dense == local and L.params_expert == 0
    assert L.weights == pytest.approx((6 + 12 / 4) * local, rel=1e-12)
    assert L.rs == pytest.approx(0.75 * 4 * local / (INTRA["reduce_scatter"] * 1e9), rel=REL)
    assert L.ag == pytest.approx(0.75 * 2 * local / (INTRA["all_gather"] * 1e9), rel=REL)
    assert L.opt == pytest.approx(ADAM_BYTES_PER_PARAM * local / 4 / (HUGE_BW * 1e9), rel=REL)


def test_without_distributed_optimizer_gradients_are_all_reduced_and_weights_cost_18_bytes():
    sharded, rep = dense_layer_params()
    L = cm_for(dense_mha(), distributed_optimizer=False).layer("syn", cfg(tp=2, dp=4), 1, "dense", "none")
    local = sharded / 2 + rep
    assert L.weights == pytest.approx(18 * local, rel=1e-12)
    assert L.rs == pytest.approx(2 * 0.75 * 4 * local / (INTRA["all_reduce"] * 1e9), rel=REL)
    assert L.ag == 0.0


def test_expert_gradients_sync_over_edp_and_across_nodes_when_the_stage_spans_them():
    m = tiny_moe()
    L = cm_for(m, nodes=2).layer("syn", cfg(dp=16, ep=4), 1, "moe", "none")
    expert_local = 8 * 3 * 1024 * 2048 / 4  # 8 SwiGLU experts of 3*h*fe, 4-way EP
    edp = 16 // 4
    assert L.params_expert == expert_local
    dense_local = 1024 * (1024 + 2 * 256) + 1024 * 1024 + 2 * 1024 + 1024 * 8  # GQA attention, norms, router
    assert L.params_dense == dense_local
    # ring collectives across nodes add up the NICs of the group's members in a node, capped by the in-node rate
    # (cost/primitives.rail_busbw): dense DP16 has 8 members per node, expert DP4 (stride EP4) has 2
    dense_bw = min(8 * INTER["reduce_scatter"], INTRA["reduce_scatter"])
    expert_bw = min(2 * INTER["reduce_scatter"], INTRA["reduce_scatter"])
    rs = 15 / 16 * 4 * dense_local / (dense_bw * 1e9) + (edp - 1) / edp * 4 * expert_local / (expert_bw * 1e9)
    assert L.rs == pytest.approx(rs, rel=REL)
    assert L.weights == pytest.approx((6 + 12 / 16) * dense_local + (6 + 12 / edp) * expert_local, rel=1e-12)


def test_optimizer_offload_keeps_6_bytes_per_param_and_pays_the_host_round_trip():
    sharded, rep = dense_layer_params()
    st = dict(optimizer_offload=True, offload_host_GBps=10.0, offload_adam_params_per_s=1e9)
    L = cm_for(dense_mha(), **st).layer("syn", cfg(tp=2, dp=4), 1, "dense", "none")
    local = sharded / 2 + rep
    shard = local / 4
    assert L.weights == pytest.approx(6 * local, rel=1e-12)  # bf16 params + fp32 grads stay on the device
    assert L.opt == pytest.approx((4 + 2) * shard / 10e9 + shard / 1e9, rel=1e-12)


# ================================================================== edges and boundaries
def test_head_costs_the_vocabulary_gemm():
    m = dense_mha()
    E = cm_for(m).last_edge("syn", cfg(), 1)
    V = 32000  # already a multiple of 128
    assert E.fwd == pytest.approx(2 * S * V * 1024 / (EFF * PEAK), rel=REL)
    assert E.bwd == pytest.approx(2 * 2 * S * V * 1024 / (EFF * PEAK), rel=REL)
    assert E.params_dense == V * 1024 + 1024  # untied output matrix + final norm


def test_pipeline_p2p_sends_the_sequence_parallel_shard():
    cm = cm_for(dense_mha(), nodes=2)
    c = cfg(tp=2, dp=2)
    nbytes = S / 2 * 1024 * 2
    assert cm.p2p("syn", c, 1, "syn", 4) == pytest.approx(nbytes / (INTRA["p2p"] * 1e9), rel=REL)
    assert cm.p2p("syn", cfg(tp=2, dp=4), 1, "syn", 8) == pytest.approx(nbytes / (INTER["p2p"] * 1e9), rel=REL)


# ================================================================== whole-model FLOPs vs Megatron (published values)
MEGATRON_FLOPS_PER_TOKEN = [  # reference/megatron.md §3.1, computed with Megatron's own function at s = 4096
    ("mixtral-8x7b", 7.971e10),
    ("mixtral-8x22b", 2.422e11),
    ("qwen3-30b-a3b", 2.301e10),
    ("qwen3-235b-a22b", 1.480e11),
    ("deepseek-v3", 2.600e11),
]


@pytest.mark.parametrize(("mid", "per_token"), MEGATRON_FLOPS_PER_TOKEN, ids=[r[0] for r in MEGATRON_FLOPS_PER_TOKEN])
def test_cost_model_flops_match_megatron_for_catalog_models(mid, per_token):
    """With one efficiency e for GEMMs and the attention forward, and 1.25 e for the attention backward (so
    its 2.5x recompute-inclusive work takes 2x the forward's time), time x e x peak is FLOPs. Summed over
    every layer and both edges it must equal Megatron's count plus the router GEMMs Megatron leaves out
    (6 h E per MoE layer per token)."""
    m = Catalog().model(mid)
    dev = synthetic_device(attn_eff=(EFF, 1.25 * EFF))
    cm = cm_for(m, dev, nodes=1)
    c = cfg()
    total = sum(cm.layer("syn", c, 1, k, "none").compute for k in m.layer_kinds)
    total += cm.first_edge("syn", c, 1).compute + cm.last_edge("syn", c, 1).compute
    n_moe = m.num_moe_layers + (m.mtp_num_layers if m.mtp_is_moe else 0)
    router = 6 * m.hidden_size * m.num_experts * n_moe
    assert total * EFF * PEAK / S - router == pytest.approx(per_token, rel=1e-3)


def test_shared_expert_and_dense_layers_of_deepseek_are_priced_at_their_own_width():
    m = Catalog().model("deepseek-v3")
    dev = synthetic_device(attn_eff=(EFF, 1.25 * EFF))
    cm = cm_for(m, dev, nodes=1)
    dense = cm.layer("syn", cfg(), 1, "dense", "none").compute
    moe = cm.layer("syn", cfg(), 1, "moe", "none").compute
    h = 7168
    # dense MLP (F 18432) vs 8 routed + 1 shared expert of 2048 and the 256-way router, all SwiGLU
    diff_per_token = 6 * h * 3 * (18432 - 9 * 2048) - 6 * h * 256
    assert (dense - moe) * EFF * PEAK / S == pytest.approx(diff_per_token, rel=1e-6)


def test_layer_costs_are_memoised_per_option():
    cm = cm_for(tiny_moe())
    a = cm.layer("syn", cfg(dp=8, ep=4), 1, "moe", "none")
    assert cm.layer("syn", cfg(dp=8, ep=4), 1, "moe", "none") is a
    assert replace(a, fwd=0.0) != a


# (tp, ep): the allgather dispatcher permutes the rows its local experts take out of the EP x TP group's
# gathered tokens (k * S * EP * ETP / TP * local / E); alltoall permutes the k copies of its own S / TP tokens
@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 1), (4, 1), (2, 2), (1, 4)])
def test_allgather_dispatcher_permutes_the_gathered_rows_of_its_local_experts(tp, ep):
    bw, seq, k, h, E = 1000.0, 4096, 2, 1024, 8  # tiny_moe: h 1024, 8 experts top-2

    def compute(dispatcher: str) -> float:
        cm = CostModel(
            tiny_moe(),
            synthetic_cluster(synthetic_device(mem_GBps=bw)),
            Settings(seq_length=seq, dispatcher=dispatcher),
        )
        return cm.layer("syn", ParallelConfig(tp=tp, dp=8 // tp, ep=ep, etp=tp), 1, "moe", "none").compute

    gathered = k * seq * ep * tp / tp * (E // ep) / E
    own = k * seq / tp
    expected = 3 * 4 * 2 * (gathered - own) * h / (bw * 1e9)  # 4 passes of BF16, forward + 2x backward
    assert compute("allgather") - compute("alltoall") == pytest.approx(expected, rel=1e-9, abs=1e-15)
