"""Raw measurements -> a device file in exactly the schema of the shipped tables (``provenance: profiled``).

A profiled file must be a drop-in replacement for a shipped one (``--devices-dir``), so this writer
produces the same fields, units and table layout as ``tools/derive_device_tables.py`` and checks the result
with the real loader (:func:`hapmoe_milp.specs.device.device_from_dict`) before writing it.

Where every field comes from is recorded in ``assumptions``:

* measured here: peak-normalised ``gemm_efficiency`` and attention tables, ``memory_bandwidth_GBps``,
  ``memory_bound_efficiency``, ``memory_gib``; collectives from a collectives JSON (one per link class);
* not measurable by a single-host profiler -- ``intra_node`` (fabric, GB/s), ``nic_Gbps``,
  ``devices_per_node`` -- and link classes that were not measured: from :class:`DeviceOverrides` (the
  CLI), else from ``base`` (a shipped device of the same type), else synthesised from what was measured,
  with the synthesis spelled out.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from hapmoe_milp.cost.primitives import gemm_time
from hapmoe_milp.errors import SpecError
from hapmoe_milp.profiler import ProfilerError, read_json_object
from hapmoe_milp.profiler.collectives import PRIMITIVES, cross_link_from_collectives, load_collectives
from hapmoe_milp.profiler.kernels import MEASUREMENT_FORMAT
from hapmoe_milp.specs.device import FABRICS, LINK_CLASSES, DeviceSpec, check_device_id, device_from_dict
from hapmoe_milp.specs.runtime import PARAM_INFO, PARAMS, RuntimeParams
from hapmoe_milp.specs.tables import Table

log = logging.getLogger(__name__)

GIB = 1024**3
GROUPED_CONSISTENT = (0.8, 1.25)  # measured / cost-model time band called "consistent"
VENDOR_BY_BACKEND = {"cuda": "nvidia", "rocm": "amd", "npu": "huawei", "cpu": "cpu"}


@dataclass(frozen=True)
class DeviceOverrides:
    """Values given on the command line; each one wins over ``base`` and over synthesis."""

    name: str | None = None
    vendor: str | None = None
    devices_per_node: int | None = None
    nic_Gbps: float | None = None
    fabric: str | None = None
    per_device_GBps: float | None = None
    per_pair_GBps: float | None = None
    peak_tflops: float | None = None
    price_per_hour: float | None = None


# --------------------------------------------------------------------------------------------- YAML style
def sig(v: float, digits: int = 4) -> float:
    """Round to ``digits`` significant digits, as the shipped tables are."""
    return float(f"{v:.{digits}g}")


class _Flow(list):  # type: ignore[type-arg]
    """A list written ``[a, b, c]``."""


class _ExpFlow(_Flow):
    """A flow list of floats in exponent form (bytes, FLOPs), readable back as floats by PyYAML."""


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _exp_text(v: float) -> str:
    mant, exp = f"{v:.12e}".split("e")
    mant = mant.rstrip("0")
    if mant.endswith("."):
        mant += "0"
    return f"{mant}e{exp}"


def _repr_float(dumper: yaml.SafeDumper, data: float) -> yaml.Node:
    if data != 0 and math.isfinite(data) and (abs(data) >= 1e5 or abs(data) < 1e-3):
        return dumper.represent_scalar("tag:yaml.org,2002:float", _exp_text(data))
    return dumper.represent_scalar("tag:yaml.org,2002:float", repr(data))


_Dumper.add_representer(_Flow, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))
_Dumper.add_representer(
    _ExpFlow,
    lambda d, v: yaml.SequenceNode(
        "tag:yaml.org,2002:seq",
        [yaml.ScalarNode("tag:yaml.org,2002:float", _exp_text(float(x))) for x in v],
        flow_style=True,
    ),
)
_Dumper.add_representer(float, _repr_float)


def _table(xs: Sequence[float], ys: Sequence[float], x_unit: str, y_unit: str, note: str, ext: str) -> dict[str, Any]:
    if x_unit == "tokens":
        x: list[Any] = _Flow(int(v) for v in xs)
    else:
        x = _ExpFlow(float(v) for v in xs)
    return {
        "x": x,
        "y": _Flow(sig(float(v)) for v in ys),
        "extrapolate": ext,
        "x_unit": x_unit,
        "y_unit": y_unit,
        "note": note,
    }


def _table_from_spec(t: Table, note: str) -> dict[str, Any]:
    return _table(t.x, t.y, t.x_unit or "bytes", t.y_unit or "GBps_busbw", note, t.extrapolate)


# --------------------------------------------------------------------------------------------- raw measurements
def save_measurements(measurements: Mapping[str, Any], path: str | Path) -> Path:
    """Keep the raw profile (JSON) so tables can be re-written -- other base, peak, overrides -- without re-running."""
    _check_measurements(measurements)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(dict(measurements), indent=1) + "\n", encoding="utf-8")
    return p


def load_measurements(path: str | Path) -> dict[str, Any]:
    """Read raw measurements written by :func:`save_measurements`."""
    p, doc = read_json_object(path)
    try:
        _check_measurements(doc)
    except ProfilerError as exc:
        raise ProfilerError(exc.detail, source=str(p)) from None
    return doc


# --------------------------------------------------------------------------------------------- builders
def _check_measurements(m: Mapping[str, Any]) -> None:
    if m.get("format") != MEASUREMENT_FORMAT:
        raise ProfilerError(
            f"not a profiler measurement (expected format {MEASUREMENT_FORMAT!r}, got {m.get('format')!r})"
        )
    for key in ("gemm", "attention", "memory", "usable_memory", "peak_tflops", "profiled"):
        if not m.get(key):
            raise ProfilerError(f"measurement has no {key!r} section")


def _resolve_peak(
    m: Mapping[str, Any], ov: DeviceOverrides, base: DeviceSpec | None, asm: list[str]
) -> tuple[str, float]:
    """(peak key, peak TFLOP/s) used to normalise the efficiency tables."""
    key = "fp16" if m.get("dtype") == "fp16" else "bf16"
    if ov.peak_tflops is not None:
        asm.append(f"peak_tflops.{key} = {ov.peak_tflops:g}: given on the command line")
        peak = float(ov.peak_tflops)
    else:
        peak = float(m["peak_tflops"][key])
        asm.extend(str(a) for a in m.get("assumptions", []) if str(a).startswith("peak_tflops"))
    if base is not None and abs(base.peak(key) - peak) > 0.05 * base.peak(key):
        asm.append(
            f"peak_tflops.{key} = {peak:.4g} differs from base {base.id}'s {base.peak(key):g}: efficiencies are "
            "fractions of the profiled peak, so compare achieved TFLOP/s, not efficiencies"
        )
    return key, peak


def _gemm_table(m: Mapping[str, Any], peak: float, ext: str, notes: list[str]) -> dict[str, Any]:
    by_flops: dict[float, list[float]] = {}
    shapes: dict[float, list[str]] = {}
    for p in m["gemm"]:
        f = float(p["flops"])
        by_flops.setdefault(f, []).append(float(p["tflops"]))
        shapes.setdefault(f, []).append(f"{p['m']}x{p['n']}x{p['k']}")
    xs = sorted(by_flops)
    raw = [statistics.median(by_flops[x]) / peak for x in xs]
    if max(raw) > 1.0:
        notes.append(f"gemm_efficiency: measured up to {max(raw):.3f} of the peak; entries capped at 1.0")
    ys = [min(1.0, v) for v in raw]
    n_shapes = max(len(v) for v in shapes.values())
    note = (
        f"measured {m['dtype']} torch.matmul, median over {n_shapes} shape(s) (m x n x k) per FLOP count, "
        f"fraction of {peak:.4g} TFLOP/s; shapes: " + "; ".join(f"{x:.3g}: {', '.join(shapes[x])}" for x in xs)
    )
    return _table(xs, ys, "flops", "fraction_of_peak", note, ext)


def _attention_tables(m: Mapping[str, Any], peak: float, ext: str, notes: list[str]) -> tuple[dict, dict]:
    pts = sorted(m["attention"], key=lambda p: p["seq"])
    xs = [int(p["seq"]) for p in pts]
    fwd = [p["fwd_tflops"] / peak for p in pts]
    bwd = [p["bwd_tflops"] / peak for p in pts]
    if max(fwd + bwd) > 1.0:
        notes.append(f"attention: measured up to {max(fwd + bwd):.3f} of the peak; entries capped at 1.0")
    p0 = pts[0]
    shape = f"batch {p0['batch']}, {p0['heads']} heads, head dim {p0['head_dim']}"
    fwd_t = _table(
        xs,
        [min(1.0, v) for v in fwd],
        "tokens",
        "fraction_of_peak",
        f"measured: scaled_dot_product_attention(is_causal=True) forward, {shape}; FLOPs = 2*b*S*S*heads*head_dim "
        f"(as cost/model.py counts causal attention); fraction of {peak:.4g} TFLOP/s",
        ext,
    )
    bwd_t = _table(
        xs,
        [min(1.0, v) for v in bwd],
        "tokens",
        "fraction_of_peak",
        f"measured: backward of the same (autograd.grad on q, k, v); FLOPs = 2.5 x forward; fraction of {peak:.4g}",
        ext,
    )
    return fwd_t, bwd_t


def _coll_docs(collectives: Sequence[str | Path | Mapping[str, Any]]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for c in collectives:
        if isinstance(c, Mapping):
            d = dict(c)
            d.setdefault("origin", "<in-memory>")
            docs.append(d)
        else:
            docs.append(load_collectives(c))
    return docs


def _coll_tables_from_doc(doc: Mapping[str, Any], ext: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for prim in PRIMITIVES:
        t = doc["tables"][prim]
        xs, ys = [float(v) for v in t["x"]], [float(v) for v in t["y"]]
        if any(y <= 0 or not math.isfinite(y) for y in ys):
            raise ProfilerError(f"{prim}: non-positive or non-finite busbw in {doc.get('origin')}")
        note = (
            f"measured: {t.get('method') or prim}, {doc['world_size']} ranks on {len(doc.get('hosts', []))} host(s), "
            f"{doc['backend']} {doc.get('dtype', '')}, nccl-tests busbw (factor {t.get('bus_factor', 1):.3g})"
        )
        out[prim] = _table(xs, ys, "bytes", "GBps_busbw", note, ext)
    return out


def build_device_document(
    measurements: Mapping[str, Any],
    *,
    device_name: str,
    base: DeviceSpec | None = None,
    collectives: Sequence[str | Path | Mapping[str, Any]] = (),
    overrides: DeviceOverrides | None = None,
    extrapolate: str = "clamp",
) -> tuple[dict[str, Any], list[str]]:
    """(document, header comment lines) for a profiled device file; checked with the real loader.

    ``extrapolate`` is written into every table: ``clamp`` (as the shipped tables) lets the cost model ask
    outside the measured range and get the edge value, ``error`` refuses. Every value that was not measured
    here is listed under ``assumptions``, in the order the sections below decide them.
    """
    _check_measurements(measurements)
    m = measurements
    ov = overrides or DeviceOverrides()
    did = device_name.lower()
    check_device_id(did, "profile", "device_name")
    if extrapolate not in ("clamp", "error"):
        raise ProfilerError(f"extrapolate must be clamp or error, got {extrapolate!r}")
    asm: list[str] = []
    notes: list[str] = [str(n) for n in m.get("notes", [])]
    backend = str(m.get("backend", ""))

    peak, peaks = _peak_section(m, ov, base, asm)
    gemm_t = _gemm_table(m, peak, extrapolate, notes)
    attn_t, attn_b = _attention_tables(m, peak, extrapolate, notes)
    mem, usable, mbe = m["memory"], m["usable_memory"], min(1.0, float(m["memory"]["memory_bound_efficiency"]))
    _memory_assumptions(mem, usable, mbe, asm)
    coll, by_link, provenance_coll = _collectives_section(collectives, base, backend, extrapolate, notes, asm)
    node = _node_section(m, ov, base, backend, coll, by_link.get("intra"), asm)
    vendor = ov.vendor or (base.vendor if base else VENDOR_BY_BACKEND.get(backend, backend or "unknown"))
    name = ov.name or f"{m.get('hardware', did)} (profiled)"

    profiled = {str(k): str(v) for k, v in m["profiled"].items()}
    profiled.update(provenance_coll)
    if base is not None:
        profiled["base"] = f"{base.id} ({base.origin})"
    doc: dict[str, Any] = {
        "id": did,
        "name": name,
        "vendor": vendor,
        "provenance": "profiled",
        "profiled": profiled,
        "sources": list(m.get("sources", [])),
        "notes": "",
        "memory_gib": sig(usable["usable_bytes"] / GIB),
        "memory_bandwidth_GBps": sig(float(mem["memory_bandwidth_GBps"])),
        "peak_tflops": peaks,
        **node,
        "assumptions": asm,
        "runtime": {},
        "tables": {
            "gemm_efficiency": gemm_t,
            "attention_efficiency": attn_t,
            "attention_bwd_efficiency": attn_b,
            "collectives": coll,
        },
    }
    doc["runtime"] = _runtime_section(m, doc, mbe, base, asm)
    if ov.price_per_hour is not None:
        doc["price_per_hour"] = float(ov.price_per_hour)
    if not doc["sources"]:
        del doc["sources"]
    # grouped GEMM vs the cost model on these very tables
    grouped_note = _grouped_note(m, _validate(doc))
    if grouped_note:
        notes.append(grouped_note)
    doc["notes"] = " | ".join(notes) if notes else "none"
    _validate(doc)
    header = [
        f"WRITTEN by hapmoe-milp profile (hapmoe_milp.profiler) on {profiled.get('host', '?')} at "
        f"{profiled.get('date', '?')}; provenance: profiled.",
        f"Device: {name} ({did}); backend {backend}, {m.get('dtype')}, {m.get('mode')} mode, "
        f"{profiled.get('tool', '')}.",
        "Measured: gemm/attention efficiencies, memory bandwidth + memory-bound efficiency, usable memory"
        + (f", collectives ({', '.join(sorted(by_link))})" if by_link else "")
        + ". Everything else is listed under `assumptions` with where it came from.",
        f"Tables {'clamp' if extrapolate == 'clamp' else 'refuse to extrapolate'} outside the measured range.",
    ]
    return doc, header


def _peak_section(
    m: Mapping[str, Any], ov: DeviceOverrides, base: DeviceSpec | None, asm: list[str]
) -> tuple[float, dict[str, Any]]:
    """(the peak the efficiencies are normalised by, the ``peak_tflops`` block)."""
    key, peak = _resolve_peak(m, ov, base, asm)
    peaks: dict[str, Any] = {key: sig(peak)}
    fp8 = m["peak_tflops"].get("fp8")
    if fp8 is not None and ov.peak_tflops is None:
        peaks["fp8"] = sig(float(fp8))
        asm.extend(str(a) for a in m.get("assumptions", []) if str(a).startswith("peak_tflops.fp8"))
    peaks["note"] = f"dense peak used to normalise the measured efficiencies ({m.get('peak_basis', 'user')})"
    return peak, peaks


def _memory_assumptions(mem: Mapping[str, Any], usable: Mapping[str, Any], mbe: float, asm: list[str]) -> None:
    ops = ", ".join(f"{o['op']} {o['fraction_of_copy']:.2f}" for o in mem.get("elementwise", []))
    asm.append(
        f"memory_bandwidth_GBps = {sig(mem['memory_bandwidth_GBps']):g}: measured large-copy bandwidth "
        f"((read + write) / time, {mem['copy_bytes'] / 2**20:.0f} MiB), not the datasheet figure"
    )
    asm.append(f"memory_bound_efficiency = {sig(mbe):g}: median fraction of the copy bandwidth of: {ops}")
    asm.append(f"memory_gib = {sig(usable['usable_bytes'] / GIB):g}: measured usable memory ({usable['method']})")


def _collectives_section(
    collectives: Sequence[str | Path | Mapping[str, Any]],
    base: DeviceSpec | None,
    backend: str,
    extrapolate: str,
    notes: list[str],
    asm: list[str],
) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, str]]:
    """(``collectives`` tables, the measured documents by link class, their provenance lines).

    Per link class: measured > copied from ``base`` > (CPU only) the other measured class; a cross-type
    measurement becomes a note for the cluster file, since a device table has no cross link."""
    by_link: dict[str, dict[str, Any]] = {}
    for d in _coll_docs(collectives):
        link = d["link"]
        if link == "cross":
            cl = cross_link_from_collectives(d)
            notes.append(
                f"cross-type link measured ({d.get('origin')}): put `cross_link: {{bandwidth_GBps: "
                f"{cl['bandwidth_GBps']}, latency_us: {cl['latency_us']}}}` in the cluster file ({cl['source']})"
            )
            continue
        if link in by_link:
            notes.append(f"collectives.{link}: several files given; using {d.get('origin')}")
        by_link[link] = d
        if backend and backend != "cpu" and d.get("backend") == "gloo":
            notes.append(f"collectives.{link} measured with gloo (CPU/TCP), not the accelerator's collective library")
    coll: dict[str, Any] = {
        "note": "nccl-tests bus bandwidth (busbw) per rank vs message bytes per rank; inter = same device type",
    }
    provenance: dict[str, str] = {}
    for link in LINK_CLASSES:
        if link in by_link:
            d = by_link[link]
            coll[link] = _coll_tables_from_doc(d, extrapolate)
            provenance[f"collectives_{link}"] = (
                f"{d['backend']} {d['world_size']} ranks on {','.join(map(str, d.get('hosts', [])))} "
                f"({d.get('date', '?')}, {d.get('mode', '?')}, {d.get('origin', '')})"
            )
        elif base is not None:
            coll[link] = {
                p: _table_from_spec(base.collectives[link][p], f"copied from {base.id} (not measured)")
                for p in PRIMITIVES
            }
            asm.append(f"collectives.{link}: not measured; copied from {base.id} ({base.origin})")
    for link in LINK_CLASSES:
        if link in coll:
            continue
        other = next((o for o in LINK_CLASSES if o in by_link), None)
        if backend != "cpu" or other is None:
            raise ProfilerError(
                f"no {link}-node collectives: run `python -m torch.distributed.run ... -m "
                f"hapmoe_milp.profiler.collectives --link {link} --out FILE` "
                f"{'on two hosts ' if link == 'inter' else ''}and pass the file, or pass a shipped --base "
                "device to copy them from"
            )
        coll[link] = _coll_tables_from_doc(by_link[other], extrapolate)
        asm.append(
            f"collectives.{link}: not measured; copied from the {other} gloo run (a CPU 'device' is a process "
            "and gloo talks TCP either way)"
        )
    return coll, by_link, provenance


def _pick(
    asm: list[str], base: DeviceSpec | None, label: str, override: Any, from_base: Any, synth: Any, why: str
) -> Any:
    """A value a single-host profiler cannot measure: given on the command line > the base's > synthesised,
    with an assumption line saying which."""

    def fmt(v: Any) -> str:
        return f"{v:g}" if isinstance(v, float) else str(v)

    if override is not None:
        asm.append(f"{label} = {fmt(override)}: given on the command line")
        return override
    if from_base is not None:
        asm.append(f"{label} = {fmt(from_base)}: copied from {base.id if base else '?'} (not measurable here)")
        return from_base
    asm.append(f"{label} = {fmt(synth)}: {why}")
    return synth


def _node_section(
    m: Mapping[str, Any],
    ov: DeviceOverrides,
    base: DeviceSpec | None,
    backend: str,
    coll: Mapping[str, Any],
    intra_doc: Mapping[str, Any] | None,
    asm: list[str],
) -> dict[str, Any]:
    """``devices_per_node``, ``intra_node`` and ``nic_Gbps`` of the document (see :func:`_pick`)."""
    if backend == "cpu" and intra_doc is not None:
        dpn_synth, dpn_why = (
            int(intra_doc["local_world_size"]),
            "the gloo run's ranks per host (a CPU device = a process)",
        )
    else:
        dpn_synth, dpn_why = int(m.get("device_count") or 1), "devices visible on the profiling host"
    dpn = int(
        _pick(asm, base, "devices_per_node", ov.devices_per_node, base and base.devices_per_node, dpn_synth, dpn_why)
    )
    if dpn < 1:
        raise ProfilerError(f"devices_per_node must be >= 1, got {dpn}")
    intra_big = max(max(coll["intra"][p]["y"]) for p in ("p2p", "all_gather"))
    fabric = _pick(
        asm,
        base,
        "intra_node.fabric",
        ov.fabric,
        base and base.intra.fabric,
        "switch",
        "assumed (every pair at full rate)",
    )
    if fabric not in FABRICS:
        raise ProfilerError(f"fabric must be one of {', '.join(FABRICS)}, got {fabric!r}", field="fabric")
    per_dev = float(
        _pick(
            asm,
            base,
            "intra_node.per_device_GBps",
            ov.per_device_GBps,
            base and base.intra.per_device_GBps,
            sig(intra_big),
            "largest measured intra-node busbw (p2p / all-gather), a lower bound of the link rate",
        )
    )
    per_pair = float(
        _pick(
            asm,
            base,
            "intra_node.per_pair_GBps",
            ov.per_pair_GBps,
            base and base.intra.per_pair_GBps,
            per_dev,
            "= per_device_GBps (switch assumption)",
        )
    )
    nic = float(
        _pick(
            asm,
            base,
            "nic_Gbps",
            ov.nic_Gbps,
            base and base.nic_Gbps,
            sig(max(coll["inter"]["p2p"]["y"]) * 8),
            "8 x the largest inter-node p2p busbw (GB/s -> Gb/s), a lower bound of the NIC rate",
        )
    )
    return {
        "devices_per_node": dpn,
        "intra_node": {
            "fabric": fabric,
            "per_device_GBps": sig(per_dev),
            "per_pair_GBps": sig(min(per_pair, per_dev)),
            "note": "unidirectional GB/s; per_pair = what one pair of devices can use (its direct links on a mesh)",
        },
        "nic_Gbps": sig(nic),
    }


def _clamp(name: str, v: float) -> float:
    info = PARAM_INFO[name]
    return min(info.hi, max(info.lo, v))


def _runtime_section(
    m: Mapping[str, Any], doc: dict[str, Any], mbe: float, base: DeviceSpec | None, asm: list[str]
) -> dict[str, Any]:
    """Measured runtime terms (HBM fraction, launch and sync cost, grouped-GEMM rows); the rest from the
    base table (or the defaults), each listed under ``assumptions`` with where it came from."""
    rt: dict[str, Any] = {"note": "runtime terms; measured ones by hapmoe-milp profile, the rest see assumptions"}
    measured: dict[str, float] = {"memory_efficiency": _clamp("memory_efficiency", mbe)}
    host = m.get("host")
    if host:
        measured["launch_us"] = _clamp("launch_us", float(host["launch_us"]))
        measured["sync_us"] = _clamp("sync_us", float(host["sync_us"]))
    rows = _fit_rows_half(m, doc)
    if rows is not None:
        measured["grouped_rows_half"] = rows
    fallback = base.runtime if base is not None else RuntimeParams()
    for p in PARAMS:
        if p.name in measured:
            rt[p.name] = sig(measured[p.name])
        else:
            v = getattr(fallback, p.name)
            rt[p.name] = sig(v)
            where = f"from the base table {base.id}" if base is not None else "the built-in default"
            asm.append(f"runtime.{p.name} = {sig(v):g} (assumed): not measured by the profiler; {where}")
    if host:
        asm.append(
            f"runtime.launch_us = {rt['launch_us']:g} (measured): host time to issue one tiny kernel, an upper bound "
            f"of the device idle per kernel in training; runtime.sync_us = {rt['sync_us']:g} (measured): one "
            ".item() after a kernel, minus two launches"
        )
    return rt


def _fit_rows_half(m: Mapping[str, Any], doc: dict[str, Any]) -> float | None:
    """``grouped_rows_half`` that makes ``gemm_time(groups=E)`` on this table match the measured grouped
    GEMMs best (least squares on log times, over a log grid inside the physical range)."""
    pts = m.get("grouped_gemm") or []
    if len(pts) < 2:
        return None
    draft = dict(doc)
    draft["runtime"] = {"grouped_rows_half": 1.0}
    dev = _validate(draft)
    info = PARAM_INFO["grouped_rows_half"]
    best: tuple[float, float] | None = None
    r = info.lo
    while r <= info.hi * 1.0001:
        d = dev if r == info.lo else replace(dev, runtime=replace(dev.runtime, grouped_rows_half=r))
        err = 0.0
        for p in pts:
            pred = gemm_time(d, p["tokens_per_expert"], p["ffn"], p["hidden"], "bf16", groups=p["experts"])
            err += math.log(p["median_s"] / pred) ** 2
        if best is None or err < best[0]:
            best = (err, r)
        r *= 1.25
    return None if best is None else best[1]


def _validate(doc: dict[str, Any]) -> DeviceSpec:
    try:
        return device_from_dict(doc, "<profiled>")
    except SpecError as exc:
        raise ProfilerError(f"the written table would not load: {exc}") from None


def _grouped_note(m: Mapping[str, Any], dev: DeviceSpec) -> str:
    """Does the cost model's ``gemm_time(groups=E)`` on these tables reproduce the measured grouped GEMMs?"""
    pts = m.get("grouped_gemm") or []
    if not pts:
        return ""
    prec = "bf16"
    parts: list[str] = []
    ratios: list[float] = []
    for p in pts:
        pred = gemm_time(dev, p["tokens_per_expert"], p["ffn"], p["hidden"], prec, groups=p["experts"])
        r = p["median_s"] / pred
        ratios.append(r)
        parts.append(f"{p['tokens_per_expert']}: {p['median_s'] * 1e3:.3g} ms vs {pred * 1e3:.3g} ms (x{r:.2f})")
    p0 = pts[0]
    lo, hi = GROUPED_CONSISTENT
    ok = all(lo <= r <= hi for r in ratios)
    verdict = (
        f"consistent (within x{lo:g}..x{hi:g}): the dense table prices routed experts well; the points are not added "
        "to gemm_efficiency, which they would only duplicate at the same total FLOPs"
        if ok
        else f"NOT consistent (outside x{lo:g}..x{hi:g}): the cost model mis-prices routed experts on this device "
        f"by up to x{max(max(ratios), 1 / min(ratios)):.2f}; kept out of gemm_efficiency"
    )
    return (
        f"grouped expert GEMM (torch.bmm, {p0['experts']} experts, h={p0['hidden']}, f={p0['ffn']}), "
        f"tokens per expert: measured vs cost-model gemm_time(groups={p0['experts']}) on this table: "
        + "; ".join(parts)
        + f" -- {verdict}"
    )


