"""Compute and memory micro-benchmarks on the local accelerator -> raw measurements for a device table.

What is measured, and in the units the cost model consumes (:mod:`hapmoe_milp.cost.primitives`):

* **GEMM** ``(m x k) @ (k x n)`` over a ladder of sizes (and, in full mode, three aspect ratios per size:
  square, tall-skinny and long-k, the forward / data-grad / weight-grad shapes of a linear layer): achieved
  TFLOP/s for ``2*m*n*k`` FLOPs. The table writer divides by the dense peak to get ``gemm_efficiency``.
* **Attention**: ``scaled_dot_product_attention(is_causal=True)``, forward and backward separately, vs
  sequence length, with FLOPs counted exactly as :class:`hapmoe_milp.cost.model.CostModel` counts them:
  forward ``2*b*S*S*heads*head_dim`` (causal: half of the 4*S*S*h*d of full attention), backward 2.5x that.
* **Grouped expert GEMM** (``torch.bmm`` over E experts) vs tokens per expert: informational; the table
  writer checks whether ``gemm_time(..., groups=E)`` on the measured table reproduces it and records the
  result in ``notes`` (the shipped schema has no grouped-GEMM table).
* **Memory**: a large device-to-device copy gives ``memory_bandwidth_GBps`` (read + write bytes / time);
  element-wise kernels of a transformer layer (residual add, SwiGLU, router softmax) give
  ``memory_bound_efficiency`` as their achieved fraction of that bandwidth.
* **Usable memory**: what a fresh training process can allocate (free + our own cache on accelerators,
  ``MemAvailable`` on CPU).

Peak: the caller's ``peak_tflops``, else a small datasheet table keyed by the device name (with sources),
else the best GEMM throughput measured here -- always recorded in ``assumptions``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib
import importlib.metadata
import logging
import math
import os
import platform
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from hapmoe_milp.limits import RANGE_PEAK_TFLOPS
from hapmoe_milp.profiler import ProfilerError, require_torch
from hapmoe_milp.profiler.peaks import KNOWN_PEAKS, KnownPeak, choose_peak, known_peak  # noqa: F401
from hapmoe_milp.profiler.timing import Timing, calls_per_sample, time_fn

log = logging.getLogger(__name__)

MEASUREMENT_FORMAT = "hapmoe-milp/profile/v1"
BACKENDS = ("auto", "cuda", "rocm", "npu", "cpu")
GIB = 1024**3
MIB = 1024**2
ATTN_BWD_FLOP_FACTOR = 2.5  # cost/model.py: attention_time(dev, 2.5 * core_flops_f, S, backward=True)


def attention_flops(batch: int, seq: int, heads: int, head_dim: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of causal attention, counted as the cost model counts them.

    :class:`hapmoe_milp.cost.model.CostModel` charges ``t * S * heads * head_dim * 2`` forward (``t = b*S``
    tokens; causal, so each query sees S/2 keys of the 4*S*S*h*d of full attention) and 2.5x that backward.
    Efficiencies measured with the same count are what its ``attention_time`` expects.
    """
    fwd = 2.0 * batch * seq * seq * heads * head_dim
    return fwd, ATTN_BWD_FLOP_FACTOR * fwd


