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
    """Seconds for ``groups`` GEMMs of (m x k) @ (k x n), run as one grouped kernel."""
    if m <= 0 or n <= 0 or k <= 0 or groups <= 0:
        return 0.0
    m_pad = math.ceil(m / TILE_ROWS) * TILE_ROWS if m < 4 * TILE_ROWS else m
    flops = 2.0 * m_pad * n * k * groups
    eff = dev.gemm_efficiency(flops)
    t_compute = flops / (eff * dev.peak(precision) * 1e12)
    elem = 1 if precision == "fp8" else BF16
    nbytes = groups * (elem * (m * k + k * n) + BF16 * m * n)
    t_mem = nbytes / (dev.memory_bound_efficiency * dev.memory_bandwidth_GBps * 1e9)
    return max(t_compute, t_mem)


def attention_time(dev: DeviceSpec, flops: float, seq: int, backward: bool) -> float:
    """Flash-style attention core; efficiency from the device's attention tables (BF16)."""
    if flops <= 0:
        return 0.0
    table = dev.attention_bwd_efficiency if backward else dev.attention_efficiency
    return flops / (table(seq) * dev.peak("bf16") * 1e12)


def memory_time(dev: DeviceSpec, nbytes: float) -> float:
    """A memory-bound kernel moving ``nbytes`` (reads + writes)."""
    if nbytes <= 0:
        return 0.0
    return nbytes / (dev.memory_bound_efficiency * dev.memory_bandwidth_GBps * 1e9)


BUS_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "p2p": lambda n: 1.0,
}


def collective_time(
    dev: DeviceSpec,
    primitive: str,
    link: str,
    size_bytes: float,
    n: int,
    *,
    table_size: float | None = None,
    bw_fraction: float = 1.0,
) -> float:
    """nccl-tests convention: ``size_bytes`` is the per-rank buffer ('size'), time = factor*size/busbw.

    ``table_size`` lets callers look the bandwidth up at a different message size (gradient buckets).
    ``bw_fraction`` scales the bandwidth (a mesh group using fewer links than the full node).
    """
    if n <= 1 or size_bytes <= 0:
        return 0.0
    bw = dev.busbw(primitive, link, table_size if table_size is not None else size_bytes) * bw_fraction
    return BUS_FACTOR[primitive](n) * size_bytes / (bw * 1e9)
