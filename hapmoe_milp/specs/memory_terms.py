"""Named device-table memory terms: what a rank's device memory holds besides PyTorch's live tensors.

``torch.cuda.max_memory_allocated`` (what Megatron's ``report_memory`` prints as ``max allocated``) counts
live tensors only. Between that and the device's capacity sit three things the cost model names here, so
a user (or ``hapmoe-milp profile``) can set them per device in the table's optional ``memory:`` section:

- ``fragmentation``: the caching allocator's reserved-but-unused share at the peak,
  ``max_reserved / max_allocated - 1``;
- ``context_gib``: CUDA context, cuBLAS/cuDNN workspaces and NCCL communicator buffers, which live outside
  the caching allocator;
- ``flex_buffer_gib``: DeepEP / HybridEP communication buffers of the ``flex`` dispatcher (NVSHMEM and
  NVLink buffers allocated outside the caching allocator), per rank.

The defaults and where they come from are in :data:`MEMORY_PARAMS` (``bench/calibration/memory_runs.yaml``
holds the measured pairs the fragmentation default is derived from). ``cost/memory.py`` is the only reader.

Why NCCL stays inside ``context_gib`` rather than an item of its own (issue 23, looked into by branch mem7):
NCCL's own buffers are real device memory outside the allocator and their per-connection size follows from
its source, but how many of them a rank holds does not follow from anything a run's source states.
At NCCL v2.21.5-1 (ab2b89c4c3) a ring connection's receive side holds the LL, LL128 and SIMPLE buffers
(``src/init.cc`` defaults: 512 KiB, 4.6875 MiB, 4 MiB) rounded up to ``CUDA_IPC_MIN`` (2 MiB,
``src/include/comm.h``) -- 10 MiB -- and its send side 2 MiB (``src/transport/p2p.cc``), so 12 MiB per
channel per communicator for rings (trees make their own connections); the NVLS buffers of a communicator over more
than two GPUs of one NVSwitch node are ``nHeads * nChannels * 2 * (buffer + 2 MiB)``
(``src/transport/nvls.cc``), with buffer 4 MiB up to v2.20 and 1 MiB from v2.21. The channel count comes
from NCCL's topology search (16 in an H800 log, NVIDIA/nccl#892; 32 per peer on H100, NVIDIA/nccl#1685),
connections are made lazily from v2.22 (``NCCL_RUNTIME_CONNECT``), communicators split with
``splitShare`` share them (NVIDIA/nccl#864), and none of the measured runs states its NCCL version: per rank
this spans a few hundred MiB to several GiB, so an itemized term would have to assume the very numbers
that decide it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from hapmoe_milp.specs._fields import Fields
from hapmoe_milp.specs.runtime import ParamInfo, read_bounded

#: Meaning, unit and physical range of each term.
MEMORY_PARAMS: tuple[ParamInfo, ...] = (
    ParamInfo(
        "fragmentation",
        "fraction",
        0.0,
        0.4,
        "caching-allocator slack at the peak, max reserved / max allocated - 1. Default 0.10: the median over "
        "models of the measured pairs in bench/calibration/memory_runs.yaml (range 0.026-0.257; "
        "leave-one-model-out in bench/RESULTS.md)",
    ),
    ParamInfo(
        "context_gib",
        "GiB",
        0.2,
        8.0,
        "device memory outside the caching allocator without DeepEP: CUDA context (~0.5 GiB on Hopper), "
        "cuBLAS/cuDNN workspaces and NCCL buffers. Default 2.0 GiB: an assumption, the low end of the 2-3 GiB "
        "framework overhead Sailor's simulator uses (reference/papers.md §6.4)",
    ),
    ParamInfo(
        "flex_buffer_gib",
        "GiB",
        0.0,
        16.0,
        "DeepEP/HybridEP buffers of the flex dispatcher outside the caching allocator. Default 4.0 GiB: "
        "derived from one public run (GLM-5.2 on 352 H100, EP32 DeepEP: device-level peak 79.10 GiB vs "
        "allocator reserved 69.68 GiB, less the context term), halved because that run spans nodes (RDMA + "
        "NVLink buffers) -- an estimate, not a measurement of this term alone",
    ),
)

MEMORY_PARAM_INFO = {p.name: p for p in MEMORY_PARAMS}


@dataclass(frozen=True)
class MemoryTerms:
    """Values of :data:`MEMORY_PARAMS` for one device (meaning and unit in each :class:`ParamInfo`)."""

    fragmentation: float = 0.10
    context_gib: float = 2.0
    flex_buffer_gib: float = 4.0

    def to_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in fields(self)}


def memory_terms_from_fields(f: Fields | None) -> MemoryTerms:
    """Read a device table's optional ``memory:`` mapping; each value must lie in its physical range."""
    if f is None:
        return MemoryTerms()
    return MemoryTerms(**read_bounded(f, MEMORY_PARAMS))
