"""Dense tensor-core peaks: a small datasheet table keyed by the runtime's device name, and the choice of
the peak a profile's efficiencies are fractions of (the user's, else the datasheet's, else the best GEMM
measured -- always written down in ``assumptions``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KnownPeak:
    """Dense (no 2:4 sparsity) tensor-core peak of a part, matched on the runtime's device name."""

    pattern: str
    label: str
    bf16: float | None
    fp16: float
    fp8: float | None
    source: str
    shipped_id: str | None = None


NV_DATASHEET = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
NV_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
NV_B200 = "https://www.nvidia.com/en-us/data-center/dgx-b200/"
NV_A100 = "https://www.nvidia.com/en-us/data-center/a100/"
NV_L40S = "https://www.nvidia.com/en-us/data-center/l40s/"
NV_A40 = "https://www.nvidia.com/en-us/data-center/a40/"
NV_VOLTA = "https://images.nvidia.com/content/volta-architecture/pdf/volta-architecture-whitepaper.pdf"
H20_SRC = "https://github.com/zzc0721/torch-performance-test-data/blob/main/database.md"
AMD_MI300X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"
AMD_MI325X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html"
ASCEND_A2 = "https://e.huawei.com/en/products/computing/ascend/atlas-800t-a2"
# Order matters: the first match wins, so PCIe/NVL variants come before the SXM parts they contain.
KNOWN_PEAKS: tuple[KnownPeak, ...] = (
    KnownPeak(r"\bH100\b.*PCIe", "H100 PCIe", 756.5, 756.5, 1513.0, NV_DATASHEET),
    KnownPeak(r"\bH100\b.*NVL", "H100 NVL", 835.5, 835.5, 1670.5, NV_DATASHEET),
    KnownPeak(r"\bH100\b", "H100 SXM5", 989.4, 989.4, 1978.9, NV_DATASHEET, "h100"),
    KnownPeak(r"\bH800\b(?!.*PCIe)", "H800 SXM5", 989.4, 989.4, 1978.9, NV_DATASHEET, "h800"),
    KnownPeak(r"\bH200\b(?!.*NVL)", "H200 SXM", 989.4, 989.4, 1978.9, NV_H200, "h200"),
    KnownPeak(r"\bH20\b", "H20", 148.0, 148.0, 296.0, H20_SRC, "h20"),
    KnownPeak(r"\bB200\b", "B200", 2250.0, 2250.0, 4500.0, NV_B200, "b200"),
    KnownPeak(r"\bA100\b", "A100", 312.0, 312.0, None, NV_A100, "a100"),
    KnownPeak(r"\bA800\b", "A800", 312.0, 312.0, None, NV_A100, "a800"),
    KnownPeak(r"\bL40S\b", "L40S", 362.05, 362.05, 733.0, NV_L40S, "l40s"),
    KnownPeak(r"\bA40\b", "A40", 149.7, 149.7, None, NV_A40, "a40"),
    KnownPeak(r"V100-SXM2", "V100 SXM2", None, 125.0, None, NV_VOLTA, "v100"),
    KnownPeak(r"\bMI300X\b", "MI300X", 1307.4, 1307.4, 2614.9, AMD_MI300X, "mi300x"),
    KnownPeak(r"\bMI325X\b", "MI325X", 1307.4, 1307.4, 2614.9, AMD_MI325X, "mi325x"),
    KnownPeak(r"910B2", "Ascend 910B2", 353.9, 353.9, None, ASCEND_A2, "910b"),
)  # fmt: skip


def known_peak(hardware_name: str) -> KnownPeak | None:
    """Datasheet dense peak for a runtime device name (``torch.cuda.get_device_name``), or None."""
    for kp in KNOWN_PEAKS:
        if re.search(kp.pattern, hardware_name, flags=re.IGNORECASE):
            return kp
    return None


def choose_peak(
    gemm: list[dict[str, Any]],
    kind: str,
    hardware: str,
    dname: str,
    kp: KnownPeak | None,
    peak_tflops: float | None,
    assumptions: list[str],
    notes: list[str],
) -> tuple[float, str, dict[str, float], list[str]]:
    """(peak, its basis, the ``peak_tflops`` block, sources) for a profile measured in ``dname``."""
    best = max(p["tflops"] for p in gemm)
    sources: list[str] = []
    peaks: dict[str, float] = {}
    if peak_tflops is not None:
        peak, basis = float(peak_tflops), "user"
        assumptions.append(f"peak_tflops.{dname} = {peak:g}: given by the user (--peak-tflops)")
    elif kp is not None and (kp.bf16 if dname == "bf16" else kp.fp16 if dname == "fp16" else None):
        peak = float(kp.bf16 if dname == "bf16" else kp.fp16)  # type: ignore[arg-type]
        basis = "datasheet"
        sources.append(kp.source)
        if kp.fp8 is not None:
            peaks["fp8"] = kp.fp8
            assumptions.append(
                f"peak_tflops.fp8 = {kp.fp8:g} (datasheet, {kp.label}); not measured: the cost model applies the "
                f"{dname} gemm_efficiency to it"
            )
        assumptions.append(
            f"peak_tflops.{dname} = {peak:g}: datasheet dense peak of {kp.label} matched on {hardware!r}"
        )
    else:
        peak, basis = best, "measured-best"
        why = (
            "the CPU has no published tensor peak"
            if kind == "cpu"
            else f"{hardware!r} is not in the built-in peak table"
        )
        assumptions.append(
            f"peak_tflops.{dname} = {peak:.4g}: the best {dname} GEMM throughput measured here ({why}); efficiencies "
            "are fractions of it, so the largest GEMM reads 1.0 -- pass --peak-tflops to use a datasheet peak"
        )
    peaks[dname if dname != "fp32" else "bf16"] = peak
    if dname == "fp32":
        assumptions.append("GEMMs were timed in fp32 and recorded under the bf16 key (the cost model's precision)")
    if best > peak * 1.0001:
        notes.append(
            f"best measured GEMM {best:.4g} TFLOP/s exceeds the {basis} peak {peak:.4g} (boost clocks?); "
            "table efficiencies are capped at 1.0"
        )
    return peak, basis, peaks, sources
