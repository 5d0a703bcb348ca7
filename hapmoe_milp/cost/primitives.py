"""Kernel- and collective-level timings read from a device's lookup tables.

GEMMs use a roofline on top of the measured efficiency curve: time is the larger of the compute time at
the table's achieved efficiency for that GEMM size and the time to stream its operands at the device's
achievable memory bandwidth. The memory term is what makes many small experts (fine-grained MoE)
slow: each expert's weights must be read however few tokens it gets.
"""

from __future__ import annotations

import math

from hapmoe_milp.specs.device import DeviceSpec

GIB = 1024**3
BF16 = 2
FP32 = 4
TILE_ROWS = 128  # assumed GEMM tile height (CUTLASS/cuBLAS/hipBLASLt class kernels); rows are padded to it


def gemm_time(dev: DeviceSpec, m: float, n: float, k: float, precision: str = "bf16", groups: int = 1) -> float:
    """Seconds for ``groups`` GEMMs of (m x k) @ (k x n), run as one grouped kernel (routed experts as a
    training stack runs them: :func:`expert_gemm_time`).

    A grouped GEMM runs at the dense efficiency of its total work (one launch, one tail) times
    ``m / (m + grouped_rows_half)``: per-expert blocks of few rows leave tiles padded and SMs unevenly
    loaded, which is what makes fine-grained experts slow even when their total work is large.
    """
    if m <= 0 or n <= 0 or k <= 0 or groups <= 0:
        return 0.0
    rt = dev.runtime
    m_pad = math.ceil(m / TILE_ROWS) * TILE_ROWS if m < 4 * TILE_ROWS else m
    flops = 2.0 * m_pad * n * k * groups
    # The efficiency curve is tabulated for BF16 against FLOPs; its fall at small sizes is a fixed time (launch,
    # tail, prologue), which an FP8 GEMM pays in full while doing its FLOPs twice as fast. So an FP8 GEMM reads
    # the curve at the BF16 GEMM of equal duration: FLOPs scaled by the peak ratio.
    at = flops * dev.peak("bf16") / dev.peak(precision) if precision == "fp8" else flops
    eff = min(1.0, dev.gemm_efficiency(at) * rt.gemm_scale * (rt.fp8_gemm_scale if precision == "fp8" else 1.0))
    if groups > 1:
        eff *= m / (m + rt.grouped_rows_half)
    t_compute = flops / (eff * dev.peak(precision) * 1e12)
    elem = 1 if precision == "fp8" else BF16
    nbytes = groups * (elem * (m * k + k * n) + BF16 * m * n)
    return max(t_compute, memory_time(dev, nbytes))


#: Compute streams Transformer Engine spreads a ``GroupedLinear``'s per-expert GEMMs over, by vendor. TE's
#: ``GroupedLinear`` (Megatron's ``TEGroupedMLP``) calls ``general_grouped_gemm`` -> ``nvte_multi_tensor_gemm``,
#: which by default (``NVTE_USE_CUTLASS_GROUPED_GEMM`` unset; its CUTLASS grouped kernel is opt-in and
#: Hopper-BF16-only) issues one cuBLAS GEMM per expert, expert ``i`` on compute stream ``i % num_streams``
#: (``transformer_engine/common/gemm/cublaslt_gemm.cu``@v2.12 (5671fd3675) ``multi_stream_cublas_gemm``), with
#: ``num_compute_streams = 4`` (``common/util/multi_stream.cpp``@v2.12); unchanged through v2.18 (27486e03cf),
#: where the fused cuBLASLt grouped GEMM path of ``GroupedLinear`` is opt-in
#: (``NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM``, default 0, ``pytorch/module/grouped_linear.py``@v2.18). Same for
#: BF16, FP8 current/delayed scaling, blockwise and MXFP8, on Hopper and Blackwell. A vendor not listed runs its
#: experts as one grouped kernel (MindSpeed's GMM on Ascend); AMD's TE fork is not checked and stays grouped.
#: The count of concurrent streams is read from the code, not measured.
EXPERT_GEMM_STREAMS = {"nvidia": 4}