def render_device_document(doc: Mapping[str, Any], header: Sequence[str]) -> str:
    head = "".join(f"# {line}".rstrip() + "\n" for line in header)
    return head + yaml.dump(dict(doc), Dumper=_Dumper, sort_keys=False, width=110, allow_unicode=False)


def write_device_table(
    measurements: Mapping[str, Any],
    out_path: str | Path,
    *,
    device_name: str,
    base: DeviceSpec | None = None,
    collectives: Sequence[str | Path | Mapping[str, Any]] = (),
    overrides: DeviceOverrides | None = None,
    extrapolate: str = "clamp",
) -> Path:
    """Write ``<out_path>/<id>.yaml`` (``out_path`` a folder) or ``out_path``; return the written path.

    Catalog lookups (``--devices-dir``) find ``<id>.yaml``, so a file whose stem is not the id is only
    reachable by path; a warning says so.
    """
    doc, header = build_device_document(
        measurements,
        device_name=device_name,
        base=base,
        collectives=collectives,
        overrides=overrides,
        extrapolate=extrapolate,
    )
    out = Path(out_path)
    if out.is_dir() or (not out.suffix and not out.exists()):
        out = out / f"{doc['id']}.yaml"
    elif out.stem != doc["id"]:
        log.warning("%s: file stem is not the device id %r; --devices-dir lookups will not find it", out, doc["id"])
    text = render_device_document(doc, header)
    back = yaml.safe_load(text)
    _validate(back)  # what is on disk must load, not just the in-memory document
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    log.info("wrote %s", out)
    return out
