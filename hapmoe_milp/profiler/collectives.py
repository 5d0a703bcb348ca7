"""Collective bus bandwidth vs message size, measured with torch.distributed on the backend present.

Run one process per device under the PyTorch launcher::

    python -m torch.distributed.run --standalone --nproc-per-node 8 -m hapmoe_milp.profiler.collectives \\
        --out intra.json [--quick] [--link intra|inter|cross]

and across nodes with ``--nnodes``/``--rdzv-endpoint`` as usual (the link class is then ``inter``). Rank 0
writes a JSON document that :func:`hapmoe_milp.profiler.table_writer.write_device_table` merges into a
device table.

Conventions follow nccl-tests (https://raw.githubusercontent.com/NVIDIA/nccl-tests/master/doc/PERFORMANCE.md),
which is also what :func:`hapmoe_milp.cost.primitives.collective_time` assumes: the message size ``S`` is the
per-rank buffer nccl-tests calls ``size`` (all-gather: the gathered output; reduce-scatter: the full input;
all-to-all: the send buffer), ``algbw = S / t`` and ``busbw = algbw * factor(n)`` with factor ``2(n-1)/n``
(all-reduce), ``(n-1)/n`` (all-gather, reduce-scatter, all-to-all) and 1 (send/recv). Each sample's time is
the slowest rank's (barrier before and after), like a collective's completion time in a training step.

Backends: NCCL (also RCCL on ROCm, which PyTorch exposes as ``nccl``), HCCL (Ascend, torch_npu) or gloo
(CPU). A primitive the backend lacks (gloo has no ``reduce_scatter_tensor`` in some versions) is emulated
with the operations it has, and the emulation is named in the table's ``method`` and in ``notes`` -- never
silently skipped.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hapmoe_milp.cost.primitives import BUS_FACTOR
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.profiler import ProfilerError, read_json_object, require_torch
from hapmoe_milp.profiler.timing import percentile, time_fn

log = logging.getLogger(__name__)

COLLECTIVES_FORMAT = "hapmoe-milp/collectives/v1"
PRIMITIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
LINKS = ("intra", "inter", "cross")
KIB = 1024
MIB = 1024**2
GIB = 1024**3


def default_sizes(backend: str, quick: bool) -> tuple[int, ...]:
    """Per-rank message bytes: 1 KiB upwards in x16 (quick) or x4 (full) steps."""
    if backend == "gloo":
        top, step = (4 * MIB, 16) if quick else (64 * MIB, 4)
    else:
        top, step = (256 * MIB, 16) if quick else (GIB, 4)
    out: list[int] = []
    s = KIB
    while s <= top:
        out.append(s)
        s *= step
    return tuple(out)


class _Comm:
    """The process group, device and the synchronisation used around every timed sample."""

    def __init__(self, backend: str | None) -> None:
        torch = require_torch()
        import torch.distributed as dist

        self.torch = torch
        self.dist = dist
        env = os.environ
        if "WORLD_SIZE" not in env or "RANK" not in env:
            raise ProfilerError(
                "not started by a launcher: run `python -m torch.distributed.run --nproc-per-node N "
                "-m hapmoe_milp.profiler.collectives --out FILE`"
            )
        self.rank = int(env["RANK"])
        self.world = int(env["WORLD_SIZE"])
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.local_world = int(env.get("LOCAL_WORLD_SIZE", str(self.world)))
        if self.world < 2:
            raise ProfilerError(f"collectives need at least 2 ranks, got WORLD_SIZE={self.world}")
        self.kind, self.backend = self._pick_backend(backend)
        if self.kind == "cuda":
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
            self._dev_sync: Callable[[], None] = lambda: torch.cuda.synchronize(self.device)
        elif self.kind == "npu":
            torch.npu.set_device(self.local_rank)
            self.device = torch.device("npu", self.local_rank)
            self._dev_sync = lambda: torch.npu.synchronize(self.local_rank)
        else:
            self.device = torch.device("cpu")
            self._dev_sync = lambda: None
        if not dist.is_initialized():
            dist.init_process_group(backend=self.backend)
        self._one = torch.ones(1, device=self.device)

    def _pick_backend(self, backend: str | None) -> tuple[str, str]:
        torch = self.torch
        if backend in (None, "auto"):
            if torch.cuda.is_available():
                return "cuda", "nccl"  # RCCL on ROCm builds
            try:
                import torch_npu  # noqa: F401 -- registers torch.npu

                if torch.npu.is_available():
                    return "npu", "hccl"
            except ImportError:
                pass
            return "cpu", "gloo"
        if backend == "nccl":
            if not torch.cuda.is_available():
                raise ProfilerError("--backend nccl needs a CUDA/ROCm device", field="backend")
            return "cuda", "nccl"
        if backend == "hccl":
            return "npu", "hccl"
        if backend == "gloo":
            return "cpu", "gloo"
        raise ProfilerError(f"unknown backend {backend!r}; choose auto, nccl, hccl or gloo", field="backend")

    def sync(self) -> None:
        """Drain this rank's queue, then wait for every rank: a sample starts and ends together everywhere."""
        self._dev_sync()
        self.dist.all_reduce(self._one)
        self._dev_sync()

    def max_over_ranks(self, values: Sequence[float]) -> list[float]:
        t = self.torch.tensor(list(values), dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return [float(v) for v in t.cpu().tolist()]


def _first_working(
    c: _Comm,
    prim: str,
    cands: list[tuple[str, Callable[[], object], str]],
    notes: list[str],
    method: dict[str, str],
    emulate: bool,
) -> Callable[[], object]:
    """First candidate that runs; kinds: ``native`` (single-tensor API), ``list`` (the tensor-list API of
    the same collective) and ``emulated`` (other collectives that move the same result, usually more data).
    The choice is remembered in ``method``, so every size of a primitive uses the same implementation.
    """
    chosen = method.get(prim)
    if emulate:
        if chosen is None:
            skipped = [lb for lb, _, kind in cands if kind != "emulated"]
            notes.append(f"{prim}: {', '.join(skipped)} skipped on request (--emulate)")
        cands = [cd for cd in cands if cd[2] == "emulated"]
    for label, fn, kind in cands:
        if chosen is not None and label != chosen:
            continue
        if chosen is None:
            try:
                fn()
                c.sync()
            except (RuntimeError, NotImplementedError, ValueError, AttributeError, TypeError) as exc:
                msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                notes.append(f"{prim}: {label} is not available on {c.backend} ({msg[:160]}); trying the next")
                continue
            method[prim] = label
            if kind == "emulated":
                notes.append(f"{prim}: EMULATED as {label}; its busbw is the emulation's, below a native kernel's")
            elif kind == "list":
                notes.append(f"{prim}: measured with the tensor-list API ({label})")
        return fn
    raise ProfilerError(f"{prim}: no implementation works on backend {c.backend}")


def _primitive_ops(
    c: _Comm, prim: str, nbytes: int, dtype: Any, notes: list[str], method: dict[str, str], emulate: bool = False
) -> Any:
    """(callable, actual per-rank bytes) for one primitive at one size, preferring the native API.

    ``emulate`` uses only the emulation (``--emulate PRIM``), to exercise it or compare it with the native one.
    """
    torch, dist = c.torch, c.dist
    n, r = c.world, c.rank
    esize = torch.tensor([], dtype=dtype).element_size()
    numel = max(n, (nbytes // esize) // n * n)
    size = numel * esize

    def buf(k: int) -> Any:
        # zeros: in-place reductions repeated thousands of times stay finite (ones would overflow to inf)
        return torch.zeros(k, dtype=dtype, device=c.device)

    def first_working(cands: list[tuple[str, Callable[[], object], str]]) -> Callable[[], object]:
        return _first_working(c, prim, cands, notes, method, emulate)

    # torch >= 2.10 renamed the tensor-in/tensor-out forms (*_single); the old names still work, with a warning
    ag_native = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rs_native = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if prim == "all_reduce":
        b = buf(numel)
        return first_working([("all_reduce", lambda: dist.all_reduce(b), "native")]), size
    if prim == "all_gather":
        out, inp = buf(numel), buf(numel // n)
        chunks = list(out.chunk(n))

        def ag_via_allreduce() -> None:
            out.zero_()
            chunks[r].copy_(inp)
            dist.all_reduce(out)

        return first_working(
            [
                (ag_native.__name__, lambda: ag_native(out, inp), "native"),
                ("all_gather", lambda: dist.all_gather(chunks, inp), "list"),
                (
                    "all_reduce of a zero-padded buffer (moves ~2x the data of an all-gather)",
                    ag_via_allreduce,
                    "emulated",
                ),
            ]
        ), size
    if prim == "reduce_scatter":
        inp, out = buf(numel), buf(numel // n)
        in_chunks = list(inp.chunk(n))

        def rs_via_allreduce() -> None:
            dist.all_reduce(inp)
            out.copy_(in_chunks[r])

        return first_working(
            [
                (rs_native.__name__, lambda: rs_native(out, inp), "native"),
                ("reduce_scatter", lambda: dist.reduce_scatter(out, in_chunks), "list"),
                ("all_reduce + local slice (moves ~2x the data of a reduce-scatter)", rs_via_allreduce, "emulated"),
            ]
        ), size
    if prim == "all_to_all":
        inp, out = buf(numel), buf(numel)
        ins, outs = list(inp.chunk(n)), list(out.chunk(n))

        def a2a_p2p() -> None:
            ops = []
            for p in range(n):
                if p == r:
                    outs[p].copy_(ins[p])
                    continue
                ops.append(dist.P2POp(dist.isend, ins[p], p))
                ops.append(dist.P2POp(dist.irecv, outs[p], p))
            for w in dist.batch_isend_irecv(ops):
                w.wait()

        return first_working(
            [
                ("all_to_all_single", lambda: dist.all_to_all_single(out, inp), "native"),
                ("all_to_all", lambda: dist.all_to_all(outs, ins), "list"),
                ("pairwise isend/irecv", a2a_p2p, "emulated"),
            ]
        ), size
    if prim == "p2p":
        b = buf(numel)
        half = n // 2
        # rank r < n/2 sends to r + n/2: across the node boundary when the ranks span two equal hosts,
        # and every pair at once, as at a pipeline boundary where all ranks of a stage send together
        role = "send" if r < half else "recv" if r < 2 * half else "idle"
        peer = r + half if role == "send" else r - half

        def p2p() -> None:
            if role == "send":
                dist.send(b, peer)
            elif role == "recv":
                dist.recv(b, peer)

        return first_working([("send/recv, rank r -> r + n/2, all pairs at once", p2p, "native")]), size
    raise ProfilerError(f"unknown primitive {prim!r}")


def _measure(c: _Comm, fn: Callable[[], object], *, warmup: int, repeats: int, target_s: float) -> list[float]:
    """Per-sample seconds per call, the slowest rank's; ranks agree on the batch size first (no deadlock)."""
    for _ in range(warmup):
        fn()
    c.sync()
    t0 = time.perf_counter()
    fn()
    c.sync()
    probe = c.max_over_ranks([time.perf_counter() - t0])[0]
    number = max(1, min(1000, int(target_s / probe))) if probe > 0 else 1000
    t = time_fn(fn, warmup=0, repeats=repeats, sync=c.sync, number=number)
    return c.max_over_ranks(t.samples)


def run_collectives(
    *,
    quick: bool = False,
    link: str | None = None,
    backend: str | None = None,
    sizes: Sequence[int] | None = None,
    primitives: Sequence[str] = PRIMITIVES,
    emulate: Sequence[str] = (),
) -> dict[str, Any] | None:
    """Measure every primitive at every size; return the document on rank 0, None elsewhere.

    Must run in every rank of a launcher-started job (it initialises the default process group from the
    environment if none exists, and leaves it initialised).
    """
    if link is not None and link not in LINKS:
        raise ProfilerError(f"unknown link class {link!r}; choose intra, inter or cross", field="link")
    c = _Comm(backend)
    torch, dist = c.torch, c.dist
    dtype = torch.float32 if c.backend == "gloo" else torch.bfloat16
    sizes = tuple(sizes) if sizes else default_sizes(c.backend, quick)
    warmup, repeats, target = (2, 5, 0.005) if quick else (5, 20, 0.02)
    hosts: list[Any] = [None] * c.world
    dist.all_gather_object(hosts, socket.gethostname())
    unique_hosts = sorted(set(hosts))
    notes: list[str] = []
    same_host = c.local_world == c.world
    auto_link = "intra" if same_host else "inter"
    basis = f"LOCAL_WORLD_SIZE {c.local_world} {'==' if same_host else '!='} WORLD_SIZE {c.world}"
    if (len(unique_hosts) == 1) != same_host:
        notes.append(f"{basis} but the ranks report {len(unique_hosts)} host name(s): {unique_hosts}")
    chosen_link = link or auto_link
    if link and link != auto_link:
        basis = f"--link {link} (auto would be {auto_link}: {basis})"
    method: dict[str, str] = {}
    tables: dict[str, dict[str, Any]] = {}
    t_start = time.perf_counter()
    for prim in primitives:
        if prim not in PRIMITIVES:
            raise ProfilerError(f"unknown primitive {prim!r}")
        xs: list[float] = []
        ys: list[float] = []
        med: list[float] = []
        p10: list[float] = []
        p90: list[float] = []
        factor = BUS_FACTOR[prim](c.world if prim != "p2p" else 2)
        for s in sizes:
            fn, actual = _primitive_ops(c, prim, s, dtype, notes, method, emulate=prim in emulate)
            samples = _measure(c, fn, warmup=warmup, repeats=repeats, target_s=target)
            m = percentile(samples, 50.0)
            if xs and actual <= xs[-1]:
                continue  # rounding to a multiple of the world size merged two sizes
            xs.append(float(actual))
            med.append(m)
            p10.append(percentile(samples, 10.0))
            p90.append(percentile(samples, 90.0))
            ys.append(factor * actual / m / 1e9)
        tables[prim] = {
            "x": xs,
            "y": ys,
            "time_s": med,
            "p10_s": p10,
            "p90_s": p90,
            "bus_factor": factor,
            "method": method.get(prim, ""),
        }
        if c.rank == 0:
            log.info("%-14s %s", prim, "  ".join(f"{x / 1024:g}KiB:{y:.3g}" for x, y in zip(xs, ys)) + " GB/s busbw")
    wall = time.perf_counter() - t_start
    if c.rank != 0:
        return None
    versions = _library_versions(torch, c.kind)
    return {
        "format": COLLECTIVES_FORMAT,
        "link": chosen_link,
        "link_basis": basis,
        "world_size": c.world,
        "local_world_size": c.local_world,
        "hosts": unique_hosts,
        "backend": c.backend,
        "device": c.kind,
        "hardware": torch.cuda.get_device_name(c.device) if c.kind == "cuda" else c.kind,
        "dtype": str(dtype).removeprefix("torch."),
        "mode": "quick" if quick else "full",
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "wall_s": round(wall, 2),
        "versions": versions,
        "convention": "nccl-tests: x = per-rank buffer bytes ('size'), y = busbw GB/s = factor(n) * size / time",
        "p2p_pairs": f"rank r < {c.world // 2} sends to r + {c.world // 2}, all pairs at once",
        "tables": tables,
        "notes": notes,
    }


def _library_versions(torch: Any, kind: str) -> dict[str, str]:
    """torch, and on CUDA/ROCm builds the collective library and toolkit versions, for the provenance."""
    versions: dict[str, str] = {"torch": str(torch.__version__)}
    if kind == "cuda":
        try:
            v = torch.cuda.nccl.version()
            versions["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
        if getattr(torch.version, "hip", None):
            versions["rocm_hip"] = str(torch.version.hip)
        else:
            versions["cuda"] = str(torch.version.cuda)
    return versions


def check_local_ranks(nproc_per_node: int) -> None:
    """Collectives need two ranks at least (checked before a profile starts measuring, and here)."""
    if nproc_per_node < 2:
        raise ProfilerError(f"collectives need at least 2 local ranks, got {nproc_per_node}", field="nproc_per_node")


def launch_local_collectives(
    nproc_per_node: int,
    out: str | Path,
    *,
    quick: bool = False,
    link: str | None = None,
    backend: str = "auto",
    max_bytes: int | None = None,
    emulate: Sequence[str] = (),
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Run this module on ``nproc_per_node`` local ranks through the PyTorch launcher; return the JSON document.

    For one host only (``--standalone`` picks a free port): the CLI's ``profile`` can measure the intra-node
    tables in the same command. Multi-node runs need the launcher on every node, which the user starts.
    """
    check_local_ranks(nproc_per_node)
    if link is not None and link not in LINKS:
        raise ProfilerError(f"unknown link class {link!r}; choose intra, inter or cross", field="link")
    outp = Path(out)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc_per_node}"]
    cmd += ["-m", "hapmoe_milp.profiler.collectives", "--out", str(outp), "--backend", backend]
    if quick:
        cmd.append("--quick")
    if link:
        cmd += ["--link", link]
    if max_bytes is not None:
        cmd += ["--max-bytes", str(int(max_bytes))]
    for prim in emulate:
        cmd += ["--emulate", prim]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    log.info("running %s", " ".join(cmd))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise ProfilerError(f"collectives run exceeded {timeout_s} s: {' '.join(cmd)}") from None
    except OSError as exc:
        raise ProfilerError(f"cannot start the PyTorch launcher: {exc}") from None
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-15:])
        raise ProfilerError(f"collectives run failed (exit {r.returncode}):\n{tail}")
    return load_collectives(outp)


def load_collectives(path: str | Path) -> dict[str, Any]:
    """Read and check a collectives JSON written by this module."""
    p, doc = read_json_object(path)
    if doc.get("format") != COLLECTIVES_FORMAT:
        raise ProfilerError(f"not a collectives measurement (expected format {COLLECTIVES_FORMAT!r})", source=str(p))
    if doc.get("link") not in LINKS:
        raise ProfilerError(f"link must be one of {LINKS}, got {doc.get('link')!r}", source=str(p), field="link")
    tables = doc.get("tables")
    if not isinstance(tables, dict):
        raise ProfilerError("missing tables", source=str(p), field="tables")
    for prim in PRIMITIVES:
        t = tables.get(prim)
        if not isinstance(t, dict) or not t.get("x") or len(t.get("x", [])) != len(t.get("y", [])):
            raise ProfilerError(f"{prim} is missing or has mismatched x/y", source=str(p), field=f"tables.{prim}")
    doc.setdefault("origin", str(p))
    return doc


def cross_link_from_collectives(doc: dict[str, Any]) -> dict[str, Any]:
    """An alpha-beta fit of the measured p2p times, in the cluster file's ``cross_link`` fields.

    ``t(S) = alpha + S / B``: least squares over the measured sizes. Cross-type traffic is p2p between
    pipeline stages, so this is what a cluster's ``cross_link`` (bandwidth_GBps, latency_us) should hold.
    """
    t = doc["tables"]["p2p"]
    xs, ts = [float(v) for v in t["x"]], [float(v) for v in t["time_s"]]
    if len(xs) < 2:
        raise ProfilerError("a p2p fit needs at least two message sizes")
    mx, mt = sum(xs) / len(xs), sum(ts) / len(ts)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - mt) for x, y in zip(xs, ts)) / sxx
    alpha = max(0.0, mt - slope * mx)
    bw = 1.0 / slope / 1e9 if slope > 0 else max(float(y) for y in t["y"])
    return {
        "bandwidth_GBps": float(f"{bw:.4g}"),
        "latency_us": float(f"{alpha * 1e6:.4g}"),
        "source": f"profiled p2p, {doc.get('backend')} over {doc.get('hosts')} on {doc.get('date')} "
        "(alpha-beta least squares)",
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m torch.distributed.run --nproc-per-node N -m hapmoe_milp.profiler.collectives",
        description="Measure collective bus bandwidth vs message size (nccl-tests conventions).",
    )
    ap.add_argument("--out", required=True, type=Path, help="JSON file written by rank 0")
    ap.add_argument("--quick", action="store_true", help="few sizes, few repeats")
    ap.add_argument("--link", choices=LINKS, default=None, help="link class label (default: from LOCAL_WORLD_SIZE)")
    ap.add_argument("--backend", choices=("auto", "nccl", "hccl", "gloo"), default="auto")
    ap.add_argument("--max-bytes", type=int, default=None, help="largest per-rank message (bytes)")
    ap.add_argument(
        "--emulate",
        action="append",
        default=[],
        choices=("all_gather", "reduce_scatter", "all_to_all"),
        help="skip the native API of this primitive and time its emulation (repeatable)",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        sizes = None
        if args.max_bytes is not None:
            env_backend = "gloo" if args.backend == "gloo" else "nccl"
            sizes = [s for s in default_sizes(env_backend, args.quick) if s <= args.max_bytes] or [KIB]
        doc = run_collectives(quick=args.quick, link=args.link, backend=args.backend, sizes=sizes, emulate=args.emulate)
        if doc is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
            log.info(
                "wrote %s: %s link, %d ranks on %d host(s), backend %s, %.1f s",
                args.out,
                doc["link"],
                doc["world_size"],
                len(doc["hosts"]),
                doc["backend"],
                doc["wall_s"],
            )
            for n in doc["notes"]:
                log.info("note: %s", n)
    except HapmoeError as exc:
        log.error("error: %s", exc)
        return 2
    finally:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