# --------------------------------------------------------------------------------------------- backend
@dataclass(frozen=True)
class Backend:
    """The accelerator runtime found here, with its synchronisation and identification."""

    kind: str  # cuda | rocm | npu | cpu
    torch: ModuleType
    device: Any  # torch.device
    sync: Callable[[], None]
    hardware: str
    device_count: int
    versions: dict[str, str] = field(default_factory=dict)


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):  # noqa: SIM115
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def _run_quiet(cmd: list[str]) -> str:
    """First line of a vendor tool's output (driver versions), or '' when the tool is absent or slow."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else ""


def _import_torch_npu() -> ModuleType | None:
    try:
        return importlib.import_module("torch_npu")
    except ImportError:
        return None
    except Exception as exc:  # a broken CANN install raises anything at import time
        log.warning("torch_npu is installed but failed to import (%s); Ascend NPUs are not used", exc)
        return None


def detect_backend(backend: str = "auto") -> Backend:
    """Pick the accelerator: ``auto`` prefers CUDA/ROCm, then Ascend (torch_npu), then CPU."""
    if backend not in BACKENDS:
        raise ProfilerError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}", field="backend")
    torch = require_torch()
    versions: dict[str, str] = {"torch": str(torch.__version__), "python": platform.python_version()}
    cuda_ok = bool(torch.cuda.is_available())
    is_hip = getattr(torch.version, "hip", None) is not None
    if backend in ("auto", "cuda", "rocm") and cuda_ok and (backend == "auto" or (backend == "rocm") == is_hip):
        idx = torch.cuda.current_device()
        if is_hip:
            versions["rocm_hip"] = str(torch.version.hip)
            with contextlib.suppress(OSError):
                versions["amdgpu_driver"] = Path("/sys/module/amdgpu/version").read_text(encoding="utf-8").strip()
        else:
            versions["cuda"] = str(torch.version.cuda)
            drv = _run_quiet(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
            if drv:
                versions["nvidia_driver"] = drv
        with contextlib.suppress(Exception):
            versions["cudnn" if not is_hip else "miopen"] = str(torch.backends.cudnn.version())
        with contextlib.suppress(Exception):
            nccl = torch.cuda.nccl.version()
            versions["nccl" if not is_hip else "rccl"] = (
                ".".join(str(v) for v in nccl) if isinstance(nccl, tuple) else str(nccl)
            )
        return Backend(
            kind="rocm" if is_hip else "cuda",
            torch=torch,
            device=torch.device("cuda", idx),
            sync=lambda: torch.cuda.synchronize(idx),
            hardware=str(torch.cuda.get_device_name(idx)),
            device_count=int(torch.cuda.device_count()),
            versions=versions,
        )
    if backend in ("cuda", "rocm"):
        raise ProfilerError(
            f"backend {backend!r} requested but torch {torch.__version__} sees no "
            f"{'ROCm' if backend == 'rocm' else 'CUDA'} device (torch.cuda.is_available() = {cuda_ok}, "
            f"torch.version.hip = {getattr(torch.version, 'hip', None)})",
            field="backend",
        )
    if backend in ("auto", "npu"):
        tnpu = _import_torch_npu()
        npu = getattr(torch, "npu", None)
        if tnpu is not None and npu is not None and npu.is_available():
            idx = npu.current_device()
            versions["torch_npu"] = str(getattr(tnpu, "__version__", "unknown"))
            cann = getattr(getattr(tnpu, "version", None), "cann", None)
            if cann:
                versions["cann"] = str(cann)
            home = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
            if home and "cann" not in versions:
                versions["cann_home"] = home
            return Backend(
                kind="npu",
                torch=torch,
                device=torch.device("npu", idx),
                sync=lambda: npu.synchronize(idx),
                hardware=str(npu.get_device_name(idx)),
                device_count=int(npu.device_count()),
                versions=versions,
            )
        if backend == "npu":
            raise ProfilerError(
                "backend 'npu' requested but torch_npu is not importable or sees no NPU; install torch_npu "
                "matching your CANN and torch versions",
                field="backend",
            )
    versions["cpu_threads"] = str(torch.get_num_threads())
    return Backend(
        kind="cpu",
        torch=torch,
        device=torch.device("cpu"),
        sync=lambda: None,
        hardware=_cpu_model(),
        device_count=1,
        versions=versions,
    )


# --------------------------------------------------------------------------------------------- sweep sizes
@dataclass(frozen=True)
class SweepConfig:
    """Sizes, repeats and time caps of one profiling run (``quick`` or ``full``, per backend class)."""

    gemm_sides: tuple[int, ...]
    gemm_aspects: tuple[tuple[float, float, float], ...]
    attn_seqs: tuple[int, ...]
    attn_heads: int
    attn_head_dim: int
    grouped_tokens: tuple[int, ...]
    grouped_shape: tuple[int, int, int]  # experts, hidden, expert ffn
    copy_bytes: int
    warmup: int
    repeats: int
    target_sample_s: float  # batch calls so one timed sample lasts about this long
    max_call_s: float  # stop growing a sweep once one call takes longer than this
    sweep_budget_s: float  # wall-clock cap per sweep (gemm, attention, grouped)


# (m, n, k) multipliers of the side c: square; tall-skinny (tokens x hidden, forward/dgrad);
# long-k (weight gradient: the reduction runs over tokens). All three have 2*c^3 FLOPs.
ASPECTS_FULL = ((1.0, 1.0, 1.0), (4.0, 0.5, 0.5), (0.5, 0.5, 4.0))
ASPECTS_QUICK = ((1.0, 1.0, 1.0),)


def sweep_config(kind: str, quick: bool) -> SweepConfig:
    if kind == "cpu":
        if quick:
            return SweepConfig(
                gemm_sides=(64, 128, 256, 512, 1024, 2048),
                gemm_aspects=ASPECTS_QUICK,
                attn_seqs=(128, 256, 512, 1024, 2048),
                attn_heads=4,
                attn_head_dim=128,
                grouped_tokens=(32, 128, 512),
                grouped_shape=(8, 512, 512),
                copy_bytes=64 * MIB,
                warmup=2,
                repeats=5,
                target_sample_s=0.005,
                max_call_s=0.25,
                sweep_budget_s=8.0,
            )
        return SweepConfig(
            gemm_sides=(64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096),
            gemm_aspects=ASPECTS_FULL,
            attn_seqs=(128, 256, 512, 1024, 2048, 4096),
            attn_heads=8,
            attn_head_dim=128,
            grouped_tokens=(16, 32, 64, 128, 256, 512, 1024, 2048),
            grouped_shape=(8, 1024, 1024),
            copy_bytes=256 * MIB,
            warmup=2,
            repeats=7,
            target_sample_s=0.02,
            max_call_s=1.0,
            sweep_budget_s=120.0,
        )
    if quick:
        return SweepConfig(
            gemm_sides=(128, 256, 512, 1024, 2048, 4096, 8192),
            gemm_aspects=ASPECTS_QUICK,
            attn_seqs=(512, 1024, 2048, 4096, 8192),
            attn_heads=16,
            attn_head_dim=128,
            grouped_tokens=(64, 256, 1024, 4096),
            grouped_shape=(8, 4096, 2048),
            copy_bytes=256 * MIB,
            warmup=3,
            repeats=5,
            target_sample_s=0.005,
            max_call_s=0.5,
            sweep_budget_s=20.0,
        )
    return SweepConfig(
        gemm_sides=(64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384),
        gemm_aspects=ASPECTS_FULL,
        attn_seqs=(512, 1024, 2048, 4096, 8192, 16384, 32768, 65536),
        attn_heads=16,
        attn_head_dim=128,
        grouped_tokens=(16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
        grouped_shape=(8, 4096, 2048),
        copy_bytes=GIB,
        warmup=5,
        repeats=20,
        target_sample_s=0.01,
        max_call_s=2.0,
        sweep_budget_s=180.0,
    )


# --------------------------------------------------------------------------------------------- helpers
def _is_oom(exc: BaseException) -> bool:
    return "out of memory" in str(exc).lower() or type(exc).__name__ == "OutOfMemoryError"


def _release_cached_memory(be: Backend | None) -> None:
    """Return the allocator's cached blocks after an OOM, so the next sweep starts from a clean pool."""
    if be is None or be.kind == "cpu":
        return
    api = be.torch.npu if be.kind == "npu" else be.torch.cuda
    with contextlib.suppress(Exception):
        api.empty_cache()


