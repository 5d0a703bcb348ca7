#!/usr/bin/env python3
"""Derive the shipped device lookup tables from cited anchor numbers.

Every shipped device file (``clusters/devices/<id>.yaml``, provenance ``datasheet+public-benchmarks``) is written
by this script. The script holds, per device, a handful of *anchor* numbers, each tagged with where it came from
(a datasheet or benchmark URL, or an explicit assumption), and turns them into the lookup tables the cost model
reads. To change a number, edit the anchor here and re-run; do not hand-edit the YAML.

Usage::

    python tools/derive_device_tables.py            # (re)write clusters/devices/*.yaml
    python tools/derive_device_tables.py --check    # exit 1 if any file is missing or stale
    python tools/derive_device_tables.py --out DIR  # write elsewhere

Formulas (all anchors and constants below are printed into each file's header and ``assumptions``):

* GEMM efficiency (fraction of the dense BF16 peak, FP16 for V100) for a GEMM of F = 2*m*n*k FLOPs::

      eff(F) = eta * F / (F + eta * peak * t0)

  i.e. time = F / (eta * peak) + t0: a fixed launch/tail overhead t0 plus a large-GEMM rate eta * peak, where eta
  is the measured large-GEMM fraction of peak and t0 = 5 us is an assumption.
* Attention efficiency (flash-attention class forward, causal, head dim 128): piecewise linear in log2(seq) through
  per-device knots (seq, eff), flat outside the knots. Backward = 0.8 x forward (assumption).
* Collective bus bandwidth (nccl-tests busbw convention) for S bytes per rank::

      busbw(S) = B * S / (S + alpha * B * 1e9)        [GB/s]

  i.e. time = alpha + S / (B * 1e9): an alpha-beta model with a large-message busbw B per primitive and link class.
  alpha_intra per device (20 us from H100 NCCL all-reduce at 1-8 MB, 40 us from MI300X RCCL; others assumed 20 us),
  alpha_inter = 20 us (assumption). Inter-node B = factor x NIC GB/s per device, with factor
  0.93 (all-reduce / all-gather / reduce-scatter), 0.85 (all-to-all), 0.90 (p2p).

Output is deterministic (no timestamps, fixed key order, values rounded to 4 significant digits).
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "clusters" / "devices"
SCRIPT = "tools/derive_device_tables.py"

# --------------------------------------------------------------------------------------------- global constants
T0_S = 5e-6  # fixed per-GEMM launch + tail overhead (assumption)
ALPHA_INTRA_S = 20e-6  # intra-node collective latency (derived per device below; this is the H100 figure)
ALPHA_INTER_S = 20e-6  # inter-node collective latency (assumption)
ATTN_BWD_FACTOR = 0.8  # backward attention efficiency relative to forward (assumption)
INTER_FACTOR = {  # large-message busbw as a fraction of the per-device NIC line rate (assumptions)
    "all_reduce": 0.93,
    "all_gather": 0.93,
    "reduce_scatter": 0.93,
    "all_to_all": 0.85,
    "p2p": 0.90,
}
PRIMITIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")

GEMM_X = (1e6, 1e7, 1e8, 3e8, 1e9, 3e9, 1e10, 3e10, 1e11, 3e11, 1e12, 1e13, 1e14)
SEQ_X = tuple(512 * 2**i for i in range(9))  # 512 .. 131072
BYTES_X = tuple(10.0**e for e in range(3, 11))  # 1 kB .. 10 GB

# --------------------------------------------------------------------------------------------- common sources
TPD = "https://github.com/zzc0721/torch-performance-test-data/blob/main/database.md"
NCCL_PERF = "https://raw.githubusercontent.com/NVIDIA/nccl-tests/master/doc/PERFORMANCE.md"
LIMULIDAE = "https://github.com/gameofdimension/limulidae"
HETERMOE = "https://arxiv.org/abs/2504.03871"
RTX_PCIE_NCCL = "https://github.com/NVIDIA/nccl/issues/1639"
AMD_XGMI_BLOG = "https://rocm.blogs.amd.com/software-tools-optimization/mi300x-rccl-xgmi/README.html"
AZURE_H100 = "https://github.com/Azure/AI-benchmarking-guide/blob/8fd0c6e1bd/Azure_Results/ND_H100_v5_results.md"
AZURE_MI300X = (
    "https://github.com/samuel-bohman/AI-benchmarking-guide/blob/3de0c294fd/Azure_Results/ND_MI300X_v5_results.md"
)
DEEPEP = "https://github.com/deepseek-ai/DeepEP/blob/dd758caf45/docs/legacy.md"
HYBRID_EP = "https://github.com/deepseek-ai/DeepEP/blob/94a9f8f6b1/docs/README_Hybrid-EP.md"
MORI = "https://github.com/ROCm/mori/blob/05bb5f4048/README.md"
GROUPED_GEMM_PR = "https://github.com/tgale96/grouped_gemm/pull/37"
MAMF = "https://github.com/stas00/ml-engineering/blob/744d01e18b/compute/accelerator/README.md"
# Mamba-2 SSD forward timings (mamba_ssm's Triton mamba_chunk_scan_combined and its vLLM / TensorRT-LLM copies);
# bench/calibration/microbenchmarks.yaml rows h100-ssd-*, b200-ssd-*
SSD_VLLM = "https://github.com/vllm-project/vllm/pull/27299"
GDN_AIC = (
    "https://github.com/ai-dynamo/aiconfigurator/blob/095f58a51c4ca8e61b66ec108d86f223f8d559ce/aic-core/src/"
    "aiconfigurator_core/systems/data/{gpu}/linear_attention/trtllm/1.3.0rc20/gdn_perf.parquet"
)
SSD_AIC = (
    "https://github.com/ai-dynamo/aiconfigurator/blob/4c5709ac66b6a30c4369dfe5ec838a94fc101840/aic-core/src/"
    "aiconfigurator_core/systems/data/b200_sxm/linear_attention/trtllm/1.3.0rc15/mamba2_perf.parquet"
)
MBRIDGE_DISPATCH = (
    "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/190603a831/skills/nemo-mbridge-perf-moe-dispatcher-selection/"
    "SKILL.md"
)


# --------------------------------------------------------------------------------------------- anchors
@dataclass(frozen=True)
class A:
    """An anchor: a number and where it came from.

    kind: ``source`` (read off a datasheet / benchmark), ``derived`` (computed from sourced numbers) or
    ``assumed`` (a modelling choice). ``derived`` and ``assumed`` anchors are listed under ``assumptions``.
    """

    value: float
    kind: str
    basis: str


def src(value: float, basis: str) -> A:
    return A(value, "source", basis)


def der(value: float, basis: str) -> A:
    return A(value, "derived", basis)


def asm(value: float, basis: str) -> A:
    return A(value, "assumed", basis)


@dataclass(frozen=True)
class Device:
    id: str
    name: str
    vendor: str
    sources: tuple[str, ...]
    confidence: str
    notes: str
    memory_gib: A
    memory_bandwidth_GBps: A
    peaks: dict[str, float]  # dense TFLOP/s
    peak_basis: A  # value = the planning peak (bf16, or fp16 on V100)
    fabric: str
    tech: str
    per_device_GBps: A
    per_pair_GBps: A
    nic_Gbps: A
    eta_gemm: A
    attn_knots: tuple[tuple[int, float], ...]
    attn_basis: str
    memory_bound_efficiency: A
    intra_busbw: dict[str, A]
    devices_per_node: A = field(default_factory=lambda: src(8, "8 devices per node (HGX/OAM/Atlas baseboard)"))
    extra_assumptions: tuple[str, ...] = ()
    runtime: dict[str, A] = field(default_factory=dict)  # overrides of default_runtime() with sourced anchors
    alpha_intra: A = field(
        default_factory=lambda: der(
            ALPHA_INTRA_S,
            "intra-node collective latency as H100's: 8-GPU NCCL all-reduce busbw 43.7 GB/s at 1 MB and 172 GB/s at "
            f"8 MB with a 370 GB/s ring bandwidth give alpha = 20-26 us ({AZURE_H100}; calibration rows 36-37)",
        )
    )


# ----------------------------------------------------------------------------- shared anchor builders
HOPPER_ATTN = (
    ((512, 0.30), (8192, 0.55)),
    "assumed: Hopper flash-attention (FA3 / cuDNN class) forward rises from ~0.30 of dense peak at 512 tokens to "
    "~0.55 at >= 8K tokens; no per-length public measurement is cited",
)
AMPERE_FA2_ATTN = (
    ((512, 0.35), (8192, 0.65)),
    "assumed: FlashAttention-2 on A100-class (GA100) forward rises from ~0.35 of dense peak at 512 tokens to "
    "~0.65 at >= 8K tokens",
)
# 910B2 torch_npu fused attention, forward, non-causal, batch 1, one head, head dim 128, FP16, S0 = S1 = seq:
# utilization of ~354 TFLOP/s (the peak used here, 353.9) 27.5% / 34.7% / 42.6% at 8K / 16K / 32K (PTO910B below).
PTO910B = (
    "https://github.com/hw-native-sys/pto-isa/blob/9e050352009a4529c3749faa02cbd698d2c26691/"
    "kernels/manual/common/flash_atten/README.md"
)
ASCEND_910B_ATTN = (
    ((512, 0.165), (8192, 0.275), (16384, 0.347), (32768, 0.426)),
    "derived at 8K / 16K / 32K: torch_npu fused attention on 910B2 (forward, non-causal, batch 1, one head, head "
    f"dim 128, FP16) at 27.5% / 34.7% / 42.6% of ~354 TFLOP/s ({PTO910B}, section '910B2 Multi-Core Comparison'; "
    "bench/calibration/microbenchmarks.yaml rows 910b-fa-fwd-*) taken as the causal training kernel's fraction of "
    "peak (the op is not named there and may be the inference kernel; one head leaves the last wave of the 24 cores "
    "part-empty, so multi-head training shapes may run faster); flat above 32K (assumed: not measured). Below 8K "
    "assumed: the earlier assumed shape (0.6x the 8K value at 512 tokens, linear in log2(seq)) scaled to the derived "
    "8K value; the same table's 1K-4K numbers (2.6% / 8.6% / 20.5%) are single-head lower bounds only, and the "
    "curve lies above them",
)
GA10X_ADA_ATTN = (
    ((512, 0.30), (8192, 0.55)),
    "assumed: FlashAttention-2 on GA10x / Ada PCIe parts forward rises from ~0.30 of dense peak at 512 tokens to "
    "~0.55 at >= 8K tokens",
)


def switch_intra(per_device: float, ar: A, *, ag: A | None = None, a2a: A | None = None) -> dict[str, A]:
    """NVSwitch parts: busbw anchors. Defaults are assumptions stated per primitive."""
    ag = ag or asm(
        0.85 * per_device, f"assumed: all-gather busbw = 0.85 x {per_device:g} GB/s unidirectional per-device NVLink"
    )
    return {
        "all_reduce": ar,
        "all_gather": ag,
        "reduce_scatter": A(ag.value, ag.kind, ag.basis.replace("all-gather", "reduce-scatter")),
        "all_to_all": a2a
        or asm(0.8 * per_device, f"assumed: all-to-all busbw = 0.8 x {per_device:g} GB/s per-device NVLink"),
        "p2p": asm(
            0.9 * per_device,
            f"assumed: p2p = 0.9 x {per_device:g} GB/s per-pair (NVSwitch gives one pair the full per-device rate)",
        ),
    }


def pcie_intra() -> dict[str, A]:
    basis = (
        "assumed: PCIe Gen4 server without NVLink, collectives bounded by the PCIe switch / host path at ~20 GB/s "
        f"busbw (8x RTX 5090 PCIe all-reduce measured 28 GB/s, {RTX_PCIE_NCCL}; A40/L40S servers assumed lower)"
    )
    out = {p: asm(20.0, basis) for p in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")}
    out["p2p"] = asm(20.0, "assumed: p2p = 0.8 x 25 GB/s assumed PCIe peer-to-peer rate")
    return out


# --------------------------------------------------------------------------------------------- the devices
def _v100_attn_64k(a40_peak: float, a40_eff_64k: float, v100_peak: float, ratio: float) -> float:
    """V100 forward attention efficiency at 64K such that A40 is ``ratio`` x faster (HeterMoE Fig. 2)."""
    return a40_peak * a40_eff_64k / (v100_peak * ratio)


def _knot_eval(knots: Sequence[tuple[int, float]], s: float) -> float:
    """Piecewise linear in log2(s) through the knots, flat outside them."""
    if s <= knots[0][0]:
        return knots[0][1]
    if s >= knots[-1][0]:
        return knots[-1][1]
    for (s0, y0), (s1, y1) in itertools.pairwise(knots):
        if s0 <= s <= s1:
            w = (math.log2(s) - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
            return y0 + w * (y1 - y0)
    raise AssertionError("unreachable")


A40_PEAK = 149.7
V100_PEAK = 125.0
HETERMOE_ATTN_RATIO_64K = 3.7
V100_ATTN_64K = _v100_attn_64k(A40_PEAK, _knot_eval(GA10X_ADA_ATTN[0], 65536), V100_PEAK, HETERMOE_ATTN_RATIO_64K)
# Continue the 2K -> 64K log-slope one more octave to 128K.
V100_ATTN_128K = V100_ATTN_64K - (0.20 - V100_ATTN_64K) / 5.0
V100_ATTN_KNOTS = ((512, 0.20), (2048, 0.20), (65536, round(V100_ATTN_64K, 4)), (131072, round(V100_ATTN_128K, 4)))


def devices() -> list[Device]:
    devs: list[Device] = []

    # ----------------------------------------------------------------- NVIDIA H100
    devs.append(
        Device(
            id="h100",
            name="NVIDIA H100-SXM5-80GB",
            vendor="nvidia",
            sources=(
                "https://www.nvidia.com/en-us/data-center/h100/",
                "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
                TPD,
                "https://github.com/NVIDIA/nccl-tests/issues/212",
                "https://github.com/NVIDIA/nccl/issues/1455",
                "https://github.com/NVIDIA/nccl-tests/issues/290",
                NCCL_PERF,
            ),
            confidence="high for peaks, memory and NVLink; medium for the derived size-dependent tables",
            notes=(
                "HGX/DGX H100 8-GPU node, NVSwitch gen3, one 400 Gb/s NDR NIC per GPU. NVLS (in-switch reduction) "
                "all-reduce reaches ~476-480 GB/s busbw; the table uses the ring figure (365-370) because NVLS "
                "availability depends on NCCL version and group shape."
            ),
            memory_gib=asm(79.6, "assumed: ~79.6 GiB visible of 80 GB HBM3 (typical nvidia-smi value, approximate)"),
            memory_bandwidth_GBps=src(3350, "3.35 TB/s HBM3, NVIDIA H100 SXM datasheet"),
            peaks={"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
            peak_basis=der(989.4, "dense peak = half of the 2:4-sparse datasheet headline (1979 BF16, 3958 FP8)"),
            fabric="switch",
            tech="NVLink 4.0 + NVSwitch gen3, 18 links, 900 GB/s bidirectional = 450 GB/s per direction",
            per_device_GBps=src(450, "450 GB/s per direction (900 GB/s bidirectional NVLink 4)"),
            per_pair_GBps=der(450, "NVSwitch: one pair can use the full per-device rate"),
            nic_Gbps=src(400, "one 400 Gb/s NDR InfiniBand (ConnectX-7) per GPU, DGX/HGX H100 reference design"),
            eta_gemm=src(0.79, f"large BF16 GEMM 783.7-789.2 TFLOP/s = 0.79-0.80 of 989.4 ({TPD})"),
            attn_knots=HOPPER_ATTN[0],
            attn_basis=HOPPER_ATTN[1],
            memory_bound_efficiency=der(
                0.87, f"STREAM Copy 2.90 TB/s of 3.35 TB/s on Azure ND H100 v5 ({AZURE_H100}; calibration row 82)"
            ),
            intra_busbw=switch_intra(
                450,
                src(370, "8-GPU ring all-reduce busbw 365-370 GB/s (nccl-tests #212, nccl #1455)"),
            ),
            runtime={
                "ssd_efficiency": der(
                    0.134,
                    f"Mamba-2 SSD forward (vLLM's copy of mamba_ssm's Triton mamba_chunk_scan_combined) on one H100: "
                    f"1.262e7 tokens/s at 8192 tokens, 128 heads of dim 64, 1 group, state 128 ({SSD_VLLM}, "
                    "microbenchmark table 'Original', 2025-10-25); at chunk 256 (the model config the PR's second table "
                    "matches) 2 x scan_macs = 10.49 MFLOP per token, 132 TFLOP/s = 0.134 of 989.4",
                ),
                "gdn_efficiency": der(
                    0.0582,
                    "gated DeltaNet's chunked delta rule forward (TensorRT-LLM 1.3.0rc20's copy of flash-linear-attention's "
                    "Triton chunk_gated_delta_rule) on H100 at Qwen3-Next's shape (16 key heads, 32 value heads, dims 128, "
                    f"chunk 64), batch 2 x 8192: 1.0446 ms ({GDN_AIC.format(gpu='h100_sxm')}, Qwen3.5-35B-A3B rows); 2 x "
                    "scan_macs = 3.67 MFLOP per token, 57.6 TFLOP/s = 0.0582 of 989.4",
                ),
                "fp8_gemm_scale": der(
                    0.88,
                    f"maximum achievable matmul on H100 SXM: FP8 70.9% vs BF16 80.3% of peak ({MAMF}; rows 54, 60)",
                ),
                "flex_inter_GBps": der(
                    48.0,
                    f"HybridEP on H100 + IB at 16 ranks: BF16 dispatch 57.7, combine 57.0 GB/s algorithm bandwidth "
                    f"({HYBRID_EP}; calibration rows 16-18); with two nodes nearly every token crosses once, so this "
                    "is one 400G NIC's ~48 GB/s (nccl-tests #267)",
                ),
            },
        )
    )

    # ----------------------------------------------------------------- NVIDIA H800
    devs.append(
        Device(
            id="h800",
            name="NVIDIA H800-SXM5-80GB",
            vendor="nvidia",
            sources=(
                "https://arxiv.org/abs/2412.19437",
                "https://arxiv.org/abs/2505.09343",
                "https://github.com/deepseek-ai/DeepEP/blob/main/docs/legacy.md",
                "https://github.com/NVIDIA/nccl/issues/1374",
                "https://www.nvidia.com/en-us/data-center/h100/",
                TPD,
                NCCL_PERF,
            ),
            confidence="high for compute, memory, NVLink cap and NIC (DeepSeek cluster); medium for tables",
            notes=(
                "China export variant of H100: same compute and HBM, NVLink capped at 400 GB/s bidirectional, FP64 "
                "cut. DeepSeek reports ~160 GB/s effective NVLink and ~50 GB/s per 400G IB NIC. 8-GPU all-reduce "
                "215 GB/s busbw was reported (likely NVLS, above the 200 GB/s link rate); the table uses a 0.8 x "
                "200 ring assumption instead."
            ),
            memory_gib=asm(79.6, "assumed: ~79.6 GiB visible of 80 GB HBM3 (as H100; approximate)"),
            memory_bandwidth_GBps=src(3350, "3.35 TB/s HBM3 (same memory system as H100 SXM)"),
            peaks={"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
            peak_basis=der(989.4, "dense peak = half of the 2:4-sparse headline; compute identical to H100 SXM"),
            fabric="switch",
            tech="NVLink 4.0 + NVSwitch, capped to 8 links: 400 GB/s bidirectional = 200 GB/s per direction",
            per_device_GBps=src(200, "200 GB/s per direction (400 GB/s bidirectional, export cap)"),
            per_pair_GBps=der(200, "NVSwitch: one pair can use the full per-device rate"),
            nic_Gbps=src(400, "one 400 Gb/s CX7 InfiniBand NIC per GPU (DeepSeek-V3 cluster, DeepEP docs)"),
            eta_gemm=asm(0.79, f"assumed equal to H100 SXM (0.79-0.80 measured, {TPD}); no public H800 number"),
            attn_knots=HOPPER_ATTN[0],
            attn_basis=HOPPER_ATTN[1],
            memory_bound_efficiency=der(
                0.87, f"as H100 (same HBM3 system): STREAM Copy 2.90 of 3.35 TB/s ({AZURE_H100})"
            ),
            runtime={
                "flex_intra_GBps": src(
                    155.0, f"DeepEP normal kernels, intranode EP8: dispatch 153, combine 158 GB/s NVLink ({DEEPEP})"
                ),
                "flex_inter_GBps": src(
                    50.0, f"DeepEP normal kernels, internode EP16/32/64: 43/58/51 GB/s RDMA dispatch ({DEEPEP})"
                ),
            },
            intra_busbw=switch_intra(
                200,
                asm(160, "assumed: ring all-reduce busbw = 0.8 x 200 GB/s (215 measured in nccl #1374 is likely NVLS)"),
                a2a=der(
                    152,
                    "derived: 0.95 x 160 GB/s effective NVLink (DeepEP intranode EP8 dispatch/combine 153/158 GB/s)",
                ),
            ),
        )
    )

    # ----------------------------------------------------------------- NVIDIA H200
    devs.append(
        Device(
            id="h200",
            name="NVIDIA H200-SXM-141GB",
            vendor="nvidia",
            sources=(
                "https://www.nvidia.com/en-us/data-center/h200/",
                TPD,
                "https://github.com/NVIDIA/nccl-tests/issues/272",
                "https://github.com/NVIDIA/nccl-tests/issues/212",
                NCCL_PERF,
            ),
            confidence="high for peaks, memory and NVLink; medium for tables",
            notes=(
                "Same GH100 compute and NVLink as H100 with 141 GB HBM3e at 4.8 TB/s. 8-GPU NVLS all-reduce 475 "
                "GB/s busbw was reported; the table uses the H100 ring figure."
            ),
            memory_gib=asm(140.4, "assumed: ~140.4 GiB visible of 141 GB HBM3e (typical nvidia-smi value)"),
            memory_bandwidth_GBps=src(4800, "4.8 TB/s HBM3e, NVIDIA H200 datasheet"),
            peaks={"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
            peak_basis=der(989.4, "dense peak = half of the 2:4-sparse datasheet headline"),
            fabric="switch",
            tech="NVLink 4.0 + NVSwitch gen3, 900 GB/s bidirectional = 450 GB/s per direction",
            per_device_GBps=src(450, "450 GB/s per direction (900 GB/s bidirectional)"),
            per_pair_GBps=der(450, "NVSwitch: one pair can use the full per-device rate"),
            nic_Gbps=src(400, "one 400 Gb/s NIC per GPU (HGX H200 reference)"),
            eta_gemm=src(0.80, f"large BF16 GEMM 790.3 TFLOP/s = 0.80 of 989.4 ({TPD})"),
            attn_knots=HOPPER_ATTN[0],
            attn_basis=HOPPER_ATTN[1],
            memory_bound_efficiency=asm(0.8, "assumed: elementwise kernels reach 0.8 of HBM bandwidth"),
            intra_busbw=switch_intra(
                450,
                asm(370, "assumed: ring all-reduce busbw as H100 (365-370 GB/s, nccl-tests #212); NVLS 475 not used"),
            ),
        )
    )

    # ----------------------------------------------------------------- NVIDIA A100
    devs.append(
        Device(
            id="a100",
            name="NVIDIA A100-SXM4-80GB",
            vendor="nvidia",
            sources=(
                "https://www.nvidia.com/en-us/data-center/a100/",
                "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf",
                TPD,
                "https://github.com/NVIDIA/nccl-tests/issues/149",
                "https://github.com/FlagOpen/FlagPerf",
                "https://github.com/NVIDIA/nccl/issues/812",
                NCCL_PERF,
            ),
            confidence="high for peaks, memory, NVLink and NIC; medium for tables",
            notes=(
                "DGX/HGX A100 8-GPU node, NVSwitch gen2, one 200 Gb/s HDR NIC per GPU. Multi-node NCCL all-reduce "
                "reaches ~192 GB/s per 8x200G node (0.96 of line rate), consistent with the 0.93 inter factor."
            ),
            memory_gib=src(80.0, "~80.0 GiB visible (reference visible_gib_approx; framework-usable is slightly less)"),
            memory_bandwidth_GBps=src(2039, "2.039 TB/s HBM2e, NVIDIA A100 80GB SXM datasheet"),
            peaks={"bf16": 312.0, "fp16": 312.0},
            peak_basis=src(312.0, "312 TFLOP/s dense BF16/FP16 tensor core, NVIDIA datasheet"),
            fabric="switch",
            tech="NVLink 3.0 + NVSwitch gen2, 12 links, 600 GB/s bidirectional = 300 GB/s per direction",
            per_device_GBps=src(300, "300 GB/s per direction (600 GB/s bidirectional NVLink 3)"),
            per_pair_GBps=der(300, "NVSwitch: one pair can use the full per-device rate"),
            nic_Gbps=src(200, "one 200 Gb/s HDR InfiniBand per GPU (DGX A100)"),
            eta_gemm=src(0.85, f"large BF16 GEMM 264.5 TFLOP/s = 0.848 of 312 on A100-SXM4-80GB ({TPD})"),
            attn_knots=AMPERE_FA2_ATTN[0],
            attn_basis=AMPERE_FA2_ATTN[1],
            memory_bound_efficiency=asm(0.8, "assumed: elementwise kernels reach 0.8 of HBM bandwidth"),
            intra_busbw=switch_intra(
                300,
                der(220, "derived: middle of the measured 8-GPU ring all-reduce busbw range 200-235 GB/s"),
            ),
        )
    )

    # ----------------------------------------------------------------- NVIDIA A800
    devs.append(
        Device(
            id="a800",
            name="NVIDIA A800-SXM4-80GB",
            vendor="nvidia",
            sources=(
                "https://arthurchiao.art/blog/gpu-data-sheets/",
                LIMULIDAE,
                TPD,
                "https://www.nvidia.com/en-us/data-center/a100/",
                NCCL_PERF,
            ),
            confidence="high for compute/memory; medium for the NVLink cap; low for the NIC count per node",
            notes=(
                "China export variant of A100: same compute and HBM, NVLink capped at 400 GB/s bidirectional. "
                "Providers ship 4 or 8 x 200 Gb/s NICs per node; 8 (one per GPU) is assumed here. Collective "
                "anchors come from a torch.distributed benchmark (fp32, algbw converted to busbw)."
            ),
            memory_gib=src(80.0, "~80.0 GiB visible (reference visible_gib_approx, as A100 80GB)"),
            memory_bandwidth_GBps=src(2039, "2.039 TB/s HBM2e (identical to A100 80GB)"),
            peaks={"bf16": 312.0, "fp16": 312.0},
            peak_basis=src(312.0, "312 TFLOP/s dense BF16/FP16 (compute identical to A100)"),
            fabric="switch",
            tech="NVLink 3.0 + NVSwitch, capped to 8 links: 400 GB/s bidirectional = 200 GB/s per direction",
            per_device_GBps=src(200, "200 GB/s per direction (400 GB/s bidirectional, export cap)"),
            per_pair_GBps=der(200, "NVSwitch: one pair can use the full per-device rate"),
            nic_Gbps=asm(200, "assumed: one 200 Gb/s NIC per GPU (providers vary between 4 and 8 per node)"),
            eta_gemm=src(0.85, f"large BF16 GEMM 266.5 TFLOP/s = 0.854 of 312 ({TPD}); limulidae reports 0.92"),
            attn_knots=AMPERE_FA2_ATTN[0],
            attn_basis=AMPERE_FA2_ATTN[1],
            memory_bound_efficiency=asm(0.8, "assumed: elementwise kernels reach 0.8 of HBM bandwidth"),
            intra_busbw={
                "all_reduce": der(156, "derived: 8-GPU all-reduce algbw 89 GB/s x 2*7/8 = 156 busbw (limulidae)"),
                "all_gather": der(151, "derived: 8-GPU all-gather algbw 173 GB/s x 7/8 = 151 busbw (limulidae)"),
                "reduce_scatter": asm(151, "assumed: reduce-scatter busbw equal to the derived all-gather 151"),
                "all_to_all": asm(160, "assumed: all-to-all busbw = 0.8 x 200 GB/s per-device NVLink"),
                "p2p": der(143, "derived: 2-GPU all-reduce busbw 143 GB/s (limulidae) used as the pair rate"),
            },
        )
    )

    # ----------------------------------------------------------------- NVIDIA B200
    devs.append(
        Device(
            id="b200",
            name="NVIDIA B200 (HGX B200, 1000 W)",
            vendor="nvidia",
            sources=(
                "https://www.nvidia.com/en-us/data-center/dgx-b200/",
                "https://www.nvidia.com/en-us/data-center/hgx/",
                "https://www.glennklockwood.com/garden/processors/B200",
                TPD,
                "https://github.com/deepseek-ai/DeepEP/blob/main/README.md",
                NCCL_PERF,
            ),
            confidence="high for dense BF16 and NVLink 5; medium for usable memory; low-medium for tables",
            notes=(
                "HGX/DGX B200 8-GPU node, NVLink 5 + NVSwitch gen4, one 400 Gb/s CX7 per GPU. DeepEP V2 intranode "
                "EP8 reports 726/740 GB/s dispatch/combine, consistent with the 0.8 x 900 all-to-all assumption."
            ),
            memory_gib=src(179, "~179 GiB visible (DGX B200 spec: 180 GB usable of 192 GB HBM3e)"),
            memory_bandwidth_GBps=src(8000, "8 TB/s HBM3e, NVIDIA HGX B200 spec"),
            peaks={"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
            peak_basis=der(2250.0, "dense peak = half of the HGX B200 sparse headline (4.5 PF BF16, 9 PF FP8)"),
            fabric="switch",
            tech="NVLink 5.0 + NVSwitch gen4, 18 links, 1800 GB/s bidirectional = 900 GB/s per direction",
            per_device_GBps=src(900, "900 GB/s per direction (1.8 TB/s bidirectional NVLink 5)"),
            per_pair_GBps=der(900, "NVSwitch: one pair can use the full per-device rate"),
            nic_Gbps=src(400, "one 400 Gb/s ConnectX-7 per GPU (DGX B200)"),
            eta_gemm=src(0.75, f"large BF16 GEMM 1696 TFLOP/s = 0.754 of 2250 (GCP a4-highgpu-8g, {TPD})"),
            attn_knots=HOPPER_ATTN[0],
            attn_basis=(
                "assumed: Blackwell flash-attention forward rises from ~0.30 of dense peak at 512 tokens to a "
                "~0.55 plateau at >= 8K tokens (as Hopper); no per-length public measurement is cited"
            ),
            memory_bound_efficiency=asm(0.8, "assumed: elementwise kernels reach 0.8 of HBM bandwidth"),
            intra_busbw=switch_intra(
                900,
                asm(720, "assumed: ring all-reduce busbw = 0.8 x 900 GB/s per-device NVLink; no public number cited"),
            ),
            runtime={
                "ssd_efficiency": der(
                    0.0371,
                    f"Mamba-2 SSD forward (TensorRT-LLM 1.3.0rc15's copy of mamba_ssm's Triton mamba_chunk_scan_combined) "
                    f"on B200 at Nemotron 3 Nano's shape (64 heads of dim 64, 8 groups, state 128, chunk 128), batch 2 x "
                    f"8192: 0.7209 ms ({SSD_AIC}); 2 x scan_macs = 3.67 MFLOP per token, 83.4 TFLOP/s = 0.0371 of 2250",
                ),
                "gdn_efficiency": der(
                    0.031,
                    "gated DeltaNet's chunked delta rule forward (TensorRT-LLM 1.3.0rc20's copy of flash-linear-attention's "
                    "Triton chunk_gated_delta_rule) on B200 at Qwen3-Next's shape (16 key heads, 32 value heads, dims 128, "
                    f"chunk 64), batch 2 x 8192: 0.8616 ms ({GDN_AIC.format(gpu='b200_sxm')}, Qwen3.5-35B-A3B rows); 2 x "
                    "scan_macs = 3.67 MFLOP per token, 69.8 TFLOP/s = 0.0310 of 2250",
                ),
                "fp8_gemm_scale": der(
                    0.98,
                    f"maximum achievable matmul on B200 SXM: FP8 76.3% vs BF16 77.6% of peak ({MAMF}; rows 55, 61)",
                ),
                "flex_intra_GBps": src(
                    600.0,
                    f"DeepEP on B200 EP8 (48 SMs): BF16 dispatch 646, combine 586 GB/s; HybridEP (16 SMs) 536/531 "
                    f"({HYBRID_EP}; calibration rows 19-21)",
                ),
            },
        )
    )

    # ----------------------------------------------------------------- NVIDIA L40S
    devs.append(
        Device(
            id="l40s",
            name="NVIDIA L40S (48GB, PCIe)",
            vendor="nvidia",
            sources=(
                "https://www.nvidia.com/en-us/data-center/l40s/",
                TPD,
                RTX_PCIE_NCCL,
                HETERMOE,
                NCCL_PERF,
            ),
            confidence="high for peaks and memory; low for node layout, NIC and collectives",
            notes=(
                "PCIe card without NVLink; 8 per node and the network are server-dependent assumptions. "
                "devices_per_node 8 is the catalog default; a 4-GPU server is expressed as a partial node."
            ),
            memory_gib=src(45.0, "~45.0 GiB visible of 48 GB GDDR6 with ECC (reference visible_gib_approx)"),
            memory_bandwidth_GBps=src(864, "864 GB/s GDDR6, NVIDIA L40S datasheet"),
            peaks={"bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
            peak_basis=der(362.05, "dense peak = half of the sparse datasheet headline (733 BF16, 1466 FP8)"),
            fabric="pcie",
            tech="PCIe Gen4 x16 (32 GB/s per direction), peer traffic through PCIe switches or the CPU root complex",
            per_device_GBps=src(32, "PCIe Gen4 x16, ~32 GB/s per direction"),
            per_pair_GBps=asm(25, "assumed: ~25 GB/s peer-to-peer through a PCIe switch / host bridge"),
            nic_Gbps=asm(12.5, "assumed: one 100 Gb/s NIC per 8-GPU node, i.e. 12.5 Gb/s per device"),
            eta_gemm=src(0.74, f"large BF16 GEMM 269.2 TFLOP/s = 0.744 of 362.05 ({TPD})"),
            attn_knots=GA10X_ADA_ATTN[0],
            attn_basis=GA10X_ADA_ATTN[1],
            memory_bound_efficiency=asm(0.8, "assumed: elementwise kernels reach 0.8 of GDDR6 bandwidth"),
            intra_busbw=pcie_intra(),
            devices_per_node=asm(8, "assumed: 8 PCIe cards per server (server-dependent, 4-8 common)"),
        )
    )

    # ----------------------------------------------------------------- NVIDIA A40
    devs.append(
        Device(
            id="a40",
            name="NVIDIA A40 (48GB, PCIe)",
            vendor="nvidia",
            sources=(
                "https://www.nvidia.com/en-us/data-center/a40/",
                HETERMOE,
                TPD,
                RTX_PCIE_NCCL,
                NCCL_PERF,
            ),
            confidence="high for peaks and memory; low for achievable GEMM (proxy), node layout and collectives",
            notes=(
                "PCIe card (GA102); an optional 2-way NVLink bridge (56.25 GB/s per direction) joins pairs but is "
                "not modelled. HeterMoE's on-premise A40 + V100 testbed used 100 Gb/s RoCE."
            ),
            memory_gib=src(45.0, "~45.0 GiB visible of 48 GB GDDR6 with ECC (reference visible_gib_approx)"),
            memory_bandwidth_GBps=src(696, "696 GB/s GDDR6, NVIDIA A40 datasheet"),
            peaks={"bf16": A40_PEAK, "fp16": A40_PEAK},
            peak_basis=der(A40_PEAK, "dense peak = half of the 299.4 TFLOP/s sparse datasheet headline"),
            fabric="pcie",
            tech="PCIe Gen4 x16 (32 GB/s per direction); optional NVLink bridge pairs not modelled",
            per_device_GBps=src(32, "PCIe Gen4 x16, ~32 GB/s per direction"),
            per_pair_GBps=asm(25, "assumed: ~25 GB/s peer-to-peer through a PCIe switch / host bridge"),
            nic_Gbps=asm(12.5, "assumed: one 100 Gb/s RoCE NIC per 8-GPU node (HeterMoE testbed), 12.5 per device"),
            eta_gemm=der(
                0.78,
                f"derived: RTX A6000 (same GA102) measured 123.3 TFLOP/s = 0.80 of 154.8 ({TPD}); A40 runs at "
                "lower clocks/power, so 0.78 is assumed",
            ),
            attn_knots=GA10X_ADA_ATTN[0],
            attn_basis=GA10X_ADA_ATTN[1],
            memory_bound_efficiency=asm(0.8, "assumed: elementwise kernels reach 0.8 of GDDR6 bandwidth"),
            intra_busbw=pcie_intra(),
            devices_per_node=asm(8, "assumed: 8 PCIe cards per server (server-dependent, 4-8 common)"),
        )
    )

    # ----------------------------------------------------------------- NVIDIA V100
    devs.append(
        Device(
            id="v100",
            name="NVIDIA Tesla V100-SXM2-32GB",
            vendor="nvidia",
            sources=(
                "https://images.nvidia.com/content/volta-architecture/pdf/volta-architecture-whitepaper.pdf",
                "https://www.nvidia.com/en-us/data-center/v100/",
                TPD,
                HETERMOE,
                NCCL_PERF,
            ),
            confidence="high for peaks, memory and NVLink; low for collectives (no public NCCL number) and attention",
            notes=(
                "Volta has no BF16 tensor cores: plan V100 in FP16 (with loss scaling); only the FP16 peak is given "
                "and every efficiency is a fraction of it. DGX-1V hybrid cube-mesh: each GPU has 6 NVLink2 links "
                "(25 GB/s per direction each) to 4 peers, so some pairs are two hops apart. No FlashAttention on "
                "sm_70 (memory-efficient attention via xformers); attention efficiency is calibrated to HeterMoE's "
                "A40-vs-V100 attention ratio."
            ),
            memory_gib=asm(31.7, "assumed: ~31.7 GiB visible of 32 GB HBM2 (typical nvidia-smi value, from memory)"),
            memory_bandwidth_GBps=src(900, "900 GB/s HBM2, Volta whitepaper"),
            peaks={"fp16": V100_PEAK},
            peak_basis=src(V100_PEAK, "125 TFLOP/s FP16 tensor core (FP32 accumulate), Volta whitepaper"),
            fabric="mesh",
            tech="NVLink 2.0 hybrid cube-mesh (DGX-1V), 6 links x 25 GB/s per direction, no NVSwitch",
            per_device_GBps=src(150, "6 NVLink2 links x 25 GB/s = 150 GB/s per direction"),
            per_pair_GBps=asm(
                50,
                "assumed: 2 links = 50 GB/s per direction for double-linked neighbours (single-linked neighbours "
                "get 25 and 3 of 7 peers have no direct link)",
            ),
            nic_Gbps=src(50, "DGX-1V: 4 x 100 Gb/s EDR InfiniBand per 8 GPUs = 50 Gb/s per device"),
            eta_gemm=der(0.72, f"derived: middle of large FP16 GEMM measurements 0.68-0.76 of peak ({TPD})"),
            attn_knots=V100_ATTN_KNOTS,
            attn_basis=(
                "derived: flat 0.20 up to 2K tokens (assumed), falling in log2(seq) to "
                f"{V100_ATTN_64K:.4f} at 64K = A40 peak x A40 eff(64K) / (V100 peak x 3.7), so that A40 is 3.7x "
                f"faster on attention at 64K as HeterMoE reports ({HETERMOE}); the same log-slope is continued to 128K"
            ),
            memory_bound_efficiency=asm(0.8, "assumed: elementwise kernels reach 0.8 of HBM bandwidth"),
            intra_busbw={
                "all_reduce": asm(120, "assumed: all-reduce busbw = 0.8 x 150 GB/s (NCCL rings over the cube-mesh)"),
                "all_gather": asm(120, "assumed: all-gather busbw = 0.8 x 150 GB/s"),
                "reduce_scatter": asm(120, "assumed: reduce-scatter busbw = 0.8 x 150 GB/s"),
                "all_to_all": asm(75, "assumed: all-to-all busbw = 0.5 x 150 GB/s (3 of 7 peers are two hops away)"),
                "p2p": asm(45, "assumed: p2p = 0.9 x 50 GB/s assumed per-pair rate"),
            },
        )
    )

    # ----------------------------------------------------------------- Huawei Ascend 910B2
    devs.append(
        Device(
            id="910b",
            name="Huawei Ascend 910B2 (Atlas 800T A2)",
            vendor="huawei",
            sources=(
                "https://e.huawei.com/en/products/computing/ascend/atlas-800t-a2",
                LIMULIDAE,
                "https://github.com/FlagOpen/FlagPerf",
                "https://github.com/zzc0721/torch-performance-test-data",
            ),
            confidence="low-medium for the peak (two inconsistent public sets); medium for memory, HCCS and NIC",
            notes=(
                "Peak 353.9 TFLOP/s is the mechanically derived set (b): 24 AI cores x 8192 FLOP/cycle x 1.8 GHz. "
                "The Atlas 800T A2 vendor sheet quotes 376 TFLOP/s FP16 for the 910B2; state which peak is used when "
                "reporting MFU. HCCS '392 GB/s' is treated as bidirectional (196 per direction, 28 per link per "
                "direction) because measured 2-NPU and 8-NPU busbw are ~64-65% of those figures. Each NPU has its "
                "own 200 GE RoCE port."
            ),
            memory_gib=asm(61.0, "assumed: 61 GiB usable to torch_npu (reference says ~61-62, unsure) of 64 GB HBM2e"),
            memory_bandwidth_GBps=src(1600, "1.6 TB/s HBM2e"),
            peaks={"bf16": 353.9, "fp16": 353.9},
            peak_basis=der(353.9, "derived: 24 AI cores x 8192 FLOP/cycle x 1.8 GHz = 353.9 (vendor sheet: 376)"),
            fabric="mesh",
            tech="HCCS full mesh, 7 links per NPU x 28 GB/s per direction (392 GB/s bidirectional total), no switch",
            per_device_GBps=der(196, "derived: 392 GB/s read as bidirectional -> 196 GB/s per direction"),
            per_pair_GBps=der(28, "derived: one HCCS link per pair, 56 GB/s bidirectional -> 28 per direction"),
            nic_Gbps=src(200, "one integrated 200 GE RoCE port per NPU (Atlas 800T A2)"),
            eta_gemm=src(
                0.86,
                "large BF16 GEMM 304 (FlagPerf 8-card average), 315 (torch benchmark issue), 328 (limulidae) "
                "TFLOP/s = 0.86-0.93 of 353.9; the lowest (0.86) is used",
            ),
            attn_knots=ASCEND_910B_ATTN[0],
            attn_basis=ASCEND_910B_ATTN[1],
            memory_bound_efficiency=asm(0.7, "assumed: elementwise kernels reach 0.7 of HBM bandwidth"),
            intra_busbw={
                "all_reduce": der(126, "derived: 8-NPU all-reduce algbw 72 GB/s x 2*7/8 = 126 busbw (limulidae)"),
                "all_gather": der(130, "derived: 8-NPU all-gather algbw 149 GB/s x 7/8 = 130 busbw (limulidae)"),
                "reduce_scatter": asm(130, "assumed: reduce-scatter busbw equal to the derived all-gather 130"),
                "all_to_all": asm(127.4, "assumed: all-to-all busbw = 0.65 x 196 GB/s (mesh factor)"),
                "p2p": der(18, "derived: 2-NPU all-reduce busbw 18 GB/s (limulidae) = 0.65 x 28 GB/s per link"),
            },
        )
    )

    # ----------------------------------------------------------------- AMD MI300X
    devs.append(
        Device(
            id="mi300x",
            name="AMD Instinct MI300X (192GB)",
            vendor="amd",
            sources=(
                "https://rocm.docs.amd.com/en/latest/conceptual/gpu-arch/mi300.html",
                "https://rocm.docs.amd.com/en/latest/reference/gpu-arch-specs.html",
                AMD_XGMI_BLOG,
                "https://github.com/ROCm/rccl/issues/1210",
            ),
            confidence="high for peaks, memory and links; low for achievable GEMM, attention and RCCL numbers",
            notes=(
                "8 GPUs fully connected by 7 xGMI links, no switch: 64 GB/s raw / ~48 usable per link per "
                "direction, so one pair is capped at one link. No public 8-GPU rccl-tests busbw was found; the "
                "intra anchors are a 0.65 mesh factor on the 336 GB/s usable aggregate. GEMM efficiency 0.50 is "
                "recalled from a Dec-2024 third-party benchmark; newer ROCm may be higher. Calibrate on hardware."
            ),
            memory_gib=src(192.0, "192 GB HBM3 (reference visible_gib_approx 192; framework-usable is slightly less)"),
            memory_bandwidth_GBps=src(5300, "5.3 TB/s HBM3, AMD spec"),
            peaks={"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
            peak_basis=src(1307.4, "1307.4 TFLOP/s dense BF16 (AMD lists dense and sparse separately)"),
            fabric="mesh",
            tech="xGMI full mesh, 7 links x 64 GB/s raw (~48 usable) per direction: 448 raw / 336 usable in total",
            per_device_GBps=der(336, "derived: 7 links x 48 GB/s usable per direction (AMD ROCm xGMI blog)"),
            per_pair_GBps=src(48, "one xGMI link per pair: 64 GB/s raw, ~48 GB/s usable per direction"),
            nic_Gbps=src(400, "one 400 Gb/s NIC per GPU (8 x 400G platform)"),
            eta_gemm=src(
                0.51,
                f"maximum achievable BF16 matmul 668.4 TFLOP/s = 51.4% of 1300 (TunableOp on; {MAMF}; calibration row 57)",
            ),
            attn_knots=((512, 0.25), (8192, 0.40)),
            attn_basis=(
                "assumed: CK flash-attention on MI300X forward rises from ~0.25 of dense peak at 512 tokens to "
                "~0.40 at >= 8K tokens"
            ),
            memory_bound_efficiency=der(
                0.78, f"STREAM Copy 4.11 TB/s of 5.3 TB/s on Azure ND MI300X v5 ({AZURE_MI300X}; calibration row 83)"
            ),
            intra_busbw={
                "all_reduce": src(
                    316.0,
                    f"8-GPU RCCL all-reduce busbw 316.8 GB/s at 8 GB ({AZURE_MI300X}; row 44), 312.9 GB/s at 4 GiB "
                    "(stas00/ml-engineering; row 45)",
                ),
                **{
                    p: asm(300.0, f"assumed: {p.replace('_', '-')} busbw = 0.95 x the measured all-reduce busbw")
                    for p in ("all_gather", "reduce_scatter")
                },
                "all_to_all": asm(0.65 * 336, "assumed: all-to-all busbw = 0.65 x 336 GB/s usable (mesh factor)"),
                "p2p": asm(0.65 * 48, "assumed: p2p = 0.65 x 48 GB/s usable single xGMI link"),
            },
            alpha_intra=der(
                40e-6,
                f"8-GPU RCCL all-reduce busbw 22.4 GB/s at 1 MB and 131.6 GB/s at 8 MB with B = 316 GB/s give alpha = "
                f"37-41 us ({AZURE_MI300X}; rows 41-42)",
            ),
            runtime={
                "flex_intra_GBps": src(315.0, f"MORI-EP EP8 on MI300X: dispatch 307, combine 330 GB/s XGMI ({MORI})"),
                "flex_inter_GBps": src(
                    55.0, f"MORI-EP EP16 on MI300X + CX7: dispatch 63, combine 49 GB/s RDMA ({MORI})"
                ),
            },
        )
    )

    # ----------------------------------------------------------------- optional: NVIDIA H20
    devs.append(
        Device(
            id="h20",
            name="NVIDIA H20 (96GB HBM3)",
            vendor="nvidia",
            sources=(
                TPD,
                "https://github.com/NVIDIA/nccl-tests/issues/367",
                NCCL_PERF,
            ),
            confidence="medium-high for the widely reproduced spec; low for tables",
            notes=(
                "Cut-down Hopper: full NVLink and high HBM bandwidth with ~15% of H100's tensor throughput, so "
                "GEMMs and attention run closer to peak than on H100; the Hopper attention curve is a conservative "
                "assumption."
            ),
            memory_gib=asm(95.6, "assumed: ~95.6 GiB visible of 96 GB HBM3 (approximate)"),
            memory_bandwidth_GBps=src(4000, "4.0 TB/s HBM3 (widely reproduced spec)"),
            peaks={"bf16": 148.0, "fp16": 148.0, "fp8": 296.0},
            peak_basis=src(148.0, "148 TFLOP/s dense BF16 (widely reproduced spec)"),
            fabric="switch",
            tech="NVLink 4.0 + NVSwitch, 900 GB/s bidirectional = 450 GB/s per direction",
            per_device_GBps=src(450, "450 GB/s per direction (900 GB/s bidirectional)"),
            per_pair_GBps=der(450, "NVSwitch: one pair can use the full per-device rate"),
            nic_Gbps=src(400, "8 x 400 Gb/s RoCE/IB per node (nccl-tests #367 H20 cluster)"),
            eta_gemm=src(0.96, f"large BF16 GEMM 141.9 TFLOP/s = 0.959 of 148 ({TPD})"),
            attn_knots=HOPPER_ATTN[0],
            attn_basis=HOPPER_ATTN[1],
            memory_bound_efficiency=asm(0.8, "assumed: elementwise kernels reach 0.8 of HBM bandwidth"),
            intra_busbw=switch_intra(
                450,
                asm(360, "assumed: ring all-reduce busbw = 0.8 x 450 GB/s per-device NVLink; no public number cited"),
            ),
        )
    )

    # ----------------------------------------------------------------- optional: AMD MI325X
    devs.append(
        Device(
            id="mi325x",
            name="AMD Instinct MI325X (256GB)",
            vendor="amd",
            sources=(
                "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html",
                "https://pytorch.org/blog/efficient-moe-pre-training-at-scale-with-torchtitan/",
                AMD_XGMI_BLOG,
            ),
            confidence="high for peaks, memory and links; low for every table (MI300X-like assumptions)",
            notes="Same CDNA3 compute and xGMI mesh as MI300X with 256 GB HBM3E at 6 TB/s; tables copy MI300X's.",
            memory_gib=asm(256.0, "assumed: 256 GiB visible (reference visible_gib_approx 256, unverified)"),
            memory_bandwidth_GBps=src(6000, "6.0 TB/s HBM3E, AMD spec"),
            peaks={"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
            peak_basis=src(1307.4, "1307.4 TFLOP/s dense BF16, AMD spec"),
            fabric="mesh",
            tech="Infinity Fabric xGMI full mesh (as MI300X), 7 links x 64 GB/s raw (~48 usable) per direction",
            per_device_GBps=der(336, "derived: 7 links x 48 GB/s usable per direction (as MI300X)"),
            per_pair_GBps=src(48, "one xGMI link per pair, ~48 GB/s usable per direction"),
            nic_Gbps=src(400, "8 x 400 Gb/s per node"),
            eta_gemm=asm(0.50, "assumed equal to MI300X (0.50, low confidence); no measurement collected"),
            attn_knots=((512, 0.25), (8192, 0.40)),
            attn_basis="assumed: as MI300X, CK flash-attention forward ~0.25 at 512 tokens to ~0.40 at >= 8K",
            memory_bound_efficiency=asm(0.7, "assumed: elementwise kernels reach 0.7 of HBM bandwidth"),
            intra_busbw={
                **{
                    p: asm(0.65 * 336, f"assumed: {p.replace('_', '-')} busbw = 0.65 x 336 GB/s usable (mesh factor)")
                    for p in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
                },
                "p2p": asm(0.65 * 48, "assumed: p2p = 0.65 x 48 GB/s usable single xGMI link"),
            },
        )
    )
    return devs


# --------------------------------------------------------------------------------------------- derivation
def sig(v: float, digits: int = 4) -> float:
    """Round to ``digits`` significant digits (keeps the files short and the output deterministic)."""
    return float(f"{v:.{digits}g}")


def gemm_eff(flops: float, eta: float, peak_tflops: float, t0: float = T0_S) -> float:
    return eta * flops / (flops + eta * peak_tflops * 1e12 * t0)


def busbw(nbytes: float, big_GBps: float, alpha_s: float) -> float:
    return big_GBps * nbytes / (nbytes + alpha_s * big_GBps * 1e9)


class FlowList(list):
    """A list written in YAML flow style ``[a, b, c]``."""


class ExpList(FlowList):
    """A flow-style list of floats all written in exponent form (message sizes, FLOP counts)."""


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _repr_flow(dumper: yaml.SafeDumper, data: FlowList) -> yaml.Node:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)


def _exp_text(v: float) -> str:
    """Exponent form that YAML 1.1 (PyYAML) reads back as a float: 1.0e+06, 8.929e-05."""
    mant, exp = f"{v:.12e}".split("e")
    mant = mant.rstrip("0")
    if mant.endswith("."):
        mant += "0"
    return f"{mant}e{exp}"


def _repr_float(dumper: yaml.SafeDumper, data: float) -> yaml.Node:
    if data != 0 and math.isfinite(data) and (abs(data) >= 1e5 or abs(data) < 1e-3):
        text = _exp_text(data)
    else:
        text = repr(data)
    return dumper.represent_scalar("tag:yaml.org,2002:float", text)


def _repr_exp(dumper: yaml.SafeDumper, data: ExpList) -> yaml.Node:
    items = [yaml.ScalarNode("tag:yaml.org,2002:float", _exp_text(float(v))) for v in data]
    return yaml.SequenceNode("tag:yaml.org,2002:seq", items, flow_style=True)


_Dumper.add_representer(FlowList, _repr_flow)
_Dumper.add_representer(ExpList, _repr_exp)
_Dumper.add_representer(float, _repr_float)


def _table(xs: Sequence[float], ys: Sequence[float], x_unit: str, y_unit: str, note: str) -> dict[str, Any]:
    return {
        "x": FlowList(int(x) for x in xs) if x_unit == "tokens" else ExpList(float(x) for x in xs),
        "y": FlowList(sig(y) for y in ys),
        "extrapolate": "clamp",
        "x_unit": x_unit,
        "y_unit": y_unit,
        "note": note,
    }


def _fmt(v: float) -> str:
    return f"{v:g}"


RUNTIME_NOTE = (
    "named runtime terms (hapmoe_milp/specs/runtime.py): host launch and sync costs, grouped-GEMM and attention "
    "scale factors, achieved HBM fraction, token-dispatch bandwidths per dispatcher and link class, overlap shares"
)


def default_runtime(dev: Device) -> dict[str, A]:
    """Runtime terms from the device's own anchors and stated assumptions (override per device with sources)."""
    nic = dev.nic_Gbps.value / 8.0
    per_dev = dev.per_device_GBps.value
    return {
        "launch_us": der(
            11.0,
            "device idle per kernel in a 16xH100 Megatron-Bridge MoE training profile: 4.20-4.84 s of idle gaps over "
            f"401,840 kernels per step = 10.5-12.0 us ({MBRIDGE_DISPATCH}); taken for every device on the same "
            "software stack until profiled or calibrated",
        ),
        "call_us": asm(
            80.0,
            "assumed: host CPU per eager call, forward or backward, between a plain op's (torch.nn.Linear forward "
            "13.48 us on an x86 DGX H100 host, https://github.com/NVIDIA/TransformerEngine/issues/2053) and a "
            "Megatron-Core Transformer Engine linear's (TEColumnParallelLinear forward 140 us, 115 us after "
            "https://github.com/NVIDIA/TransformerEngine/pull/1191, BF16, TP1); every structural kernel is taken as "
            "a call of that average cost (one expert's GEMM with its set-up inside GroupedLinear included); the same "
            "for every device until profiled or calibrated",
        ),
        "sync_us": asm(50.0, "assumed: device-to-host copy latency plus draining the host's run-ahead queue"),
        "gemm_scale": der(1.0, "1 = the derived gemm_efficiency curve as tabulated"),
        "fp8_gemm_scale": asm(
            0.9,
            f"assumed: FP8 GEMMs reach ~0.9 of BF16's fraction of peak (H100 MAMF 70.9% FP8 vs 80.3% BF16 = 0.88, "
            f"B200 76.3% vs 77.6% = 0.98; {MAMF})",
        ),
        "grouped_rows_half": der(
            512.0,
            "grouped expert GEMM on H100 (128 experts, K=2048, N=1536, 65536 tokens, CUTLASS SM90 cooperative) ran "
            f"at 160.5 TFLOP/s = 0.16 of peak vs 0.79 dense ({GROUPED_GEMM_PR}; calibration rows 71-73); the rows per "
            "expert it implies (128-2000) depend on how its token count is read, so the prior sits in between and "
            "calibration decides",
        ),
        "attention_scale": der(1.0, "1 = the attention efficiency curves as tabulated"),
        "ssd_efficiency": asm(
            0.134,
            "assumed: H100's measured fraction of BF16 peak in Mamba-2's Triton SSD forward (see the h100 table), "
            "until measured on this device",
        ),
        "gdn_efficiency": asm(
            0.0582,
            "assumed: H100's measured fraction of BF16 peak in gated DeltaNet's Triton chunked delta rule (see the "
            "h100 table), until measured on this device",
        ),
        "memory_efficiency": dev.memory_bound_efficiency,
        "a2a_intra_GBps": der(
            dev.intra_busbw["all_to_all"].value, "= the intra-node all-to-all busbw anchor (NCCL all_to_all_single)"
        ),
        "a2a_inter_GBps": der(
            INTER_FACTOR["all_to_all"] * nic,
            f"= {INTER_FACTOR['all_to_all']:g} x NIC GB/s: NCCL all-to-all cannot aggregate NICs, one NIC's rate "
            "(nccl-tests #267)",
        ),
        "flex_intra_GBps": asm(
            0.75 * per_dev,
            f"assumed: DeepEP-class dispatch at 0.75 x {per_dev:g} GB/s per-device scale-up link (DeepEP reaches "
            "153-158 of 200 GB/s on H800, 646 of 900 on B200)",
        ),
        "flex_inter_GBps": asm(
            0.95 * nic, f"assumed: DeepEP-class internode dispatch at 0.95 x {nic:g} GB/s NIC (43-58 GB/s on 50 GB/s)"
        ),
        "ep_latency_us": der(
            40.0,
            f"small-batch (128-token) EP8 dispatch latency 35 us (MORI, {MORI}) to 77 us (DeepEP low-latency, {DEEPEP})",
        ),
        "stack_compute_scale": asm(
            1.0, "assumed: the training stack reaches the micro-benchmarked kernel speed, until calibrated"
        ),
        "ep_overlap": asm(0.5, "assumed: half of EP communication hidden when EP overlap is on, until calibrated"),
        "flex_overlap": asm(
            0.5, "assumed: the same half for the flex dispatcher (DeepEP / HybridEP), until calibrated"
        ),
        "tp_overlap": asm(
            0.5, "assumed: half of TP communication hidden when TP overlap (userbuffers / MC2) is on, until calibrated"
        ),
        "p2p_exposed": asm(1.0, "assumed: pipeline send/receive not hidden (1F1B waits on its batched p2p)"),
        "dp_overlap": asm(1.0, "assumed: gradient reduce-scatter hides behind the whole last backward"),
    }


