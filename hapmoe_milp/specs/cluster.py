"""Cluster specs: node groups of one device type each, and the link between device types.

Different vendors' collective libraries do not interoperate, so traffic between device types runs over
the shared scale-out network through a bridging layer. Its bandwidth is modelled as
``min(NIC_a, NIC_b) x efficiency`` with the efficiency an explicit, cited assumption per cluster.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hapmoe_milp.errors import SpecError
from hapmoe_milp.limits import (
    MAX_DEVICES,
    MAX_GROUPS,
    RANGE_EFFICIENCY,
    RANGE_LATENCY_US,
    RANGE_LINK_GBPS,
    RANGE_PRICE_PER_HOUR,
)
from hapmoe_milp.specs._fields import Fields, check_name, show, spec_hash
from hapmoe_milp.specs.device import DeviceSpec

INLINE_RE = re.compile(r"^\s*\d+\s*[x*]\s*[A-Za-z0-9_.-]+(\s*\+\s*\d+\s*[x*]\s*[A-Za-z0-9_.-]+)*\s*$", re.ASCII)

DEFAULT_CROSS_EFFICIENCY = 0.6
DEFAULT_CROSS_LATENCY_US = 30.0
CROSS_ASSUMPTION = (
    "assumed: cross-type traffic runs GPU-direct RDMA over the shared scale-out network at "
    "min(NIC_a, NIC_b) x 0.6 (reference/hardware.md §3.6 gives 0.5-0.8 for GPU-direct RDMA; "
    "no public measurement), 30 us latency"
)


@dataclass(frozen=True)
class NodeGroup:
    device: DeviceSpec
    nodes: int
    devices_per_node: int

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node


@dataclass(frozen=True)
class CrossLink:
    efficiency: float = DEFAULT_CROSS_EFFICIENCY
    latency_us: float = DEFAULT_CROSS_LATENCY_US
    bandwidth_GBps: float | None = None
    assumption: str = CROSS_ASSUMPTION

    def bandwidth(self, a: DeviceSpec, b: DeviceSpec) -> float:
        """Per-device GB/s between two device types."""
        if self.bandwidth_GBps is not None:
            return self.bandwidth_GBps
        return min(a.nic_GBps, b.nic_GBps) * self.efficiency


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    groups: tuple[NodeGroup, ...]
    cross: CrossLink = CrossLink()
    description: str = ""
    sources: tuple[str, ...] = ()
    prices: tuple[tuple[str, float], ...] = ()
    origin: str = ""

    @property
    def device_types(self) -> tuple[str, ...]:
        seen: list[str] = []
        for g in self.groups:
            if g.device.id not in seen:
                seen.append(g.device.id)
        return tuple(seen)

    def device(self, did: str) -> DeviceSpec:
        for g in self.groups:
            if g.device.id == did:
                return g.device
        raise SpecError(f"device type {did!r} is not in cluster {self.name}")

    @property
    def inventory(self) -> dict[str, int]:
        inv: dict[str, int] = {}
        for g in self.groups:
            inv[g.device.id] = inv.get(g.device.id, 0) + g.devices
        return inv

    def node_size(self, did: str) -> int:
        return max(g.devices_per_node for g in self.groups if g.device.id == did)

    @property
    def world_size(self) -> int:
        return sum(g.devices for g in self.groups)

    @property
    def is_heterogeneous(self) -> bool:
        return len(self.device_types) > 1

    def price(self, did: str) -> float | None:
        for k, v in self.prices:
            if k == did:
                return v
        return self.device(did).price_per_hour

    @property
    def aggregate_peak_tflops(self) -> float:
        return sum(g.devices * g.device.dense_peak_tflops for g in self.groups)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "devices": self.world_size,
            "composition": " + ".join(f"{g.device.id}({g.nodes}x{g.devices_per_node})" for g in self.groups),
            "types": list(self.device_types),
            "aggregate_bf16_pflops": round(self.aggregate_peak_tflops / 1000.0, 2),
            "description": self.description,
        }

    def describe(self) -> dict[str, Any]:
        """:meth:`summary` plus the node groups, the cross-type link and the sources -- what
        ``clusters NAME`` shows (``cluster_to_dict`` is the file format)."""
        d = self.summary()
        d["groups"] = [
            {"device": g.device.id, "nodes": g.nodes, "devices_per_node": g.devices_per_node} for g in self.groups
        ]
        d["cross_link"] = {
            "efficiency": self.cross.efficiency,
            "latency_us": self.cross.latency_us,
            "bandwidth_GBps": self.cross.bandwidth_GBps,
            "assumption": self.cross.assumption,
        }
        d["sources"] = list(self.sources)
        return d


DeviceResolver = Callable[[str, str, str], DeviceSpec]


def check_size(groups: list[NodeGroup], source: str | None, fld: str) -> None:
    """The cluster caps (``limits.py``): a cluster this large is a typo, and would take the space builder
    minutes before the search's time limit even starts."""
    if len(groups) > MAX_GROUPS:
        raise SpecError(
            f"{len(groups)} node groups exceed the supported maximum of {MAX_GROUPS}", source=source, field=fld
        )
    total = sum(g.devices for g in groups)
    if total > MAX_DEVICES:
        raise SpecError(
            f"{total:,} devices exceed the supported maximum of {MAX_DEVICES:,} per cluster", source=source, field=fld
        )