def _timing_dict(t: Timing) -> dict[str, Any]:
    return {"median_s": t.median, "p10_s": t.p10, "p90_s": t.p90, "repeats": len(t.samples), "number": t.number}


def _time(be: Backend, fn: Callable[[], object], cfg: SweepConfig) -> Timing:
    """Probe (two calls, which double as warm-up), batch tiny kernels, then the timed samples."""
    number = calls_per_sample(fn, sync=be.sync, target_s=cfg.target_sample_s)
    return time_fn(fn, warmup=max(0, cfg.warmup - 2), repeats=cfg.repeats, sync=be.sync, number=number)


class _Sweep:
    """Runs points in increasing cost; stops at the time budget, a too-slow call, or out-of-memory."""

    def __init__(self, name: str, cfg: SweepConfig, notes: list[str], be: Backend | None = None) -> None:
        self.name = name
        self.cfg = cfg
        self.notes = notes
        self.be = be
        self.t0 = time.perf_counter()
        self.stopped = ""

    def run(
        self,
        points: Iterable[Any],
        measure: Callable[[Any], dict[str, Any] | None],
        cost: Callable[[dict[str, Any]], float] = lambda r: float(r["median_s"]),
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        pts = list(points)
        for i, p in enumerate(pts):
            if out and time.perf_counter() - self.t0 > self.cfg.sweep_budget_s:
                self.stopped = f"time budget {self.cfg.sweep_budget_s:g} s reached"
            if self.stopped:
                self.notes.append(f"{self.name}: stopped after {len(out)} points ({self.stopped}); skipped {pts[i:]}")
                break
            try:
                r = measure(p)
            except RuntimeError as exc:
                if not _is_oom(exc):
                    raise
                self.notes.append(f"{self.name}: out of memory at {p}; larger points skipped")
                _release_cached_memory(self.be)
                break
            if r is None:
                continue
            out.append(r)
            if cost(r) > self.cfg.max_call_s:
                self.stopped = f"one call took {cost(r):.3g} s > {self.cfg.max_call_s:g} s"
        return out


# --------------------------------------------------------------------------------------------- measurements
def measure_gemm(be: Backend, cfg: SweepConfig, dtype: Any, notes: list[str]) -> list[dict[str, Any]]:
    torch = be.torch
    pts = [(c, a) for c in cfg.gemm_sides for a in cfg.gemm_aspects]

    def one(p: tuple[int, tuple[float, float, float]]) -> dict[str, Any] | None:
        c, (fm, fn_, fk) = p
        m, n, k = int(c * fm), int(c * fn_), int(c * fk)
        if min(m, n, k) < 16:
            return None
        a = torch.randn(m, k, device=be.device, dtype=dtype)
        b = torch.randn(k, n, device=be.device, dtype=dtype)
        out = torch.empty(m, n, device=be.device, dtype=dtype)
        with torch.no_grad():
            t = _time(be, lambda: torch.matmul(a, b, out=out), cfg)
        flops = 2.0 * m * n * k
        return {"m": m, "n": n, "k": k, "flops": flops, **_timing_dict(t), "tflops": flops / t.median / 1e12}

    return _Sweep("gemm", cfg, notes, be).run(pts, one)


def measure_attention(be: Backend, cfg: SweepConfig, dtype: Any, notes: list[str]) -> list[dict[str, Any]]:
    torch = be.torch
    sdpa = torch.nn.functional.scaled_dot_product_attention
    H, d, b = cfg.attn_heads, cfg.attn_head_dim, 1

    def one(S: int) -> dict[str, Any]:
        q, k, v = (torch.randn(b, H, S, d, device=be.device, dtype=dtype, requires_grad=True) for _ in range(3))
        with torch.no_grad():
            tf = _time(be, lambda: sdpa(q, k, v, is_causal=True), cfg)
        out = sdpa(q, k, v, is_causal=True)
        g = torch.randn_like(out)
        # retain_graph lets the same graph be differentiated repeatedly, so only the backward kernels are timed
        tb = _time(be, lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True), cfg)
        fwd_flops, bwd_flops = attention_flops(b, S, H, d)
        return {
            "seq": S,
            "batch": b,
            "heads": H,
            "head_dim": d,
            "fwd_flops": fwd_flops,
            "bwd_flops": bwd_flops,
            "fwd": _timing_dict(tf),
            "bwd": _timing_dict(tb),
            "fwd_tflops": fwd_flops / tf.median / 1e12,
            "bwd_tflops": bwd_flops / tb.median / 1e12,
        }

    return _Sweep("attention", cfg, notes, be).run(
        cfg.attn_seqs, one, cost=lambda r: max(r["fwd"]["median_s"], r["bwd"]["median_s"])
    )