def build(dev: Device) -> tuple[dict[str, Any], list[str]]:
    """Return (document, header comment lines) for one device."""
    peak = dev.peak_basis.value
    eta = dev.eta_gemm.value
    gemm_y = [gemm_eff(f, eta, peak) for f in GEMM_X]
    attn_y = [_knot_eval(dev.attn_knots, s) for s in SEQ_X]
    attn_b = [ATTN_BWD_FACTOR * y for y in attn_y]
    nic_GBps = dev.nic_Gbps.value / 8.0

    intra: dict[str, Any] = {}
    for p in PRIMITIVES:
        b = dev.intra_busbw[p].value
        intra[p] = _table(
            BYTES_X,
            [busbw(s, b, dev.alpha_intra.value) for s in BYTES_X],
            "bytes",
            "GBps_busbw",
            f"busbw(S) = B*S/(S + alpha*B*1e9), B = {_fmt(sig(b))} GB/s, alpha = {dev.alpha_intra.value * 1e6:g} us",
        )
    inter: dict[str, Any] = {}
    for p in PRIMITIVES:
        b = INTER_FACTOR[p] * nic_GBps
        inter[p] = _table(
            BYTES_X,
            [busbw(s, b, ALPHA_INTER_S) for s in BYTES_X],
            "bytes",
            "GBps_busbw",
            f"busbw(S) = B*S/(S + alpha*B*1e9), B = {INTER_FACTOR[p]:g} x {_fmt(nic_GBps)} GB/s NIC = "
            f"{_fmt(sig(b))} GB/s, alpha = {ALPHA_INTER_S * 1e6:g} us",
        )

    knots_txt = ", ".join(f"({s}, {y:g})" for s, y in dev.attn_knots)
    peak_name = "bf16" if "bf16" in dev.peaks else "fp16"
    tables: dict[str, Any] = {
        "gemm_efficiency": _table(
            GEMM_X,
            gemm_y,
            "flops",
            "fraction_of_peak",
            f"eff(F) = eta*F/(F + eta*peak*t0), eta = {eta:g}, peak = {peak:g} TFLOP/s ({peak_name}), "
            f"t0 = {T0_S * 1e6:g} us",
        ),
        "attention_efficiency": _table(
            SEQ_X,
            attn_y,
            "tokens",
            "fraction_of_peak",
            f"forward, causal, head dim 128; linear in log2(seq) through knots {knots_txt}, flat outside",
        ),
        "attention_bwd_efficiency": _table(
            SEQ_X, attn_b, "tokens", "fraction_of_peak", f"backward = {ATTN_BWD_FACTOR:g} x forward"
        ),
        "collectives": {
            "note": "nccl-tests bus bandwidth (busbw) per rank vs message bytes per rank; inter = same device type",
            "intra": intra,
            "inter": inter,
        },
    }

    peaks: dict[str, Any] = {k: float(v) for k, v in dev.peaks.items()}
    peaks["note"] = "dense (no 2:4 sparsity) tensor-core TFLOP/s; " + dev.peak_basis.basis

    # Assumptions: every derived or assumed anchor plus the global modelling constants.
    assumptions: list[str] = []

    def add(label: str, a: A) -> None:
        if a.kind != "source":
            basis = a.basis.removeprefix(f"{a.kind}: ")
            assumptions.append(f"{label} = {_fmt(sig(a.value))} ({a.kind}): {basis}")

    add("memory_gib", dev.memory_gib)
    add("memory_bandwidth_GBps", dev.memory_bandwidth_GBps)
    add(f"peak_tflops.{peak_name}", dev.peak_basis)
    add("devices_per_node", dev.devices_per_node)
    add("intra_node.per_device_GBps", dev.per_device_GBps)
    add("intra_node.per_pair_GBps", dev.per_pair_GBps)
    add("nic_Gbps", dev.nic_Gbps)
    add("alpha_intra_s", dev.alpha_intra)
    add("eta_gemm (large-GEMM fraction of peak)", dev.eta_gemm)
    runtime = {**default_runtime(dev), **dev.runtime}
    for name, a in runtime.items():
        add(f"runtime.{name}", a)
    for p in PRIMITIVES:
        add(f"intra {p} large-message busbw B", dev.intra_busbw[p])
    assumptions += [
        f"gemm_efficiency is derived: eff(F) = eta*F/(F + eta*peak*t0) with t0 = {T0_S * 1e6:g} us an assumed fixed "
        "launch + tail overhead per GEMM",
        f"attention_efficiency: {dev.attn_basis}",
        f"attention_bwd_efficiency is assumed to be {ATTN_BWD_FACTOR:g} x the forward efficiency",
        "collectives are derived: busbw(S) = B*S/(S + alpha*B*1e9) with latencies alpha_intra = "
        f"{dev.alpha_intra.value * 1e6:g} us (see alpha_intra) and alpha_inter = {ALPHA_INTER_S * 1e6:g} us (assumed)",
        "inter-node large-message busbw is assumed to be a fraction of the per-device NIC line rate (nic_Gbps/8): "
        + ", ".join(f"{p} {f:g}" for p, f in INTER_FACTOR.items())
        + " (0.93 is the H100 NDR per-NIC measurement, nccl-tests #290)",
        *dev.extra_assumptions,
    ]

    doc: dict[str, Any] = {
        "id": dev.id,
        "name": dev.name,
        "vendor": dev.vendor,
        "provenance": "datasheet+public-benchmarks",
        "confidence": dev.confidence,
        "sources": list(dev.sources),
        "notes": dev.notes,
        "memory_gib": float(dev.memory_gib.value),
        "memory_bandwidth_GBps": float(dev.memory_bandwidth_GBps.value),
        "peak_tflops": peaks,
        "devices_per_node": int(dev.devices_per_node.value),
        "intra_node": {
            "fabric": dev.fabric,
            "per_device_GBps": float(sig(dev.per_device_GBps.value)),
            "per_pair_GBps": float(sig(dev.per_pair_GBps.value)),
            "tech": dev.tech,
            "note": "unidirectional GB/s; per_pair = what one pair of devices can use (its direct links on a mesh)",
        },
        "nic_Gbps": float(dev.nic_Gbps.value),
        "assumptions": assumptions,
        "runtime": {"note": RUNTIME_NOTE, **{k: float(sig(a.value)) for k, a in runtime.items()}},
        "tables": tables,
    }

    hdr = [
        f"GENERATED by {SCRIPT} -- do not edit by hand; change the anchors in the script and re-run it.",
        f"Device: {dev.name} ({dev.id}). Provenance: datasheet + public benchmarks; numbers not read directly",
        "from a source are listed under `assumptions`.",
        "",
        "How the tables were derived (anchors -> formula):",
        f"  gemm_efficiency(F) = eta*F / (F + eta*peak*t0); F = 2*m*n*k FLOPs; eta = {eta:g}; "
        f"peak = {peak:g} TFLOP/s ({peak_name}); t0 = {T0_S * 1e6:g} us.",
        f"  attention_efficiency(seq): linear in log2(seq) through {knots_txt}; flat outside.",
        f"  attention_bwd_efficiency = {ATTN_BWD_FACTOR:g} x attention_efficiency.",
        "  collectives busbw(S) = B*S / (S + alpha*B*1e9) GB/s for S bytes per rank;",
        f"    intra (alpha = {dev.alpha_intra.value * 1e6:g} us): "
        + ", ".join(f"{p} B={_fmt(sig(dev.intra_busbw[p].value))}" for p in PRIMITIVES),
        f"    inter (alpha = {ALPHA_INTER_S * 1e6:g} us, NIC {_fmt(dev.nic_Gbps.value)} Gb/s = {_fmt(nic_GBps)} GB/s):",
        "      "
        + ", ".join(f"{p} B={INTER_FACTOR[p]:g}xNIC={_fmt(sig(INTER_FACTOR[p] * nic_GBps))}" for p in PRIMITIVES),
        "  runtime: " + ", ".join(f"{k} = {_fmt(sig(a.value))}" for k, a in runtime.items()) + ".",
        "All tables clamp outside their x range; values rounded to 4 significant digits.",
    ]
    return doc, hdr


def render(dev: Device) -> str:
    doc, hdr = build(dev)
    head = "".join(f"# {line}".rstrip() + "\n" for line in hdr)
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=110, allow_unicode=False, default_flow_style=False)
    return head + body


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default clusters/devices)")
    ap.add_argument("--check", action="store_true", help="only check that the files are up to date")
    args = ap.parse_args(argv)
    stale: list[str] = []
    for dev in devices():
        text = render(dev)
        path = args.out / f"{dev.id}.yaml"
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
            continue
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    if stale:
        print("stale or missing (re-run tools/derive_device_tables.py):\n  " + "\n  ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
