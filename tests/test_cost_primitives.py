"""Kernel and collective primitives (hapmoe_milp/cost/primitives.py) against hand-computed closed forms.

Every expected value below is derived in the test from first principles (roofline, nccl-tests' bus-bandwidth
convention, link counting on a full mesh) or taken from a published number, never from the code's output.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from hapmoe_milp.cost.model import rails_per_node
from hapmoe_milp.cost.primitives import (
    EXPERT_GEMM_STREAMS,
    attention_time,
    collective_time,
    expert_gemm_time,
    gemm_time,
    memory_time,
    rail_busbw,
    scan_time,
)
from hapmoe_milp.errors import TableRangeError
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs.device import PRIMITIVES, DeviceSpec, IntraNode
from hapmoe_milp.specs.runtime import RuntimeParams
from hapmoe_milp.specs.tables import Table, constant_table

CAT = Catalog(use_calibrated=False)  # the shipped tables these formulas read


def device(
    *,
    peak: float = 100.0,
    fp8: float | None = 200.0,
    gemm_eff: float | Table = 0.5,
    mem_GBps: float = 1000.0,
    mbe: float = 0.5,
    busbw: dict[str, dict[str, float | Table]] | None = None,
    fabric: str = "switch",
) -> DeviceSpec:
    """A device whose tables are constants, so every timing has a closed form."""
    bw = busbw or {link: dict.fromkeys(PRIMITIVES, 100.0) for link in ("intra", "inter")}
    colls = {
        link: {p: (v if isinstance(v, Table) else constant_table(v)) for p, v in prims.items()}
        for link, prims in bw.items()
    }
    peaks = {"bf16": peak} | ({"fp8": fp8} if fp8 else {})
    return DeviceSpec(
        id="syn",
        name="synthetic",
        vendor="test",
        provenance="datasheet+public-benchmarks",
        memory_gib=80.0,
        memory_bandwidth_GBps=mem_GBps,
        peak_tflops=peaks,
        devices_per_node=8,
        intra=IntraNode(fabric, 350.0, 50.0 if fabric == "mesh" else 350.0),
        nic_Gbps=400.0,
        gemm_efficiency=gemm_eff if isinstance(gemm_eff, Table) else constant_table(gemm_eff),
        attention_efficiency=constant_table(0.4),
        attention_bwd_efficiency=constant_table(0.25),
        runtime=RuntimeParams.roofline(memory_efficiency=mbe),
        collectives=colls,
    )


# ------------------------------------------------------------------------------------------------ GEMM roofline
def test_big_gemm_is_compute_bound_flops_over_eff_times_peak():
    d = device()  # 100 TFLOP/s at efficiency 0.5; 1000 GB/s at 0.5
    m = n = k = 8192
    flops = 2 * 8192**3  # 1.0995e12
    t_compute = flops / (0.5 * 100e12)  # 21.99 ms
    t_memory = 2 * (m * k + k * n + m * n) / (0.5 * 1000e9)  # 402.7 MB -> 0.81 ms
    assert t_compute > 10 * t_memory
    assert gemm_time(d, m, n, k) == pytest.approx(t_compute, rel=1e-12)
    assert gemm_time(d, m, n, k) == pytest.approx(0.021990232555, rel=1e-9)


def test_skinny_gemm_is_memory_bound_bytes_over_mbe_times_bandwidth():
    d = device(peak=1000.0)  # fast math, same 1000 GB/s memory at 0.5
    m, n, k = 128, 8192, 8192
    t_compute = 2 * m * n * k / (0.5 * 1000e12)  # 34.4 us
    nbytes = 2 * (m * k + k * n) + 2 * m * n  # bf16 A and B read, bf16 C written: 138.4 MB
    t_memory = nbytes / (0.5 * 1000e9)  # 276.8 us
    assert t_memory > 5 * t_compute
    assert gemm_time(d, m, n, k) == pytest.approx(t_memory, rel=1e-12)
    assert gemm_time(d, m, n, k) == pytest.approx(276.824064e-6, rel=1e-9)


def test_gemm_rows_pad_to_128_row_tiles_below_512_rows():
    d = device(peak=1.0, mem_GBps=1e9)  # everything compute-bound
    n = k = 4096

    def compute(rows: int) -> float:
        return 2 * rows * n * k / (0.5 * 1e12)

    assert gemm_time(d, 1, n, k) == pytest.approx(compute(128), rel=1e-12)
    assert gemm_time(d, 128, n, k) == pytest.approx(compute(128), rel=1e-12)
    assert gemm_time(d, 129, n, k) == pytest.approx(compute(256), rel=1e-12)
    assert gemm_time(d, 511, n, k) == pytest.approx(compute(512), rel=1e-12)
    # from 4 tiles up the kernel is assumed to be efficient at the exact row count
    assert gemm_time(d, 600, n, k) == pytest.approx(compute(600), rel=1e-12)
    # a grouped kernel of g GEMMs costs g of them
    assert gemm_time(d, 129, n, k, groups=8) == pytest.approx(8 * compute(256), rel=1e-12)
    assert gemm_time(d, 0, n, k) == 0.0


def test_fp8_gemm_uses_fp8_peak_and_one_byte_operands():
    big = device(peak=100.0, fp8=200.0)
    assert gemm_time(big, 8192, 8192, 8192, "fp8") == pytest.approx(2 * 8192**3 / (0.5 * 200e12), rel=1e-12)
    skinny = device(peak=1000.0, fp8=2000.0)
    m, n, k = 128, 8192, 8192
    nbytes = 1 * (m * k + k * n) + 2 * m * n  # fp8 inputs, bf16 output
    assert gemm_time(skinny, m, n, k, "fp8") == pytest.approx(nbytes / (0.5 * 1000e9), rel=1e-12)
    # a part without fp8 falls back to its bf16 peak
    no_fp8 = device(peak=100.0, fp8=None)
    assert gemm_time(no_fp8, 8192, 8192, 8192, "fp8") == pytest.approx(2 * 8192**3 / (0.5 * 100e12), rel=1e-12)


def test_gemm_reads_the_efficiency_table_at_the_gemm_flops():
    h100 = CAT.device("h100")
    # 2*m*n*k = 1e12 FLOPs is a sample of the shipped table: eff(1e12) = 0.7869 of 989.4 TFLOP/s
    m, n, k = 5000, 10000, 10000
    assert 2 * m * n * k == 1e12
    assert gemm_time(h100, m, n, k) == pytest.approx(1e12 / (0.7869 * 989.4e12), rel=1e-9)
    # size-dependent: a 1e9-FLOP GEMM runs at a far lower fraction of peak (launch/tail overhead)
    small = gemm_time(h100, 1000, 1000, 500)
    assert small > 1e9 / (0.5 * 989.4e12)


def test_attention_and_memory_kernels():
    d = device()
    assert attention_time(d, 4e12, 4096, backward=False) == pytest.approx(4e12 / (0.4 * 100e12), rel=1e-12)
    assert attention_time(d, 4e12, 4096, backward=True) == pytest.approx(4e12 / (0.25 * 100e12), rel=1e-12)
    assert memory_time(d, 1e9) == pytest.approx(1e9 / (0.5 * 1000e9), rel=1e-12)
    assert memory_time(d, 0) == 0.0 and attention_time(d, 0, 4096, False) == 0.0


# ------------------------------------------------------------------------------------------------ collectives
# nccl-tests PERFORMANCE.md: algbw = S / t and busbw = algbw * factor, so t = factor * S / busbw with
# factor 2(n-1)/n for all-reduce, (n-1)/n for all-gather / reduce-scatter / all-to-all, 1 for send/recv.
@pytest.mark.parametrize(
    ("prim", "factor"),
    [
        ("all_reduce", 2 * 7 / 8),
        ("all_gather", 7 / 8),
        ("reduce_scatter", 7 / 8),
        ("all_to_all", 7 / 8),
        ("p2p", 1.0),
    ],
)
def test_collective_time_uses_nccl_tests_bus_bandwidth_factors(prim, factor):
    d = device()  # busbw 100 GB/s everywhere
    assert collective_time(d, prim, "intra", 1e9, 8) == pytest.approx(factor * 1e9 / 100e9, rel=1e-12)


def test_all_reduce_costs_twice_a_reduce_scatter_at_equal_busbw():
    d = device()
    for n in (2, 4, 8, 64):
        ar = collective_time(d, "all_reduce", "intra", 1e8, n)
        rs = collective_time(d, "reduce_scatter", "intra", 1e8, n)
        assert ar == pytest.approx(2 * rs, rel=1e-12)
        assert rs == pytest.approx((n - 1) / n * 1e8 / 100e9, rel=1e-12)


def test_collective_degenerate_cases_cost_nothing():
    d = device()
    assert collective_time(d, "all_reduce", "intra", 1e9, 1) == 0.0
    assert collective_time(d, "all_to_all", "inter", 0.0, 8) == 0.0


def test_collective_picks_the_link_class_table_and_scales_by_bw_fraction():
    bw = {"intra": dict.fromkeys(PRIMITIVES, 200.0), "inter": dict.fromkeys(PRIMITIVES, 20.0)}
    d = device(busbw=bw)
    intra = collective_time(d, "all_gather", "intra", 1e9, 4)
    inter = collective_time(d, "all_gather", "inter", 1e9, 4)
    assert intra == pytest.approx(0.75 * 1e9 / 200e9, rel=1e-12)
    assert inter == pytest.approx(0.75 * 1e9 / 20e9, rel=1e-12)
    assert collective_time(d, "all_gather", "intra", 1e9, 4, bw_fraction=1 / 7) == pytest.approx(7 * intra, rel=1e-12)


def test_collective_table_size_moves_the_bandwidth_lookup_not_the_bytes():
    ramp = Table((1e6, 1e9), (10.0, 100.0), "clamp")  # busbw rises with message size
    bw = {"intra": dict.fromkeys(PRIMITIVES, ramp), "inter": dict.fromkeys(PRIMITIVES, ramp)}
    d = device(busbw=bw)
    # 1 MB message alone: 10 GB/s; as part of a 1 GB bucket: 100 GB/s for the same bytes
    assert collective_time(d, "reduce_scatter", "intra", 1e6, 2) == pytest.approx(0.5 * 1e6 / 10e9, rel=1e-12)
    assert collective_time(d, "reduce_scatter", "intra", 1e6, 2, table_size=1e9) == pytest.approx(
        0.5 * 1e6 / 100e9, rel=1e-12
    )


# ------------------------------------------------------------------------------------------------ rings across nodes
@pytest.mark.parametrize(
    ("rails", "fabric", "expected"),
    [
        (1, "switch", 20.0),  # one member per node: one NIC
        (4, "switch", 80.0),  # four NICs' worth leaves each node
        (8, "switch", 160.0),  # 8 x 20 < 200 in-node
        (16, "switch", 160.0),  # never more members than the node has
        (2, "mesh", 200.0 * 50.0 / 350.0),  # two members drive one 50 GB/s mesh link of 350: in-node caps it
        (8, "mesh", 160.0),  # the whole mesh: the NICs cap it
    ],
)
def test_ring_across_nodes_adds_the_nics_of_the_members_in_a_node(rails, fabric, expected):
    """NCCL gives every ring channel its own NIC and each channel leaves a node once, so a group with ``rails``
    members per node moves data out at ``rails`` NICs; each member forwards the whole buffer in the node, so the
    in-node ring rate caps it (closed form; measured scale: nccl-tests #283, 8 H200 per node at 7.5 NICs)."""
    bw = {"intra": dict.fromkeys(PRIMITIVES, 200.0), "inter": dict.fromkeys(PRIMITIVES, 20.0)}
    d = device(busbw=bw, fabric=fabric)
    assert rail_busbw(d, "reduce_scatter", 1e9, rails) == pytest.approx(expected, rel=1e-12)
    t = collective_time(d, "all_gather", "inter", 1e9, 64, rails=rails)
    assert t == pytest.approx(63 / 64 * 1e9 / (expected * 1e9), rel=1e-12)


def test_all_to_all_and_intra_links_ignore_rails():
    """All-to-all cannot aggregate NICs (nccl-tests #267); inside a node there is no NIC to add."""
    bw = {"intra": dict.fromkeys(PRIMITIVES, 200.0), "inter": dict.fromkeys(PRIMITIVES, 20.0)}
    d = device(busbw=bw)
    assert collective_time(d, "all_to_all", "inter", 1e9, 64, rails=8) == pytest.approx(63 / 64 * 1e9 / 20e9)
    assert collective_time(d, "all_gather", "intra", 1e9, 8, rails=8) == pytest.approx(7 / 8 * 1e9 / 200e9)


@pytest.mark.parametrize(
    ("n", "span", "expected"),
    [(64, 64, 8), (8, 64, 1), (16, 64, 2), (32, 128, 2), (2, 16, 1), (4, 4, 4), (12, 24, 4)],
)
def test_rails_per_node_counts_group_members_in_each_spanned_node(n, span, expected):
    """DP64 of a TP1 stage on 8 nodes: 8 per node; DP8 of TP8: 1 per node; DP16 of TP4 over 64: 2."""
    assert rails_per_node(n, span, 8) == expected


def test_shipped_h100_all_reduce_busbw_is_in_the_measured_ring_range():
    """nccl-tests #212 / nccl #1455: 8xH100 NVSwitch ring all-reduce busbw 365-370 GB/s for large messages."""
    h100 = CAT.device("h100")
    size = 1 << 30
    t = collective_time(h100, "all_reduce", "intra", size, 8)
    busbw = 2 * 7 / 8 * size / t / 1e9
    assert 360.0 <= busbw <= 371.0


# ------------------------------------------------------------------------------------------------ full-mesh fabrics
@pytest.mark.parametrize("did", ["mi300x", "910b"])
def test_mesh_group_uses_only_its_direct_links(did):
    """MI300X (xGMI) and 910B (HCCS): 8 devices, 7 links each, no switch (hardware.md §3.2-3.3). An n-device
    group inside the node can drive only n-1 of the 7 links."""
    intra = CAT.device(did).intra
    assert intra.fabric == "mesh"
    assert intra.per_device_GBps == pytest.approx(7 * intra.per_pair_GBps, rel=1e-9)
    for n, links in ((2, 1), (4, 3), (7, 6)):
        assert intra.group_bandwidth_fraction(n, 8) == pytest.approx(links / 7, rel=1e-12)
    assert intra.group_bandwidth_fraction(8, 8) == 1.0
    assert intra.group_bandwidth_fraction(16, 8) == 1.0


def test_switch_fabric_gives_every_group_the_full_rate():
    intra = CAT.device("h100").intra
    assert intra.fabric == "switch"
    assert all(intra.group_bandwidth_fraction(n, 8) == 1.0 for n in (2, 4, 8))


def test_partial_mesh_saturates_when_pairs_cover_the_device_bandwidth():
    # V100 hybrid cube-mesh: 150 GB/s per device, 50 per pair -> 3 links saturate the device
    intra = CAT.device("v100").intra
    assert intra.group_bandwidth_fraction(2, 8) == pytest.approx(50 / 150, rel=1e-12)
    assert intra.group_bandwidth_fraction(4, 8) == 1.0


# ------------------------------------------------------------------------------------- routed-expert GEMMs
# Efficiency 0.01 at one small expert GEMM (2*128*1024*1024 FLOPs = 2^28: latency-bound, the fixed cost) and 0.5
# at 2^32 FLOPs; grouped_rows_half = 128 halves a grouped kernel's efficiency at 128 rows per expert. Memory is
# made free (1e12 GB/s) so every time below is FLOPs / (efficiency x 100 TFLOP/s).
_F1 = 2.0 * 128 * 1024 * 1024  # one expert's GEMM, 2^28 FLOPs
_EXPERT_EFF = Table((2.0**28, 2.0**32), (0.01, 0.5))


def _expert_device(vendor: str) -> DeviceSpec:
    d = device(gemm_eff=_EXPERT_EFF, mem_GBps=1e12)
    return replace(d, vendor=vendor, runtime=replace(d.runtime, grouped_rows_half=128.0))


def test_transformer_engine_runs_four_expert_gemm_streams():
    # TransformerEngine common/util/multi_stream.cpp@v2.12 (5671fd3675): num_compute_streams = 4
    assert EXPERT_GEMM_STREAMS == {"nvidia": 4}


@pytest.mark.parametrize(
    ("vendor", "groups", "expected_s"),
    [
        # 16 experts (2^32 FLOPs in all) as one grouped kernel: eff 0.5 x 128/(128+128) = 0.25
        ("huawei", 16, 16 * _F1 / (0.25 * 100e12)),
        # same total work on TE's 4 streams: 4 experts back to back per stream, each at its lone eff 0.01
        ("nvidia", 16, 4 * _F1 / (0.01 * 100e12)),
        # 5 experts: ceil(5 / 4) = 2 on the busiest stream
        ("nvidia", 5, 2 * _F1 / (0.01 * 100e12)),
        # 3 experts fit one wave: one lone GEMM's time
        ("nvidia", 3, 1 * _F1 / (0.01 * 100e12)),
        # one expert is a plain GEMM on either stack (no grouped-rows factor)
        ("nvidia", 1, _F1 / (0.01 * 100e12)),
        ("huawei", 1, _F1 / (0.01 * 100e12)),
    ],
)
def test_expert_gemms_pay_a_lone_gemm_per_stream_wave(vendor: str, groups: int, expected_s: float):
    assert expert_gemm_time(_expert_device(vendor), 128, 1024, 1024, "bf16", groups) == pytest.approx(
        expected_s, rel=1e-12
    )


def test_expert_gemms_on_streams_never_beat_the_grouped_throughput():
    # 4096 rows per expert, 64 experts: total 2^40 FLOPs is off the table, so use a flat 0.5 curve. Grouped:
    # eff 0.5 x 4096/(4096+128); one wave: 16 lone GEMMs at 0.5. Grouped is the slower, so it sets the time.
    d = replace(_expert_device("nvidia"), gemm_efficiency=constant_table(0.5))
    f1 = 2.0 * 4096 * 1024 * 1024
    grouped = 64 * f1 / (0.5 * 4096 / (4096 + 128) * 100e12)
    assert 16 * f1 / (0.5 * 100e12) < grouped
    assert expert_gemm_time(d, 4096, 1024, 1024, "bf16", 64) == pytest.approx(grouped, rel=1e-12)


# ------------------------------------------------------------------------------------------------ tables
def test_table_interpolates_linearly_in_log_x():
    t = Table((1.0, 100.0), (1.0, 3.0))
    assert t(10.0) == pytest.approx(2.0, rel=1e-12)  # log10(10) is halfway between log10(1) and log10(100)
    assert t(10**0.5) == pytest.approx(1.5, rel=1e-12)
    assert t(1.0) == 1.0 and t(100.0) == 3.0
    three = Table((1.0, 10.0, 1000.0), (0.5, 0.6, 0.9))
    assert three(100.0) == pytest.approx(0.75, rel=1e-12)  # halfway between 10 and 1000 in log space


def test_table_refuses_to_extrapolate_unless_told():
    t = Table((1.0, 100.0), (1.0, 3.0), name="tables.demo")
    with pytest.raises(TableRangeError):
        t(0.5)
    with pytest.raises(TableRangeError):
        t(101.0)
    with pytest.raises(TableRangeError):
        t(math.nan)
    c = Table((1.0, 100.0), (1.0, 3.0), "clamp")
    assert c(0.01) == 1.0 and c(1e9) == 3.0


def test_constant_table_is_constant_everywhere():
    c = constant_table(0.7)
    assert all(c(x) == 0.7 for x in (1e-6, 1.0, 1e3, 1e15))


def test_scan_time_is_flops_over_the_kernels_measured_fraction_of_bf16_peak() -> None:
    dev = Catalog(use_calibrated=False).device("b200")
    dev = replace(dev, runtime=dev.runtime.with_values({"ssd_efficiency": 0.04, "gdn_efficiency": 0.03}))
    assert scan_time(dev, 9e12, "ssd") == pytest.approx(9e12 / (0.04 * 2250e12))
    assert scan_time(dev, 9e12, "gdn") == pytest.approx(9e12 / (0.03 * 2250e12))
    assert scan_time(dev, 0.0, "gdn") == 0.0