def measure_grouped_gemm(be: Backend, cfg: SweepConfig, dtype: Any, notes: list[str]) -> list[dict[str, Any]]:
    """E experts' first projection, ``(E, tokens, h) @ (E, h, f)``, as one batched kernel.

    ``torch.bmm`` stands in for Megatron's grouped GEMM with equal tokens per expert; the cost model
    prices exactly this shape as ``gemm_time(tokens, f, h, groups=E)``.
    """
    torch = be.torch
    E, h, f = cfg.grouped_shape

    def one(tpe: int) -> dict[str, Any]:
        x = torch.randn(E, tpe, h, device=be.device, dtype=dtype)
        w = torch.randn(E, h, f, device=be.device, dtype=dtype)
        out = torch.empty(E, tpe, f, device=be.device, dtype=dtype)
        with torch.no_grad():
            t = _time(be, lambda: torch.bmm(x, w, out=out), cfg)
        flops = 2.0 * E * tpe * h * f
        return {
            "experts": E,
            "tokens_per_expert": tpe,
            "hidden": h,
            "ffn": f,
            "flops": flops,
            **_timing_dict(t),
            "tflops": flops / t.median / 1e12,
        }

    return _Sweep("grouped_gemm", cfg, notes, be).run(cfg.grouped_tokens, one)