def cluster_from_dict(doc: dict[str, Any], source: str, resolve_device: DeviceResolver) -> ClusterSpec:
    f = Fields(doc, source)
    name = check_name(f.str_("name"), source, "name")
    groups: list[NodeGroup] = []
    raw_groups = f.list_("groups")
    if not raw_groups:
        raise f.err("groups", "must list at least one node group")
    if len(raw_groups) > MAX_GROUPS:
        raise f.err("groups", f"{len(raw_groups)} node groups exceed the supported maximum of {MAX_GROUPS}")
    for i, g in enumerate(raw_groups):
        gf = Fields(g, source, f"groups[{i}]")
        dev = resolve_device(gf.str_("device"), source, gf.path("device"))
        dpn = gf.int_("devices_per_node", dev.devices_per_node)
        if dpn > dev.devices_per_node:
            raise gf.err("devices_per_node", f"{dpn} exceeds the {dev.devices_per_node} devices per node of {dev.id}")
        groups.append(NodeGroup(dev, gf.int_("nodes", maximum=MAX_DEVICES), dpn))
        gf.reject_unknown(allowed_extra=("note",))
    check_size(groups, source, "groups")
    cross = CrossLink()
    cf = f.sub("cross_link", None)
    if cf is not None:
        eff = cf.float_("efficiency", DEFAULT_CROSS_EFFICIENCY, within=RANGE_EFFICIENCY)
        cross = CrossLink(
            efficiency=eff,
            latency_us=cf.float_(
                "latency_us", DEFAULT_CROSS_LATENCY_US, allow_zero=True, within=RANGE_LATENCY_US, unit="us"
            ),
            bandwidth_GBps=cf.float_("bandwidth_GBps", None, within=RANGE_LINK_GBPS, unit="GB/s"),
            assumption=cf.str_("assumption", CROSS_ASSUMPTION),
        )
        cf.reject_unknown(allowed_extra=("note", "source"))
    prices: list[tuple[str, float]] = []
    pf = f.sub("prices", None)
    if pf is not None:
        types = [g.device.id for g in groups]
        for k in list(pf.doc):
            if str(k) not in types:
                raise pf.err(str(k), f"no node group of this cluster has device {show(str(k))} ({', '.join(types)})")
            prices.append((str(k), pf.float_(str(k), allow_zero=True, within=RANGE_PRICE_PER_HOUR)))
    src = f.raw("sources", [])
    if isinstance(src, str):
        src = [src]
    if not isinstance(src, list):
        raise f.err("sources", "must be a URL or a list of URLs")
    c = ClusterSpec(
        name=name,
        groups=tuple(groups),
        cross=cross,
        description=f.str_("description", ""),
        sources=tuple(str(s) for s in src),
        prices=tuple(prices),
        origin=source,
    )
    f.reject_unknown(allowed_extra=("notes",))
    return c


