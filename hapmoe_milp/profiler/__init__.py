"""Measure device tables on the local accelerator with PyTorch micro-benchmarks.

``profile -> table_writer -> (specs loader) -> cost model``: :func:`profile_device` times GEMMs, causal
attention, grouped expert GEMMs, memory-bound kernels and reads the usable memory; the collectives module
(run under ``torch.distributed.run``) measures bus bandwidth per primitive and link class;
:func:`write_device_table` turns both into a device file with exactly the schema of the shipped ones
(``provenance: profiled``), so a profiled file can replace a shipped one through ``--devices-dir``;
:func:`compare_tables` puts a profiled file next to the shipped one.

PyTorch is an optional extra (``pip install 'hapmoe-milp[profile]'``). Nothing in this package imports it at
module level: the planner must work without it, and a missing torch must surface as one clear
:class:`TorchMissingError` line, not an ``ImportError`` traceback. Public names are resolved lazily
(PEP 562) so ``import hapmoe_milp.profiler`` stays cheap.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from hapmoe_milp.errors import HapmoeError

INSTALL_HINT = (
    "pip install 'hapmoe-milp[profile]' (or install the PyTorch build for your accelerator from "
    "https://pytorch.org/get-started/locally/; Ascend also needs torch_npu)"
)


class ProfilerError(HapmoeError):
    """Profiling cannot run or its results cannot be turned into a device table."""


class TorchMissingError(ProfilerError):
    """PyTorch (the ``profile`` extra) is not installed."""


def read_json_object(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """Read a JSON object the profiler wrote, turning every I/O or syntax problem into a ProfilerError."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfilerError("file not found", source=str(p)) from None
    except (OSError, ValueError) as exc:
        raise ProfilerError(f"not a readable JSON file: {exc}", source=str(p)) from None
    if not isinstance(doc, dict):
        raise ProfilerError("expected a JSON object", source=str(p))
    return p, doc


def require_torch() -> ModuleType:
    """Import torch on first use; raise :class:`TorchMissingError` with an install hint when it is absent."""
    try:
        return importlib.import_module("torch")
    except ImportError as exc:
        raise TorchMissingError(f"PyTorch is needed for profiling ({exc}); {INSTALL_HINT}") from None


_EXPORTS = {
    "Timing": "hapmoe_milp.profiler.timing",
    "time_fn": "hapmoe_milp.profiler.timing",
    "profile_device": "hapmoe_milp.profiler.kernels",
    "detect_backend": "hapmoe_milp.profiler.kernels",
    "known_peak": "hapmoe_milp.profiler.peaks",
    "run_collectives": "hapmoe_milp.profiler.collectives",
    "launch_local_collectives": "hapmoe_milp.profiler.collectives",
    "load_collectives": "hapmoe_milp.profiler.collectives",
    "cross_link_from_collectives": "hapmoe_milp.profiler.collectives",
    "build_device_document": "hapmoe_milp.profiler.table_writer",
    "write_device_table": "hapmoe_milp.profiler.table_writer",
    "DeviceOverrides": "hapmoe_milp.profiler.table_writer",
    "save_measurements": "hapmoe_milp.profiler.table_writer",
    "load_measurements": "hapmoe_milp.profiler.table_writer",
    "Row": "hapmoe_milp.profiler.compare",
    "compare_tables": "hapmoe_milp.profiler.compare",
    "format_rows": "hapmoe_milp.profiler.compare",
    "summarize_rows": "hapmoe_milp.profiler.compare",
}

__all__ = [
    "INSTALL_HINT",
    "ProfilerError",
    "TorchMissingError",
    "require_torch",
    *_EXPORTS,
]


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)