def expert_gemm_time(dev: DeviceSpec, m: float, n: float, k: float, precision: str, groups: int) -> float:
    """Seconds for ``groups`` routed-expert GEMMs of (m x k) @ (k x n) as the device's training stack runs them.

    One grouped kernel (:func:`gemm_time` with ``groups``) where the stack has one; under Transformer Engine
    (``EXPERT_GEMM_STREAMS``) one GEMM per expert, round-robin over ``s`` streams: each stream runs
    ``ceil(groups / s)`` GEMMs back to back, each no faster than it runs alone (its fixed launch/tail/prologue
    time included, :func:`gemm_time` with one group), and all of them together no faster than their total
    work at the grouped efficiency. The time is the larger of the two bounds.
    """
    grouped = gemm_time(dev, m, n, k, precision, groups=groups)
    streams = EXPERT_GEMM_STREAMS.get(dev.vendor)
    if streams is None or groups <= 1:
        return grouped
    waves = math.ceil(groups / streams)
    return max(grouped, waves * gemm_time(dev, m, n, k, precision))


def attention_time(dev: DeviceSpec, flops: float, seq: int, backward: bool) -> float:
    """Flash-style attention core; efficiency from the device's attention tables (BF16)."""
    if flops <= 0:
        return 0.0
    table = dev.attention_bwd_efficiency if backward else dev.attention_efficiency
    eff = min(1.0, table(seq) * dev.runtime.attention_scale)
    return flops / (eff * dev.peak("bf16") * 1e12)


#: The runtime term that holds each chunked linear-scan kernel's measured efficiency.
SCAN_TERMS = {"ssd": "ssd_efficiency", "gdn": "gdn_efficiency"}


def scan_time(dev: DeviceSpec, flops: float, kernel: str) -> float:
    """A chunked linear-scan kernel -- Mamba-2's SSD (``ssd``) or gated DeltaNet's delta rule (``gdn``) -- at
    the device's measured efficiency for it (``runtime.ssd_efficiency`` / ``runtime.gdn_efficiency``).

    Priced apart from attention: each is five to ten short Triton kernels (chunk cumulative sums, chunk states,
    state passing, chunk-local matmuls, for the delta rule a triangular solve) with FP32 intermediates,
    published at 3-13% of the BF16 peak on B200 and H100, where fused attention reaches 40-60%
    (``bench/calibration/microbenchmarks.yaml``, kinds ``ssd`` and ``gdn``)."""
    if flops <= 0:
        return 0.0
    return flops / (getattr(dev.runtime, SCAN_TERMS[kernel]) * dev.peak("bf16") * 1e12)


def memory_time(dev: DeviceSpec, nbytes: float) -> float:
    """A memory-bound kernel moving ``nbytes`` (reads + writes) at the achieved HBM bandwidth."""
    if nbytes <= 0:
        return 0.0
    return nbytes / (dev.runtime.memory_efficiency * dev.memory_bandwidth_GBps * 1e9)


def host_overhead(kernels: float, dev: DeviceSpec, syncs: float = 0.0) -> float:
    """Device idle time a span of ``kernels`` launches and ``syncs`` device-to-host syncs adds to its work.

    Profiles of Megatron MoE training show the device waiting between kernels even when the host keeps
    up on average: dependent small ops, stream waits and syncs empty the launch queue, so each kernel
    costs its launch latency on top of its work. ``launch_us`` is that average idle per kernel and
    ``sync_us`` the cost of one sync (drain, copy, relaunch), so the overhead is additive, per layer and
    micro-batch: it is what longer micro-batches amortise.
    """
    rt = dev.runtime
    return (kernels * rt.launch_us + syncs * rt.sync_us) * 1e-6


