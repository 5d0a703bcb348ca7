"""Named runtime terms of a device table: what real kernels and frameworks cost beyond a roofline.

A roofline over peak FLOP/s and bandwidth misses what dominates fine-grained MoE training at short
sequences: the host issuing hundreds of small kernels per layer, the dropless router's device-to-host
sync, grouped GEMMs whose per-expert blocks are too short to fill the tensor cores, all-to-alls far below
link rate, and overlap that is partial. Each such effect is one parameter here, with a unit, a physical
range and a one-line meaning. The device table's ``runtime:`` section sets them; the profiler measures
them (``hapmoe-milp profile``) and ``hapmoe-milp calibrate`` fits them to measured runs inside their
ranges. The cost model (:mod:`hapmoe_milp.cost`) is the only reader.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from hapmoe_milp.specs._fields import Fields


@dataclass(frozen=True)
class ParamInfo:
    """Meaning and physical range of one runtime parameter (``lo <= value <= hi``)."""

    name: str
    unit: str
    lo: float
    hi: float
    meaning: str


#: The parameters, their units and physical ranges. Ranges are deliberately wide (what any current
#: accelerator/host/framework combination could plausibly show), so a fit that hits one is a finding.
PARAMS: tuple[ParamInfo, ...] = (
    ParamInfo(
        "launch_us",
        "us",
        1.0,
        50.0,
        "average device idle per kernel launch: the launch latency the host's run-ahead does not hide (dependent "
        "small ops, stream waits and syncs empty the queue); paid per kernel, per layer and micro-batch",
    ),
    ParamInfo(
        "call_us",
        "us",
        1.0,
        1000.0,
        "host CPU time per call the host makes eagerly (a framework op, or one expert's GEMM with its set-up "
        "inside a grouped linear), forward or backward: when a layer's calls take longer than the device takes "
        "to run what they issue, the host sets the pace and the excess is device idle",
    ),
    ParamInfo(
        "sync_us",
        "us",
        2.0,
        2000.0,
        "exposed cost of one device-to-host synchronisation (the dropless router's token counts): the host waits "
        "for the queue to drain and the copy, then the device idles until the next launch",
    ),
    ParamInfo(
        "gemm_scale",
        "x",
        0.3,
        1.25,
        "achieved / tabulated efficiency of dense GEMMs (1 = the table's curve as derived or profiled)",
    ),
    ParamInfo(
        "fp8_gemm_scale",
        "x",
        0.3,
        1.2,
        "FP8 GEMMs' efficiency (fraction of the FP8 peak) relative to BF16 GEMMs' at the same size (quantisation "
        "epilogues, scaling)",
    ),
    ParamInfo(
        "grouped_rows_half",
        "rows",
        1.0,
        8192.0,
        "rows per expert at which a grouped expert GEMM runs at half the efficiency of a dense GEMM of the "
        "same per-expert work (tile padding, load imbalance between SMs, per-group setup)",
    ),
    ParamInfo(
        "stack_compute_scale",
        "fraction",
        0.5,
        1.0,
        "achieved / micro-benchmarked speed of the compute kernels under the training software stack (library "
        "versions, unfused elementwise ops, heuristics for the model's shapes); 1 = as fast as the kernel "
        "micro-benchmarks, which are the best the hardware reaches, so it never exceeds 1",
    ),
    ParamInfo(
        "attention_scale",
        "x",
        0.2,
        1.6,
        "achieved / tabulated efficiency of the fused attention kernels",
    ),
    ParamInfo(
        "ssd_efficiency",
        "fraction",
        0.005,
        0.9,
        "achieved fraction of the dense BF16 peak of Mamba-2's chunked SSD scan kernels (mamba_ssm's Triton "
        "mamba_chunk_scan_combined), counting 2 x Mamba2Shape.scan_macs FLOPs per token; far below attention's "
        "because the chunk, state-passing and cumulative-sum kernels are short, FP32 and memory-heavy",
    ),
    ParamInfo(
        "gdn_efficiency",
        "fraction",
        0.005,
        0.9,
        "the same for gated DeltaNet's chunked delta rule (flash-linear-attention's Triton chunk_gated_delta_rule), "
        "counting 2 x GatedDeltaNetShape.scan_macs FLOPs per token",
    ),
    ParamInfo(
        "memory_efficiency",
        "fraction",
        0.2,
        0.98,
        "achieved fraction of peak HBM bandwidth in memory-bound passes (norms, rotary, SwiGLU, permute, "
        "softmax/top-k, cross-entropy, optimizer)",
    ),
    ParamInfo(
        "a2a_intra_GBps",
        "GB/s",
        5.0,
        2000.0,
        "alltoall/allgather token dispatcher: achieved per-rank algorithm bandwidth of dispatch/combine inside a node",
    ),
    ParamInfo(
        "a2a_inter_GBps",
        "GB/s",
        1.0,
        400.0,
        "alltoall/allgather token dispatcher: achieved per-rank bandwidth of the part of dispatch/combine that "
        "leaves the node",
    ),
    ParamInfo(
        "flex_intra_GBps",
        "GB/s",
        5.0,
        2000.0,
        "flex dispatcher (DeepEP / HybridEP kernels): achieved per-rank algorithm bandwidth inside a node",
    ),
    ParamInfo(
        "flex_inter_GBps",
        "GB/s",
        1.0,
        400.0,
        "flex dispatcher: achieved per-rank bandwidth of the part that leaves the node (RDMA)",
    ),
    ParamInfo(
        "ep_latency_us",
        "us",
        1.0,
        500.0,
        "fixed latency of one dispatch or combine (kernel start, handshakes, the token-count exchange)",
    ),
    ParamInfo(
        "ep_overlap",
        "fraction",
        0.0,
        0.98,
        "share of expert-parallel communication hidden behind computation when EP overlap is enabled "
        "(--overlap-moe-expert-parallel-comm)",
    ),
    ParamInfo(
        "flex_overlap",
        "fraction",
        0.0,
        0.98,
        "the same share for the flex dispatcher (DeepEP / HybridEP): its kernels use a few SMs and the NIC's "
        "RDMA engine, so they contend less with the computation they hide behind than NCCL all-to-all does",
    ),
    ParamInfo(
        "tp_overlap",
        "fraction",
        0.0,
        0.98,
        "share of tensor-parallel all-gather/reduce-scatter hidden behind the GEMMs they feed when TP "
        "communication overlap is on (Megatron --tp-comm-overlap, MindSpeed --use-mc2)",
    ),
    ParamInfo(
        "p2p_exposed",
        "fraction",
        0.0,
        1.0,
        "share of the pipeline's send/receive time per micro-batch that is not hidden behind computation",
    ),
    ParamInfo(
        "dp_overlap",
        "fraction",
        0.0,
        1.0,
        "share of the last micro-batch's backward (forward, for the parameter all-gather) that the data-parallel "
        "gradient reduce-scatter can hide behind when overlap is on",
    ),
)

PARAM_INFO: dict[str, ParamInfo] = {p.name: p for p in PARAMS}


@dataclass(frozen=True)
class RuntimeParams:
    """Values of :data:`PARAMS` for one device (see each :class:`ParamInfo` for meaning and unit).

    The defaults are assumptions for a current GPU system with a Megatron-Core + Transformer Engine stack;
    shipped tables override them with sourced or derived anchors, profiled and calibrated tables with
    measured or fitted values.
    """

    launch_us: float = 6.0
    call_us: float = 80.0
    sync_us: float = 50.0
    gemm_scale: float = 1.0
    fp8_gemm_scale: float = 0.9
    grouped_rows_half: float = 128.0
    stack_compute_scale: float = 1.0
    attention_scale: float = 1.0
    ssd_efficiency: float = 0.134
    gdn_efficiency: float = 0.0582
    memory_efficiency: float = 0.8
    a2a_intra_GBps: float = 150.0
    a2a_inter_GBps: float = 40.0
    flex_intra_GBps: float = 150.0
    flex_inter_GBps: float = 45.0
    ep_latency_us: float = 30.0
    ep_overlap: float = 0.5
    flex_overlap: float = 0.5
    tp_overlap: float = 0.5
    p2p_exposed: float = 1.0
    dp_overlap: float = 1.0

    @classmethod
    def roofline(cls, memory_efficiency: float = 1.0, a2a_GBps: float = 1e12) -> RuntimeParams:
        """No host, sync, tile or latency costs: the pure roofline the runtime terms refine (for tests and
        for reasoning about what the terms add). Not a physical device; bypasses the ranges on purpose."""
        return cls(
            launch_us=0.0,
            call_us=0.0,
            sync_us=0.0,
            fp8_gemm_scale=1.0,
            grouped_rows_half=0.0,
            memory_efficiency=memory_efficiency,
            a2a_intra_GBps=a2a_GBps,
            a2a_inter_GBps=a2a_GBps,
            flex_intra_GBps=a2a_GBps,
            flex_inter_GBps=a2a_GBps,
            ep_latency_us=0.0,
        )

    def with_values(self, values: Mapping[str, float]) -> RuntimeParams:
        return replace(self, **dict(values))

    def to_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in fields(self)}


def _check_registry() -> None:
    names = [f.name for f in fields(RuntimeParams)]
    if names != [p.name for p in PARAMS]:  # pragma: no cover - a programming error, caught by every test run
        raise RuntimeError("RuntimeParams fields and PARAMS disagree")


_check_registry()


def runtime_from_fields(f: Fields | None, base: RuntimeParams | None = None) -> tuple[RuntimeParams, list[str]]:
    """Read a ``runtime:`` mapping; every value must lie in its physical range.

    Returns the parameters and the names taken from ``base`` (or the defaults) because the table did not
    set them, so the loader can list them as assumptions.
    """
    rt = base or RuntimeParams()
    if f is None:
        return rt, [p.name for p in PARAMS]
    vals = read_bounded(f, PARAMS, say_meaning=True)
    return rt.with_values(vals), [p.name for p in PARAMS if p.name not in vals]


def read_bounded(f: Fields, params: Sequence[ParamInfo], *, say_meaning: bool = False) -> dict[str, float]:
    """The values ``f`` sets among ``params`` (the others are left to the caller's defaults), each checked
    against its physical range ``[lo, hi]``; any other key but the provenance ones is refused. With
    ``say_meaning`` an out-of-range message also says what the value means (the runtime terms' names are
    terse)."""
    vals: dict[str, float] = {}
    for p in params:
        v = f.float_(p.name, None, positive=False)
        if v is None:
            continue
        if not p.lo <= v <= p.hi:
            meaning = f" ({p.meaning.split(';')[0]})" if say_meaning else ""
            raise f.err(p.name, f"must lie in [{p.lo:g}, {p.hi:g}] {p.unit}{meaning}, got {v:g}")
        vals[p.name] = v
    f.reject_unknown(allowed_extra=("note", "source", "sources"))
    return vals


def runtime_doc(rt: RuntimeParams) -> dict[str, Any]:
    return rt.to_dict()
