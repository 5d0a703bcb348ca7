"""Device specs: capacity, peaks, fabric, and the lookup tables the cost model reads.

A device file is either shipped (``provenance: datasheet+public-benchmarks``, every number with a
source or marked as an assumption) or written by ``hapmoe-milp profile`` (``provenance: profiled``,
with host, date and tool versions). Both have the same schema so one can replace the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hapmoe_milp.errors import SpecError
from hapmoe_milp.limits import (
    MAX_DEVICES_PER_NODE,
    RANGE_EFFICIENCY,
    RANGE_LINK_GBPS,
    RANGE_MEMORY_GBPS,
    RANGE_MEMORY_GIB,
    RANGE_NIC_GBITPS,
    RANGE_PEAK_TFLOPS,
    RANGE_PRICE_PER_HOUR,
)
from hapmoe_milp.specs._fields import Fields, check_name, load_document
from hapmoe_milp.specs.memory_terms import MemoryTerms, memory_terms_from_fields
from hapmoe_milp.specs.runtime import RuntimeParams, runtime_from_fields
from hapmoe_milp.specs.tables import Table, table_from_fields

PRIMITIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
LINK_CLASSES = ("intra", "inter")
FABRICS = ("switch", "mesh", "pcie")
PROVENANCES = ("datasheet+public-benchmarks", "profiled", "calibrated")
Precision = Literal["bf16", "fp8"]


@dataclass(frozen=True)
class IntraNode:
    """Scale-up fabric. ``mesh`` (MI300X, 910B) means one direct link per pair and no switch, so a group
    of n devices can use at most (n-1) links; ``switch`` (NVSwitch) gives every pair the full rate."""

    fabric: str
    per_device_GBps: float
    per_pair_GBps: float

    def group_bandwidth_fraction(self, n: int, devices_per_node: int) -> float:
        """Fraction of the full-node collective bandwidth that an n-device group inside a node gets."""
        if self.fabric != "mesh" or n >= devices_per_node:
            return 1.0
        usable = min(self.per_device_GBps, (n - 1) * self.per_pair_GBps)
        full = min(self.per_device_GBps, (devices_per_node - 1) * self.per_pair_GBps)
        return usable / full


@dataclass(frozen=True)
class DeviceSpec:
    id: str
    name: str
    vendor: str
    provenance: str
    memory_gib: float
    memory_bandwidth_GBps: float
    peak_tflops: dict[str, float]
    devices_per_node: int
    intra: IntraNode
    nic_Gbps: float
    gemm_efficiency: Table
    attention_efficiency: Table
    attention_bwd_efficiency: Table
    collectives: dict[str, dict[str, Table]]
    runtime: RuntimeParams = field(default_factory=RuntimeParams)
    runtime_defaulted: tuple[str, ...] = ()  # runtime parameters the file did not set (defaults are assumptions)
    sources: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()
    profiled: dict[str, str] = field(default_factory=dict)
    calibration: dict[str, Any] = field(default_factory=dict)  # runs, fitted parameters, residuals (calibrated)
    price_per_hour: float | None = None
    origin: str = ""
    memory: MemoryTerms = field(default_factory=MemoryTerms)  # outside-the-allocator terms (cost/memory.py)

    def runtime_basis(self, name: str) -> str:
        """Where a runtime term's value comes from: ``source`` (read off a benchmark), ``derived``,
        ``assumed``, ``measured`` (profiled) or ``calibrated``; unset terms are ``assumed`` defaults.

        Shipped tables list every derived/assumed number under ``assumptions`` as
        ``runtime.<name> = <value> (<kind>): ...``; the fitter trusts a term accordingly.
        """
        if self.provenance == "calibrated":
            return "calibrated"
        if name in self.runtime_defaulted:
            return "assumed"
        prefix = f"runtime.{name} = "
        for a in self.assumptions:
            if a.startswith(prefix):
                for kind in ("assumed", "measured", "derived"):
                    if f"({kind})" in a:
                        return kind
        return "measured" if self.provenance == "profiled" else "source"

    @property
    def memory_bound_efficiency(self) -> float:
        """Achieved fraction of peak HBM bandwidth in memory-bound passes (``runtime.memory_efficiency``)."""
        return self.runtime.memory_efficiency

    def peak(self, precision: str = "bf16") -> float:
        """Dense peak TFLOP/s for the precision; V100-class parts without BF16 fall back to FP16."""
        if precision == "fp8":
            if "fp8" in self.peak_tflops:
                return self.peak_tflops["fp8"]
            return self.peak("bf16")
        if "bf16" in self.peak_tflops:
            return self.peak_tflops["bf16"]
        return self.peak_tflops["fp16"]

    @property
    def dense_peak_tflops(self) -> float:
        return self.peak("bf16")

    @property
    def nic_GBps(self) -> float:
        return self.nic_Gbps / 8.0

    def busbw(self, primitive: str, link: str, nbytes: float) -> float:
        """Collective bus bandwidth (GB/s) for a message of ``nbytes`` per rank on a link class."""
        return self.collectives[link][primitive](nbytes)

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "vendor": self.vendor,
            "memory_gib": self.memory_gib,
            "bf16_tflops": self.peak("bf16"),
            "fp8_tflops": self.peak_tflops.get("fp8"),
            "devices_per_node": self.devices_per_node,
            "fabric": self.intra.fabric,
            "intra_GBps": self.intra.per_device_GBps,
            "pair_GBps": self.intra.per_pair_GBps,
            "nic_Gbps": self.nic_Gbps,
            "provenance": self.provenance,
            "origin": self.origin,
        }

    def describe(self) -> dict[str, Any]:
        """:meth:`summary` plus where every number comes from (sources, assumptions, the basis of each
        runtime term, profiling host, calibration runs) -- what ``devices NAME`` shows. Not the file format
        (the lookup tables are left out)."""
        d = self.summary()
        d["origin"] = self.origin
        d["sources"] = list(self.sources)
        d["assumptions"] = list(self.assumptions)
        if self.profiled:
            d["profiled"] = dict(self.profiled)
        d["runtime"] = {k: {"value": v, "basis": self.runtime_basis(k)} for k, v in self.runtime.to_dict().items()}
        if self.calibration:
            d["calibration"] = {k: v for k, v in self.calibration.items() if k != "runs"} | {
                "runs": [r.get("id") for r in self.calibration.get("runs", [])]
            }
        return d


def device_from_dict(doc: dict[str, Any], source: str) -> DeviceSpec:
    f = Fields(doc, source)
    did = check_name(f.str_("id"), source, "id")  # device ids become host names in launch files
    peaks_f = f.sub("peak_tflops")
    assert peaks_f is not None
    peaks: dict[str, float] = {}
    for k in ("bf16", "fp16", "fp8"):
        v = peaks_f.float_(k, None, within=RANGE_PEAK_TFLOPS, unit="TFLOP/s")
        if v is not None:
            peaks[k] = v
    peaks_f.reject_unknown(allowed_extra=("note", "tf32", "fp32"))
    if "bf16" not in peaks and "fp16" not in peaks:
        raise f.err("peak_tflops", "needs bf16 (or fp16 for parts without bf16)")
    intra_f = f.sub("intra_node")
    assert intra_f is not None
    intra = IntraNode(
        fabric=intra_f.choice("fabric", FABRICS),
        per_device_GBps=intra_f.float_("per_device_GBps", within=RANGE_LINK_GBPS, unit="GB/s"),
        per_pair_GBps=intra_f.float_("per_pair_GBps", within=RANGE_LINK_GBPS, unit="GB/s"),
    )
    intra_f.reject_unknown(allowed_extra=("note", "tech"))
    if intra.per_pair_GBps > intra.per_device_GBps * 1.0001:
        raise intra_f.err("per_pair_GBps", "cannot exceed per_device_GBps")
    tf = f.sub("tables")
    assert tf is not None
    gemm = table_from_fields(tf.sub("gemm_efficiency"), y_range=RANGE_EFFICIENCY)  # type: ignore[arg-type]
    attn = table_from_fields(tf.sub("attention_efficiency"), y_range=RANGE_EFFICIENCY)  # type: ignore[arg-type]
    attn_b = table_from_fields(tf.sub("attention_bwd_efficiency"), y_range=RANGE_EFFICIENCY)  # type: ignore[arg-type]
    mbe = tf.float_("memory_bound_efficiency", None, within=RANGE_EFFICIENCY)
    coll_f = tf.sub("collectives")
    assert coll_f is not None
    colls: dict[str, dict[str, Table]] = {}
    for link in LINK_CLASSES:
        lf = coll_f.sub(link)
        assert lf is not None
        colls[link] = {}
        for prim in PRIMITIVES:
            colls[link][prim] = table_from_fields(lf.sub(prim), y_range=RANGE_LINK_GBPS)  # type: ignore[arg-type]
        lf.reject_unknown(allowed_extra=("note",))
    coll_f.reject_unknown(allowed_extra=("note",))
    tf.reject_unknown(allowed_extra=("note",))
    # runtime terms; a table's memory_bound_efficiency (older schema, the profiler) seeds memory_efficiency
    base = RuntimeParams() if mbe is None else RuntimeParams(memory_efficiency=mbe)
    runtime, defaulted = runtime_from_fields(f.sub("runtime", None), base)
    if mbe is not None and "memory_efficiency" in defaulted:
        defaulted.remove("memory_efficiency")
    prov = f.choice("provenance", PROVENANCES)
    profiled: dict[str, str] = {}
    pf = f.sub("profiled", None)
    if pf is not None:
        profiled = {str(k): str(v) for k, v in pf.doc.items()}
        pf._seen.update(pf.doc)  # free-form
    if prov == "profiled" and not profiled:
        raise f.err("profiled", "a profiled table must record host, date and tool versions")
    calibration: dict[str, Any] = {}
    cf = f.sub("calibration", None)
    if cf is not None:
        calibration = dict(cf.doc)
        cf._seen.update(cf.doc)  # free-form record of the fit
    if prov == "calibrated" and not calibration.get("runs"):
        raise f.err("calibration", "a calibrated table must record the runs it was fitted to")
    sources = f.list_("sources", [])
    if prov != "profiled" and not sources:
        raise f.err("sources", "a shipped table must cite its sources")
    dev = DeviceSpec(
        id=did,
        name=f.str_("name"),
        vendor=f.str_("vendor"),
        provenance=prov,
        memory_gib=f.float_("memory_gib", within=RANGE_MEMORY_GIB, unit="GiB"),
        memory_bandwidth_GBps=f.float_("memory_bandwidth_GBps", within=RANGE_MEMORY_GBPS, unit="GB/s"),
        peak_tflops=peaks,
        devices_per_node=f.int_("devices_per_node", maximum=MAX_DEVICES_PER_NODE),
        intra=intra,
        nic_Gbps=f.float_("nic_Gbps", within=RANGE_NIC_GBITPS, unit="Gb/s"),
        gemm_efficiency=gemm,
        attention_efficiency=attn,
        attention_bwd_efficiency=attn_b,
        collectives=colls,
        runtime=runtime,
        runtime_defaulted=tuple(defaulted),
        sources=tuple(str(s) for s in sources),
        assumptions=tuple(str(s) for s in f.list_("assumptions", [])),
        profiled=profiled,
        calibration=calibration,
        price_per_hour=f.float_("price_per_hour", None, allow_zero=True, within=RANGE_PRICE_PER_HOUR),
        origin=source,
        memory=memory_terms_from_fields(f.sub("memory", None)),
    )
    f.reject_unknown(allowed_extra=("notes", "aliases", "confidence"))
    return dev


def load_device_file(path: str | Path) -> DeviceSpec:
    doc = load_document(path)
    return device_from_dict(doc, str(path))


def check_device_id(did: str, source: str, fld: str) -> None:
    if not did or any(c.isspace() for c in did):
        raise SpecError(f"invalid device id {did!r}", source=source, field=fld)