def host_bound_excess(dev: DeviceSpec, calls: float, device_s: float) -> float:
    """Seconds a span's host calls add when the host, not the device, sets its pace.

    The host runs ahead of the device while each call's CPU work (argument checks, tensor and quantizer
    set-up, autograd bookkeeping: ``call_us``) is shorter than the device work it issues. A span of short
    kernels (fine-grained experts, one micro-batch of a few thousand tokens) turns that round: the device
    finishes each kernel before the host has issued the next, and the span lasts as long as its calls. A
    CUDA graph replays its captured calls without the host. ``device_s`` is the span's device timeline (work,
    exposed communication and launch idle), so the excess is ``max(0, calls x call_us - device_s)``: zero
    while the device is the bottleneck, which is why longer micro-batches hide the host entirely.

    The shipped ``call_us`` (80 us, assumed) lies between a plain op's host CPU time (``torch.nn.Linear`` forward,
    13.48 us on an x86 DGX H100 host: TransformerEngine issue #2053) and a Megatron-Core Transformer Engine
    linear's (``TEColumnParallelLinear`` forward, 140 us, 115 us after TransformerEngine PR #1191).
    """
    host_s = calls * dev.runtime.call_us * 1e-6
    return max(0.0, host_s - device_s)


def ep_overlap_host_hidden(dev: DeviceSpec, dispatcher: str, host_fwd: float, other_bwd_compute: float) -> float:
    """Forward launch idle of a MoE layer that EP-communication overlap hides, per micro-batch.

    Megatron's ``--overlap-moe-expert-parallel-comm`` runs one micro-batch's forward layer and another's
    backward layer as one interleaved schedule (``TransformerLayerSchedulePlan.run``, Megatron-LM
    ``megatron/core/models/common/model_chunk_schedule_plan.py``@core_v0.16.0 (3bec9aa97d), lines 190-254):
    the host issues the forward attention, then the other micro-batch's expert backward, then the forward
    dispatch. The dropless dispatcher's host sync on the token counts (``token_dispatcher.py``@core_v0.16.0,
    ``_maybe_dtoh_and_synchronize``: D2H copy issued after the forward preprocess, ``d2h_event.synchronize()``
    before the all-to-all) therefore waits while the backward's expert GEMMs, issued just before it, keep the
    device busy, so the device does not drain at the sync, and the host issues the forward's expert path (per-expert
    quantisation and GEMMs, the launch-bound part of a fine-grained MoE layer) while the device runs that
    backward (the attention node issues the counts' D2H copy, ``fine_grained_callables.py``@core_v0.16.0
    ``submodule_attn_forward``; the wait is in ``submodule_dispatch_forward``; only
    ``moe_router_padding_for_quantization`` moves it before the first permutation, which the Qwen3 recipes leave
    off: Megatron-Bridge ``src/megatron/bridge/recipes/qwen/qwen3_moe.py``@63edb94374). The same schedule share
    that hides the all-to-all (``flex_overlap`` / ``ep_overlap``) hides
    this idle, up to the backward computation it runs beside: ``share x min(host_fwd, other_bwd_compute)``.
    """
    if host_fwd <= 0 or other_bwd_compute <= 0:
        return 0.0
    return ep_overlap_share(dev, dispatcher) * min(host_fwd, other_bwd_compute)


def ep_overlap_share(dev: DeviceSpec, dispatcher: str) -> float:
    """Share of a micro-batch's work that EP-communication overlap runs beside the other micro-batch's: the
    flex dispatcher's (DeepEP/HybridEP) and the all-to-all's schedules hide differently, so each has its term."""
    rt = dev.runtime
    return rt.flex_overlap if dispatcher == "flex" else rt.ep_overlap