def parse_inline(text: str, resolve_device: DeviceResolver) -> ClusterSpec:
    """``8xh800+16x910b``: counts per device type; node size from each device entry.

    Errors name the ``cluster`` argument (a part's errors name it as their place and the part as field);
    front ends relabel it with their own name for the value (the CLI: ``--cluster``)."""
    if not INLINE_RE.match(text):
        raise SpecError(f"not an inline cluster (expected e.g. 8xh800+16x910b): {show(text)}", field="cluster")
    groups: list[NodeGroup] = []
    compact = re.sub(r"\s+", "", text)
    for part in compact.split("+"):
        m = re.match(r"^(\d+)[x*](.+)$", part)
        if m is None:
            raise SpecError(f"cannot parse {show(part)} (expected COUNTxDEVICE)", field="cluster")
        digits, did = m.group(1), m.group(2)
        count = int(digits) if len(digits) <= 9 else MAX_DEVICES + 1
        if count <= 0:
            raise SpecError(f"device count must be positive in {show(part)}", field="cluster")
        if count > MAX_DEVICES:
            raise SpecError(
                f"{show(part)}: more than the supported maximum of {MAX_DEVICES:,} devices per cluster",
                field="cluster",
            )
        dev = resolve_device(did, "cluster", part)
        dpn = dev.devices_per_node
        if count % dpn == 0:
            groups.append(NodeGroup(dev, count // dpn, dpn))
        elif count < dpn:
            groups.append(NodeGroup(dev, 1, count))
        else:
            raise SpecError(
                f"{count} {did} is neither a whole number of {dpn}-device nodes nor less than one node",
                source="cluster",
                field=part,
            )
    check_size(groups, None, "cluster")
    name = "+".join(f"{g.devices}x{g.device.id}" for g in groups)  # canonical: '16 * H800' is '16xh800'
    return ClusterSpec(name=name, groups=tuple(groups), description="inline", origin="inline")


# ---------------------------------------------------------------------- writing a spec back (plan files)
def device_hash(dev: DeviceSpec) -> str:
    """Content hash of a device table: every field (peaks, fabric, lookup tables, overheads) but where the
    file lives. Generic over the dataclass, so fields added to device tables later are covered too."""
    doc = dataclasses.asdict(dev)
    origin = doc.pop("origin", None)
    # lookup tables name the file they came from (for their error messages): where it lives is not content
    return spec_hash(_without_path(doc, origin) if origin else doc)


def _without_path(x: Any, path: str) -> Any:
    if isinstance(x, dict):
        return {k: _without_path(v, path) for k, v in x.items() if not (k == "source" and v == path)}
    if isinstance(x, (list, tuple)):
        return [_without_path(v, path) for v in x]
    return x


def cluster_to_dict(c: ClusterSpec) -> dict[str, Any]:
    """The cluster as a document ``cluster_from_dict`` reads back (devices by id, resolved through the
    catalog)."""
    out: dict[str, Any] = {
        "name": c.name,
        "groups": [{"device": g.device.id, "nodes": g.nodes, "devices_per_node": g.devices_per_node} for g in c.groups],
        "cross_link": {
            "efficiency": c.cross.efficiency,
            "latency_us": c.cross.latency_us,
            "assumption": c.cross.assumption,
        },
    }
    if c.cross.bandwidth_GBps is not None:
        out["cross_link"]["bandwidth_GBps"] = c.cross.bandwidth_GBps
    if c.prices:
        out["prices"] = dict(c.prices)
    if c.description:
        out["description"] = c.description
    return out


def cluster_hash(c: ClusterSpec) -> str:
    """Content hash of what a plan depends on: structure, cross link, and every device table's content."""
    doc = cluster_to_dict(c)
    doc.pop("description", None)
    doc.pop("prices", None)
    doc["cross_link"].pop("assumption", None)
    doc["devices"] = {did: device_hash(c.device(did)) for did in c.device_types}
    return spec_hash(doc)
