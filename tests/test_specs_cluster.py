"""Shipped cluster catalog and inline cluster strings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hapmoe_milp.errors import SpecError
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs.cluster import DEFAULT_CROSS_EFFICIENCY, DEFAULT_CROSS_LATENCY_US, cluster_from_dict

ROOT = Path(__file__).resolve().parents[1]
CATALOG = Catalog(root=ROOT)

# HAPMoE (arXiv 2609.39350) Table 1, all 8 devices per node; groups listed in the paper's order.
TABLE1: dict[str, list[tuple[str, int]]] = {
    "16-1-h": [("h800", 16)],
    "16-2-h": [("910b", 16)],
    "16-3-h": [("mi300x", 16)],
    "16-1": [("h800", 8), ("910b", 8)],
    "16-2": [("h800", 8), ("mi300x", 8)],
    "16-3": [("910b", 8), ("mi300x", 8)],
    "24-1": [("h800", 8), ("910b", 16)],
    "24-2": [("h800", 8), ("mi300x", 16)],
    "24-3": [("910b", 16), ("mi300x", 8)],
    "32-1": [("h800", 16), ("910b", 16)],
    "32-2": [("h800", 16), ("mi300x", 16)],
    "32-3": [("910b", 16), ("mi300x", 16)],
}

# Other shipped clusters: (device, devices, devices_per_node) per group.
OTHERS: dict[str, list[tuple[str, int, int]]] = {
    "hetermoe-o1": [("a40", 6, 6), ("v100", 6, 6)],
    "hetermoe-o2": [("a40", 4, 4), ("v100", 8, 8)],
    "hetermoe-o3": [("a40", 6, 6), ("v100", 3, 3)],
    "16-a100-910b": [("a100", 16, 8), ("910b", 16, 8)],
    "256-h800-910b": [("h800", 128, 8), ("910b", 128, 8)],
    "1024-h100-a100": [("h100", 512, 8), ("a100", 512, 8)],
    "2048-h800": [("h800", 2048, 8)],
    "64-h100": [("h100", 64, 8)],
}


def test_catalog_lists_expected_clusters() -> None:
    names = set(CATALOG.cluster_names())
    missing = sorted((set(TABLE1) | set(OTHERS)) - names)
    assert not missing, f"missing cluster files: {missing}"


@pytest.mark.parametrize("name", CATALOG.cluster_names())
def test_every_cluster_loads(name: str) -> None:
    c = CATALOG.cluster(name)
    assert c.name == name
    assert c.world_size > 0
    assert c.sources, "every shipped cluster cites where it comes from"
    assert c.description
    for g in c.groups:
        assert 1 <= g.devices_per_node <= g.device.devices_per_node


@pytest.mark.parametrize("name", sorted(TABLE1))
def test_table1_device_counts(name: str) -> None:
    c = CATALOG.cluster(name)
    expect = TABLE1[name]
    assert [(g.device.id, g.devices) for g in c.groups] == expect
    assert all(g.devices_per_node == 8 for g in c.groups)
    assert c.world_size == int(name.split("-")[0])
    assert c.is_heterogeneous == (len(expect) > 1)
    assert any("2609.39350" in s for s in c.sources)


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_other_cluster_compositions(name: str) -> None:
    c = CATALOG.cluster(name)
    assert [(g.device.id, g.devices, g.devices_per_node) for g in c.groups] == OTHERS[name]


def test_table1_heterogeneous_clusters_use_default_cross_link() -> None:
    c = CATALOG.cluster("16-1")
    assert c.cross.efficiency == DEFAULT_CROSS_EFFICIENCY
    assert c.cross.latency_us == DEFAULT_CROSS_LATENCY_US
    # min(400 Gb/s H800, 200 Gb/s 910B) = 25 GB/s x 0.6
    assert c.cross.bandwidth(c.device("h800"), c.device("910b")) == pytest.approx(15.0)


def test_hetermoe_cross_link_is_explicit() -> None:
    c = CATALOG.cluster("hetermoe-o1")
    assert c.cross.bandwidth_GBps == pytest.approx(12.5 * 0.6 / 6)
    assert c.cross.bandwidth(c.device("a40"), c.device("v100")) == pytest.approx(1.25)
    assert "100 Gb/s" in c.cross.assumption
    assert c.node_size("a40") == 6


def test_aggregate_peak() -> None:
    c = CATALOG.cluster("16-1")
    assert c.aggregate_peak_tflops == pytest.approx(8 * 989.4 + 8 * 353.9, abs=0.5)


# ------------------------------------------------------------------------------------------ inline form
def test_inline_whole_nodes() -> None:
    c = CATALOG.cluster("8xh800+16x910b")
    assert [(g.device.id, g.nodes, g.devices_per_node) for g in c.groups] == [("h800", 1, 8), ("910b", 2, 8)]
    assert c.inventory == {"h800": 8, "910b": 16}
    assert c.world_size == 24


def test_inline_partial_node() -> None:
    c = CATALOG.cluster("4xa40")
    assert [(g.device.id, g.nodes, g.devices_per_node) for g in c.groups] == [("a40", 1, 4)]


def test_inline_accepts_spaces_star_and_case() -> None:
    c = CATALOG.cluster("16 * H800 + 8 x MI300X")
    assert c.inventory == {"h800": 16, "mi300x": 8}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0xh800", "device count must be positive"),
        ("12xh800", "neither a whole number of 8-device nodes nor less than one node"),
        ("8xfoo", "unknown device 'foo'"),
        ("8xh80", "did you mean h800"),
        ("8xh800+20x910b", "20 910b is neither a whole number"),
    ],
)
def test_bad_inline_clusters(text: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        CATALOG.cluster(text)
    assert message in str(info.value)


def test_unknown_cluster_suggests_close_matches() -> None:
    with pytest.raises(SpecError) as info:
        CATALOG.cluster("16-1-hh")
    msg = str(info.value)
    assert "unknown cluster '16-1-hh'" in msg
    assert "did you mean" in msg and "16-1-h" in msg


def test_unknown_cluster_without_close_match_lists_known() -> None:
    with pytest.raises(SpecError, match=r"known: .*16-1"):
        CATALOG.cluster("zzzzzzzz")


# ------------------------------------------------------------------------------------------ malformed documents
def _doc(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": "t", "sources": ["x"], "groups": [{"device": "h800", "nodes": 1}]}
    d.update(over)
    return d


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_doc(groups=[]), "groups: must list at least one node group"),
        (_doc(groups=[{"device": "nope", "nodes": 1}]), "unknown device 'nope'"),
        (_doc(groups=[{"device": "h800", "nodes": 0}]), "groups[0].nodes: must be positive"),
        (_doc(groups=[{"device": "h800"}]), "groups[0].nodes: required field is missing"),
        (_doc(groups=[{"device": "h800", "nodes": 1, "gpus": 8}]), "groups[0].gpus: unknown field"),
        (_doc(cross_link={"efficiency": 1.5}), "cross_link.efficiency: 1.5 is outside the physical range"),
        (_doc(cross_link={"latency_us": -1}), "cross_link.latency_us: must be non-negative"),
        (_doc(topology="ring"), "topology: unknown field"),
    ],
)
def test_malformed_cluster_doc_raises(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as info:
        cluster_from_dict(doc, "bad.yaml", CATALOG.device)
    assert message in str(info.value)