def dispatch_time(
    dev: DeviceSpec, dispatcher: str, intra_bytes: float, inter_bytes: float, intra_fraction: float = 1.0
) -> float:
    """One token dispatch (or combine) moving ``intra_bytes`` per rank inside the node and ``inter_bytes``
    across the network, at the device's achieved per-rank bandwidths for that dispatcher.

    Both parts move at once, so the slower sets the time, plus a fixed latency; ``intra_fraction`` scales
    the in-node bandwidth for groups that use only part of a mesh fabric's links.
    """
    if intra_bytes <= 0 and inter_bytes <= 0:
        return 0.0
    rt = dev.runtime
    if dispatcher == "flex":
        bw_in, bw_out = rt.flex_intra_GBps, rt.flex_inter_GBps
    else:
        bw_in, bw_out = rt.a2a_intra_GBps, rt.a2a_inter_GBps
    t_in = intra_bytes / (bw_in * intra_fraction * 1e9)
    t_out = inter_bytes / (bw_out * 1e9)
    return rt.ep_latency_us * 1e-6 + max(t_in, t_out)


def distinct_groups(experts: int, topk: int, groups: int) -> float:
    """Expected number of distinct groups (ranks, nodes) a token's ``topk`` experts fall in, when the
    ``experts`` are spread evenly over ``groups`` and routing is balanced (uniform top-k)."""
    if groups <= 1:
        return 1.0
    per = experts / groups
    miss = 1.0
    for i in range(topk):
        if experts - per - i <= 0:
            return float(groups)
        miss *= (experts - per - i) / (experts - i)
    return groups * (1.0 - miss)


BUS_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "p2p": lambda n: 1.0,
}


#: Collectives NCCL/HCCL run as rings (or trees) whose channels each leave a node once: they add up the NICs of
#: the group's members in a node. All-to-all cannot (every pair talks; nccl-tests#267: one NIC's rate).
RAIL_PRIMITIVES = frozenset({"all_reduce", "all_gather", "reduce_scatter"})


def rail_busbw(dev: DeviceSpec, primitive: str, nbytes: float, rails: int) -> float:
    """Bus bandwidth (GB/s) of a ring collective across nodes whose group has ``rails`` members in each node.

    Every ring channel enters and leaves each node once, through one NIC, and NCCL gives each channel a
    different NIC (rail), so a channel carries ``1/rails`` of the data out of the node: the network side runs
    at ``rails`` NICs, each at the single-NIC table rate for its share. In the node, every member forwards the
    whole buffer over its own links, so the in-node ring rate (on a mesh: the links ``rails`` members use) caps
    it. Measured: 248 nodes x 8 H200, NCCL all-reduce 512 MB at ~350 GB/s busbw, 7.5x one NIC (nccl-tests#283).
    """
    node = dev.devices_per_node
    rails = max(1, min(rails, node))
    inter = rails * dev.busbw(primitive, "inter", nbytes / rails)
    if rails == 1:
        return inter
    intra = dev.busbw(primitive, "intra", nbytes) * dev.intra.group_bandwidth_fraction(rails, node)
    return min(inter, intra)


def collective_time(
    dev: DeviceSpec,
    primitive: str,
    link: str,
    size_bytes: float,
    n: int,
    *,
    table_size: float | None = None,
    bw_fraction: float = 1.0,
    rails: int = 1,
) -> float:
    """nccl-tests convention: ``size_bytes`` is the per-rank buffer ('size'), time = factor*size/busbw.

    ``table_size`` lets callers look the bandwidth up at a different message size (gradient buckets).
    ``bw_fraction`` scales the bandwidth (a mesh group using fewer links than the full node). ``rails``: a
    group spanning nodes with that many members in each node (:func:`rail_busbw`).
    """
    if n <= 1 or size_bytes <= 0:
        return 0.0
    at = table_size if table_size is not None else size_bytes
    if link == "inter" and rails > 1 and primitive in RAIL_PRIMITIVES:
        bw = rail_busbw(dev, primitive, at, rails)
    else:
        bw = dev.busbw(primitive, link, at) * bw_fraction
    return BUS_FACTOR[primitive](n) * size_bytes / (bw * 1e9)
