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