def _copy_bandwidth(be: Backend, cfg: SweepConfig, dtype: Any) -> tuple[float, dict[str, Any], int]:
    torch = be.torch
    esize = torch.tensor([], dtype=dtype).element_size()
    n = cfg.copy_bytes // esize
    src = torch.randn(n, device=be.device, dtype=dtype)
    dst = torch.empty_like(src)
    t = _time(be, lambda: dst.copy_(src), cfg)
    return 2 * n * esize / t.median / 1e9, _timing_dict(t), 2 * n * esize


def _elementwise(be: Backend, cfg: SweepConfig, dtype: Any) -> list[dict[str, Any]]:
    torch = be.torch
    F = torch.nn.functional
    esize = torch.tensor([], dtype=dtype).element_size()
    n = cfg.copy_bytes // esize
    a = torch.randn(n, device=be.device, dtype=dtype)
    b = torch.randn(n, device=be.device, dtype=dtype)
    c = torch.empty_like(a)
    ops: list[dict[str, Any]] = []
    # residual add: 2 reads + 1 write
    t = _time(be, lambda: torch.add(a, b, out=c), cfg)
    ops.append({"op": "add (residual)", "bytes": 3 * n * esize, **_timing_dict(t)})
    # SwiGLU: silu(x) (1 read + 1 write of a temporary), then * y (2 reads + 1 write); unfused, as in eager mode
    half = n // 2
    x, y, o = a[:half], b[:half], c[:half]
    t = _time(be, lambda: torch.mul(F.silu(x), y, out=o), cfg)
    ops.append({"op": "swiglu (silu * mul, unfused)", "bytes": 5 * half * esize, **_timing_dict(t)})
    return ops


def _router_softmax(be: Backend, cfg: SweepConfig) -> dict[str, Any]:
    """fp32 softmax over 64 experts per token (1 read + 1 write), the router's memory-bound part."""
    torch = be.torch
    E = 64
    rows = max(1, cfg.copy_bytes // 4 // E // 2)
    logits = torch.randn(rows, E, device=be.device, dtype=torch.float32)
    t = _time(be, lambda: torch.softmax(logits, dim=-1), cfg)
    return {"op": "router softmax (fp32, 64 experts)", "bytes": 2 * rows * E * 4, **_timing_dict(t)}


def measure_memory(be: Backend, cfg: SweepConfig, dtype: Any, notes: list[str]) -> dict[str, Any]:
    """Copy bandwidth (the achievable HBM/DRAM rate) and element-wise kernels' fraction of it.

    Separate helpers so each one's buffers are released before the next allocates (device memory).
    """
    copy_GBps, copy_t, copy_bytes = _copy_bandwidth(be, cfg, dtype)
    ops = _elementwise(be, cfg, dtype)
    ops.append(_router_softmax(be, cfg))
    for r in ops:
        r["GBps"] = r["bytes"] / r["median_s"] / 1e9
        r["fraction_of_copy"] = r["GBps"] / copy_GBps
    fractions = sorted(r["fraction_of_copy"] for r in ops)
    mbe = fractions[len(fractions) // 2]
    if mbe > 1.0:
        notes.append(f"memory-bound kernels reached {mbe:.3f} of the copy bandwidth (caches?); capped at 1.0")
        mbe = 1.0
    return {
        "copy_bytes": copy_bytes,
        "copy": copy_t,
        "memory_bandwidth_GBps": copy_GBps,
        "elementwise": ops,
        "memory_bound_efficiency": mbe,
    }


def measure_host(be: Backend, cfg: SweepConfig) -> dict[str, Any]:
    """Host cost of issuing one kernel, and of one device-to-host sync (the runtime's launch_us, sync_us).

    Launch: the host time to enqueue ``n`` tiny in-place adds, per kernel (on an accelerator the device
    finishes each long before the next arrives, so this is also the idle the device sees per kernel when
    nothing else is queued -- an upper bound of what training shows). Sync: a tiny add followed by
    ``.item()`` (the router's token-count pattern), minus one launch.
    """
    torch = be.torch
    x = torch.zeros(16, device=be.device)
    n = 200 if be.kind == "cpu" else 1000

    def issue() -> None:
        for _ in range(n):
            x.add_(1.0)

    def one_sync() -> None:
        x.add_(1.0)
        x.sum().item()

    launch = _time(be, issue, cfg)
    sync = _time(be, one_sync, cfg)
    launch_us = launch.median / n * 1e6
    return {
        "launch": _timing_dict(launch),
        "kernels_per_call": n,
        "launch_us": launch_us,
        "sync": _timing_dict(sync),
        "sync_us": max(0.0, sync.median * 1e6 - 2 * launch_us),
    }


def _meminfo_available() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in open("/proc/meminfo", encoding="utf-8"):  # noqa: SIM115
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def usable_memory(be: Backend) -> dict[str, Any]:
    """Bytes a training process could allocate on this device now."""
    torch = be.torch
    if be.kind in ("cuda", "rocm", "npu"):
        api = torch.cuda if be.kind != "npu" else torch.npu
        api.empty_cache()
        free, total = api.mem_get_info(be.device)
        reserved = int(api.memory_reserved(be.device))
        usable = int(free) + reserved
        return {
            "usable_bytes": usable,
            "total_bytes": int(total),
            "method": f"torch.{'npu' if be.kind == 'npu' else 'cuda'}.mem_get_info free + this process's cached "
            f"blocks; total {int(total) / GIB:.2f} GiB minus {(int(total) - usable) / GIB:.2f} GiB held by the "
            "runtime context and other processes",
        }
    avail = _meminfo_available()
    if avail is not None:
        return {"usable_bytes": avail, "method": "/proc/meminfo MemAvailable"}
    try:
        avail = int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError) as exc:
        raise ProfilerError(f"cannot read the available memory on this host: {exc}") from None
    return {"usable_bytes": avail, "method": "os.sysconf(SC_AVPHYS_PAGES * SC_PAGE_SIZE)"}


# --------------------------------------------------------------------------------------------- entry point
def _tool_version() -> str:
    try:
        return f"hapmoe-milp {importlib.metadata.version('hapmoe-milp')}"
    except importlib.metadata.PackageNotFoundError:
        return "hapmoe-milp (not installed)"


NOISY_SPREAD = 0.5  # (p90 - p10) / median above which a point is called noisy


def _note_noise(notes: list[str], name: str, timings: list[dict[str, Any]]) -> None:
    """Say so when repeats disagree: a busy host or clock changes make a table untrustworthy."""
    noisy = [t for t in timings if t["median_s"] > 0 and (t["p90_s"] - t["p10_s"]) / t["median_s"] > NOISY_SPREAD]
    if noisy:
        notes.append(
            f"{name}: {len(noisy)} of {len(timings)} points are noisy ((p90 - p10) / median > {NOISY_SPREAD:g}); "
            "was the host busy? re-run in full mode on an idle machine"
        )


def _pick_dtype(be: Backend, dtype: str) -> tuple[Any, str]:
    torch = be.torch
    if dtype == "auto":
        dtype = "bf16"
        if be.kind in ("cuda", "rocm") and not torch.cuda.is_bf16_supported():
            dtype = "fp16"  # V100-class: no bf16 tensor cores; the planner uses the fp16 peak for them
    table = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if dtype not in table:
        raise ProfilerError(f"unknown dtype {dtype!r}; choose auto, bf16, fp16 or fp32", field="dtype")
    return table[dtype], dtype


def profile_device(
    device_name: str,
    *,
    quick: bool = False,
    backend: str = "auto",
    peak_tflops: float | None = None,
    dtype: str = "auto",
    config: SweepConfig | None = None,
) -> dict[str, Any]:
    """Measure the local accelerator; return JSON-serialisable raw measurements for :mod:`table_writer`.

    ``device_name`` becomes the id of the written table (it is not used to pick the hardware: the profiler
    measures whatever ``backend`` finds). ``quick`` runs a few sizes with few repeats (well under a minute
    on a 2-core CPU); full mode sweeps the ranges of the shipped tables where time and memory allow.
    ``peak_tflops`` overrides the dense peak used to turn TFLOP/s into efficiencies.
    """
    if not device_name or any(ch.isspace() for ch in device_name):
        raise ProfilerError(f"invalid device name {device_name!r} (it becomes the table id)", field="device_name")
    lo, hi = RANGE_PEAK_TFLOPS  # the range a device table's peak must lie in (it becomes one)
    if peak_tflops is not None and not (math.isfinite(peak_tflops) and lo <= peak_tflops <= hi):
        raise ProfilerError(f"peak TFLOP/s must lie in [{lo:g}, {hi:g}], got {peak_tflops:g}", field="peak_tflops")
    t_start = time.perf_counter()
    be = detect_backend(backend)
    torch = be.torch
    tdtype, dname = _pick_dtype(be, dtype)
    cfg = config or sweep_config(be.kind, quick)
    notes: list[str] = []
    assumptions: list[str] = []
    torch.manual_seed(0)
    log.info(
        "profiling %s (%s, %s) as %r, %s mode", be.hardware, be.kind, dname, device_name, "quick" if quick else "full"
    )

    log.info("GEMM sweep")
    gemm = measure_gemm(be, cfg, tdtype, notes)
    if not gemm:
        raise ProfilerError("no GEMM size could be measured (out of memory or time budget at the smallest size)")
    log.info("attention sweep")
    attn = measure_attention(be, cfg, tdtype, notes)
    if not attn:
        raise ProfilerError("no attention sequence length could be measured")
    log.info("grouped expert GEMM sweep")
    grouped = measure_grouped_gemm(be, cfg, tdtype, notes)
    log.info("memory bandwidth")
    mem = measure_memory(be, cfg, tdtype, notes)
    log.info("host launch and sync")
    host = measure_host(be, cfg)
    usable = usable_memory(be)

    kp = known_peak(be.hardware) if be.kind != "cpu" else None
    peak, basis, peaks, sources = choose_peak(gemm, be.kind, be.hardware, dname, kp, peak_tflops, assumptions, notes)
    # fractions of the chosen peak, uncapped here (informational); the table writer caps table entries at 1.0
    for p in gemm:
        p["efficiency"] = p["tflops"] / peak
    for p in attn:
        p["fwd_efficiency"] = p["fwd_tflops"] / peak
        p["bwd_efficiency"] = p["bwd_tflops"] / peak
    for p in grouped:
        p["efficiency"] = p["tflops"] / peak

    _note_noise(notes, "gemm", gemm)
    _note_noise(notes, "attention forward", [p["fwd"] for p in attn])
    _note_noise(notes, "attention backward", [p["bwd"] for p in attn])
    _note_noise(notes, "grouped_gemm", grouped)
    wall = time.perf_counter() - t_start
    profiled = {
        "host": socket.gethostname(),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "tool": _tool_version(),
        "mode": "quick" if quick else "full",
        "backend": be.kind,
        "hardware": be.hardware,
        "visible_devices": str(be.device_count),
        "dtype": dname,
        "wall_s": f"{wall:.1f}",
        **be.versions,
    }
    log.info("profiled %s in %.1f s", be.hardware, wall)
    return {
        "format": MEASUREMENT_FORMAT,
        "device_name": device_name,
        "backend": be.kind,
        "hardware": be.hardware,
        "device_count": be.device_count,
        "mode": "quick" if quick else "full",
        "dtype": dname,
        "peak_tflops": peaks,
        "peak_basis": basis,
        "known_peak": None if kp is None else {"label": kp.label, "shipped_id": kp.shipped_id, "source": kp.source},
        "gemm": gemm,
        "attention": attn,
        "grouped_gemm": grouped,
        "memory": mem,
        "host": host,
        "usable_memory": usable,
        "profiled": profiled,
        "sources": sources,
        "assumptions": assumptions,
        "notes": notes,
    }
