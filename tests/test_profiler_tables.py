"""Table writer, comparison and the datasheet peak table, on synthetic measurements (no torch needed).

Synthetic measurements have known numbers, so the written tables can be checked exactly: efficiency =
achieved / peak, busbw copied as measured, every non-measured field traced to its origin in `assumptions`.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from hapmoe_milp.errors import TableRangeError
from hapmoe_milp.profiler import ProfilerError
from hapmoe_milp.profiler.collectives import COLLECTIVES_FORMAT, cross_link_from_collectives, load_collectives
from hapmoe_milp.profiler.compare import compare_tables, format_rows, summarize_rows
from hapmoe_milp.profiler.kernels import KNOWN_PEAKS, MEASUREMENT_FORMAT, known_peak
from hapmoe_milp.profiler.table_writer import (
    DeviceOverrides,
    build_device_document,
    load_measurements,
    save_measurements,
    write_device_table,
)
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs._fields import load_document
from hapmoe_milp.specs.device import LINK_CLASSES, PRIMITIVES, device_from_dict

ROOT = Path(__file__).resolve().parents[1]
CATALOG = Catalog(root=ROOT)
PEAK = 500.0


def fake_measurements(backend: str = "cuda", **kw: Any) -> dict[str, Any]:
    gemm = []
    for c, tf in ((128, 50.0), (1024, 300.0), (4096, 400.0)):
        gemm.append({"m": c, "n": c, "k": c, "flops": 2.0 * c**3, "median_s": 2.0 * c**3 / tf / 1e12, "tflops": tf})
    # a second shape at the 1024 FLOP count: the table must take the median of the shapes
    gemm.append({"m": 4096, "n": 512, "k": 512, "flops": 2.0 * 1024**3, "median_s": 1.0, "tflops": 200.0})
    gemm.append({"m": 512, "n": 512, "k": 4096, "flops": 2.0 * 1024**3, "median_s": 1.0, "tflops": 250.0})
    attn = [
        {"seq": s, "batch": 1, "heads": 16, "head_dim": 128, "fwd_tflops": f, "bwd_tflops": b}
        for s, f, b in ((512, 150.0, 100.0), (2048, 250.0, 200.0), (8192, 300.0, 240.0))
    ]
    m: dict[str, Any] = {
        "format": MEASUREMENT_FORMAT,
        "device_name": "fakegpu",
        "backend": backend,
        "hardware": "Fake GPU 9000",
        "device_count": 4,
        "mode": "quick",
        "dtype": "bf16",
        "peak_tflops": {"bf16": PEAK, "fp8": 2 * PEAK},
        "peak_basis": "datasheet",
        "gemm": gemm,
        "attention": attn,
        "grouped_gemm": [
            {
                "experts": 8,
                "tokens_per_expert": 256,
                "hidden": 4096,
                "ffn": 2048,
                "flops": 2.0 * 8 * 256 * 4096 * 2048,
                "median_s": 2.0 * 8 * 256 * 4096 * 2048 / 300e12,
                "tflops": 300.0,
            }
        ],
        "memory": {
            "copy_bytes": 2 * 2**30,
            "memory_bandwidth_GBps": 2000.0,
            "memory_bound_efficiency": 0.7,
            "elementwise": [{"op": "add", "fraction_of_copy": 0.7}],
        },
        "usable_memory": {"usable_bytes": 40 * 2**30, "method": "fake"},
        "profiled": {"host": "testhost", "date": "2026-01-01T00:00:00+00:00", "tool": "test", "mode": "quick"},
        "sources": ["https://example.com/datasheet"],
        "assumptions": ["peak_tflops.bf16 = 500: datasheet (fake)"],
        "notes": [],
    }
    m.update(kw)
    return m


def fake_collectives(link: str, big: float, world: int = 4, local: int = 4) -> dict[str, Any]:
    xs = [1024.0 * 16**i for i in range(5)]
    tables = {}
    for i, p in enumerate(PRIMITIVES):
        b = big * (1 + 0.1 * i)
        ys = [b * x / (x + 10e-6 * b * 1e9) for x in xs]
        tables[p] = {"x": xs, "y": ys, "time_s": [x / (y * 1e9) for x, y in zip(xs, ys)], "method": p, "bus_factor": 1}
    return {
        "format": COLLECTIVES_FORMAT,
        "link": link,
        "world_size": world,
        "local_world_size": local,
        "hosts": ["h0"] if link == "intra" else ["h0", "h1"],
        "backend": "nccl",
        "dtype": "bfloat16",
        "date": "2026-01-01",
        "mode": "quick",
        "tables": tables,
        "notes": [],
    }


def _load(doc: dict[str, Any]):
    return device_from_dict(doc, "<test>")


def test_written_file_loads_and_tables_are_achieved_over_peak(tmp_path: Path) -> None:
    m = fake_measurements()
    colls = [fake_collectives("intra", 300.0), fake_collectives("inter", 40.0, world=8, local=4)]
    out = write_device_table(m, tmp_path, device_name="FakeGPU", collectives=colls)
    assert out == tmp_path / "fakegpu.yaml"
    dev = Catalog(root=ROOT, devices_dirs=(tmp_path,)).device("fakegpu")
    assert dev.provenance == "profiled"
    assert dev.profiled["host"] == "testhost"
    assert "collectives_intra" in dev.profiled and "collectives_inter" in dev.profiled
    assert dev.peak("bf16") == PEAK
    assert dev.peak("fp8") == 2 * PEAK
    assert dev.gemm_efficiency.x == (2.0 * 128**3, 2.0 * 1024**3, 2.0 * 4096**3)
    # 1024 FLOP count: median of 300, 200, 250 = 250
    assert dev.gemm_efficiency.y == pytest.approx((50 / PEAK, 250 / PEAK, 400 / PEAK))
    assert dev.attention_efficiency.x == (512.0, 2048.0, 8192.0)
    assert dev.attention_efficiency.y == pytest.approx((0.3, 0.5, 0.6))
    assert dev.attention_bwd_efficiency.y == pytest.approx((0.2, 0.4, 0.48))
    assert dev.memory_bandwidth_GBps == 2000.0
    assert dev.memory_bound_efficiency == 0.7
    assert dev.memory_gib == 40.0
    for link, big in (("intra", 300.0), ("inter", 40.0)):
        src = fake_collectives(link, big)["tables"]
        for p in PRIMITIVES:
            t = dev.collectives[link][p]
            assert t.x == tuple(src[p]["x"])
            assert t.y == pytest.approx(src[p]["y"], rel=1e-3)
            assert t.extrapolate == "clamp"
    # not measurable, no base, no overrides: synthesised and said so
    asm = "\n".join(dev.assumptions)
    assert dev.devices_per_node == 4 and "devices_per_node = 4: devices visible" in asm
    assert dev.intra.fabric == "switch" and "intra_node.fabric = switch: assumed" in asm
    assert dev.nic_Gbps == pytest.approx(8 * max(dev.collectives["inter"]["p2p"].y), rel=1e-3)
    assert "memory_gib = 40: measured usable memory" in asm
    assert "grouped expert GEMM" in load_document(out)["notes"]


def test_base_and_overrides_fill_unmeasurable_fields(tmp_path: Path) -> None:
    h100 = CATALOG.device("h100")
    m = fake_measurements()
    doc, header = build_device_document(
        m,
        device_name="myh100",
        base=h100,
        collectives=[fake_collectives("intra", 300.0)],
        overrides=DeviceOverrides(nic_Gbps=200.0, name="My H100"),
    )
    dev = _load(doc)
    assert dev.name == "My H100"
    assert dev.vendor == "nvidia"
    assert dev.nic_Gbps == 200.0
    assert dev.devices_per_node == 8
    assert dev.intra == h100.intra
    # inter was not measured: copied from the base, tables identical, and recorded
    for p in PRIMITIVES:
        assert dev.collectives["inter"][p].x == h100.collectives["inter"][p].x
        assert dev.collectives["inter"][p].y == h100.collectives["inter"][p].y
    # intra was measured: the file's, not the base's
    assert dev.collectives["intra"]["p2p"].y != h100.collectives["intra"]["p2p"].y
    asm = "\n".join(dev.assumptions)
    assert "collectives.inter: not measured; copied from h100" in asm
    assert "nic_Gbps = 200: given on the command line" in asm
    assert "devices_per_node = 8: copied from h100" in asm
    # the peak differs from the base's: flagged
    assert "differs from base h100" in asm
    assert dev.profiled["base"].startswith("h100")
    assert any("provenance: profiled" in h for h in header)


def test_peak_override_renormalises_efficiencies() -> None:
    m = fake_measurements()
    doc, _ = build_device_document(
        m,
        device_name="g",
        collectives=[fake_collectives("intra", 300.0), fake_collectives("inter", 40.0)],
        overrides=DeviceOverrides(peak_tflops=1000.0),
    )
    dev = _load(doc)
    assert dev.peak("bf16") == 1000.0
    assert "fp8" not in dev.peak_tflops  # the fp8 figure belonged to the replaced peak basis
    assert dev.gemm_efficiency.y[-1] == pytest.approx(0.4)
    # efficiencies above the peak are capped, and noted
    doc2, _ = build_device_document(
        m,
        device_name="g",
        collectives=[fake_collectives("intra", 300.0), fake_collectives("inter", 40.0)],
        overrides=DeviceOverrides(peak_tflops=200.0),
    )
    d2 = _load(doc2)
    assert max(d2.gemm_efficiency.y) == 1.0
    assert "capped at 1.0" in doc2["notes"]


def test_missing_collectives_is_an_error_off_cpu_and_synthesised_on_cpu() -> None:
    with pytest.raises(ProfilerError, match="no inter-node collectives"):
        build_device_document(fake_measurements(), device_name="g", collectives=[fake_collectives("intra", 300.0)])
    with pytest.raises(ProfilerError, match="no intra-node collectives"):
        build_device_document(fake_measurements(), device_name="g")
    doc, _ = build_device_document(
        fake_measurements(backend="cpu"),
        device_name="c",
        collectives=[fake_collectives("intra", 3.0, world=2, local=2)],
    )
    dev = _load(doc)
    assert dev.collectives["inter"]["p2p"].y == dev.collectives["intra"]["p2p"].y
    assert dev.devices_per_node == 2  # the gloo run's ranks per host
    assert any("collectives.inter: not measured; copied from the intra gloo run" in a for a in dev.assumptions)


def test_cross_link_file_becomes_a_cluster_hint_not_a_table() -> None:
    cross = fake_collectives("cross", 20.0, world=2, local=1)
    doc, _ = build_device_document(
        fake_measurements(),
        device_name="g",
        collectives=[fake_collectives("intra", 300.0), fake_collectives("inter", 40.0), cross],
    )
    assert "cross_link: {bandwidth_GBps:" in doc["notes"]
    assert set(doc["tables"]["collectives"]) == {"note", *LINK_CLASSES}


def test_cross_link_fit_recovers_alpha_beta() -> None:
    xs = [1e3, 1e5, 1e7, 1e9]
    doc = {"tables": {"p2p": {"x": xs, "y": [1.0] * 4, "time_s": [12e-6 + x / 25e9 for x in xs]}}}
    cl = cross_link_from_collectives(doc)
    assert cl["bandwidth_GBps"] == pytest.approx(25.0, rel=1e-3)
    assert cl["latency_us"] == pytest.approx(12.0, rel=1e-2)


def test_extrapolate_error_is_written_and_enforced(tmp_path: Path) -> None:
    out = write_device_table(
        fake_measurements(),
        tmp_path / "g.yaml",
        device_name="g",
        collectives=[fake_collectives("intra", 300.0), fake_collectives("inter", 40.0)],
        extrapolate="error",
    )
    dev = device_from_dict(load_document(out), str(out))
    assert dev.gemm_efficiency.extrapolate == "error"
    with pytest.raises(TableRangeError):
        dev.gemm_efficiency(1e15)
    with pytest.raises(TableRangeError):
        dev.busbw("all_reduce", "inter", 1e12)


def test_bad_inputs_are_profiler_errors(tmp_path: Path) -> None:
    colls = [fake_collectives("intra", 300.0), fake_collectives("inter", 40.0)]
    with pytest.raises(ProfilerError, match="not a profiler measurement"):
        build_device_document({"format": "nope"}, device_name="g", collectives=colls)
    with pytest.raises(ProfilerError, match="fabric"):
        build_device_document(
            fake_measurements(), device_name="g", collectives=colls, overrides=DeviceOverrides(fabric="torus")
        )
    with pytest.raises(Exception, match="invalid device id"):
        build_device_document(fake_measurements(), device_name="has space", collectives=colls)
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "other"}')
    with pytest.raises(ProfilerError, match="not a collectives measurement"):
        load_collectives(bad)
    with pytest.raises(ProfilerError, match="file not found"):
        load_collectives(tmp_path / "missing.json")


def test_written_yaml_keeps_the_shipped_layout(tmp_path: Path) -> None:
    out = write_device_table(
        fake_measurements(),
        tmp_path,
        device_name="g",
        collectives=[fake_collectives("intra", 300.0), fake_collectives("inter", 40.0)],
    )
    mine = yaml.safe_load(out.read_text())
    shipped = yaml.safe_load((ROOT / "clusters" / "devices" / "h100.yaml").read_text())
    required = {"id", "name", "vendor", "provenance", "memory_gib", "memory_bandwidth_GBps", "peak_tflops"}
    required |= {"devices_per_node", "intra_node", "nic_Gbps", "assumptions", "tables"}
    assert required <= set(mine)
    assert set(mine["tables"]) == set(shipped["tables"])
    assert set(mine["tables"]["gemm_efficiency"]) == set(shipped["tables"]["gemm_efficiency"])
    for link in LINK_CLASSES:
        assert set(mine["tables"]["collectives"][link]) == set(shipped["tables"]["collectives"][link])
    assert mine["provenance"] == "profiled" and isinstance(mine["profiled"], dict)


def test_raw_measurements_round_trip(tmp_path: Path) -> None:
    m = fake_measurements()
    p = save_measurements(m, tmp_path / "raw" / "m.json")
    assert load_measurements(p) == m
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ProfilerError, match="expected a JSON object"):
        load_measurements(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"format": "x"}')
    with pytest.raises(ProfilerError, match="not a profiler measurement"):
        load_measurements(tmp_path / "other.json")
    with pytest.raises(ProfilerError, match="file not found"):
        load_measurements(tmp_path / "nope.json")


# --------------------------------------------------------------------------------------------- compare
def test_compare_rows_ratios_and_union_of_points() -> None:
    h100 = CATALOG.device("h100")
    doc = yaml.safe_load((ROOT / "clusters" / "devices" / "h100.yaml").read_text())
    prof = copy.deepcopy(doc)
    prof["provenance"] = "profiled"
    prof["profiled"] = {"host": "x"}
    prof["memory_gib"] = 70.0
    g = prof["tables"]["gemm_efficiency"]
    g["x"] = [1e9, 5e11]  # 5e11 is not a shipped point: the union must contain it
    g["y"] = [0.2, 0.7]
    for p in PRIMITIVES:
        t = prof["tables"]["collectives"]["intra"][p]
        t["y"] = [v * 0.5 for v in t["y"]]
    dev = device_from_dict(prof, "<prof>")
    rows = compare_tables(dev, h100)
    by = {(r.quantity, r.x): r for r in rows}
    assert by[("memory_gib", None)].ratio == pytest.approx(70.0 / 79.6)
    assert by[("peak_tflops.bf16", None)].ratio == 1.0
    gx = sorted(x for q, x in by if q == "gemm_efficiency")
    assert gx == sorted(set(h100.gemm_efficiency.x) | {5e11})
    r = by[("gemm_efficiency", 5e11)]
    assert r.profiled == pytest.approx(0.7) and r.shipped == pytest.approx(h100.gemm_efficiency(5e11))
    assert by[("gemm_efficiency", 1e9)].ratio == pytest.approx(0.2 / h100.gemm_efficiency(1e9))
    assert "profiled clamped" in by[("gemm_efficiency", 1e6)].note
    for x in h100.collectives["intra"]["all_reduce"].x:
        assert by[("collectives.intra.all_reduce", x)].ratio == pytest.approx(0.5, rel=1e-3)
        assert by[("collectives.inter.all_reduce", x)].ratio == pytest.approx(1.0)
    assert "gemm_tflops" not in {q for q, _ in by}  # same peak: efficiency rows suffice
    summ = summarize_rows(rows)
    assert summ["collectives.intra.p2p"] == pytest.approx(0.5, rel=1e-3)
    assert summ["collectives.inter.p2p"] == pytest.approx(1.0)
    text = format_rows(rows)
    assert "collectives.intra.all_reduce" in text and "ratio" in text.splitlines()[0]


def test_compare_adds_achieved_tflops_when_peaks_differ() -> None:
    h100, a100 = CATALOG.device("h100"), CATALOG.device("a100")
    rows = compare_tables(a100, h100)
    t = [r for r in rows if r.quantity == "gemm_tflops"]
    assert t, "achieved TFLOP/s rows are needed when the peaks differ"
    r = next(r for r in t if r.x == 1e12)
    assert r.profiled == pytest.approx(a100.gemm_efficiency(1e12) * 312.0)
    assert r.shipped == pytest.approx(h100.gemm_efficiency(1e12) * 989.4)
    assert by_quantity_has_nan_free(rows)


def by_quantity_has_nan_free(rows: list) -> bool:
    return all(not math.isnan(r.ratio) for r in rows if r.quantity.startswith(("gemm", "collectives")))


def test_compare_reports_out_of_range_for_error_tables() -> None:
    h100 = CATALOG.device("h100")
    doc = yaml.safe_load((ROOT / "clusters" / "devices" / "h100.yaml").read_text())
    doc["tables"]["attention_efficiency"] = {"x": [1024, 4096], "y": [0.3, 0.4], "extrapolate": "error"}
    dev = device_from_dict(doc, "<p>")
    rows = [r for r in compare_tables(dev, h100) if r.quantity == "attention_efficiency"]
    r512 = next(r for r in rows if r.x == 512)
    assert math.isnan(r512.profiled) and math.isnan(r512.ratio)
    assert "out of range" in r512.note
    assert next(r for r in rows if r.x == 1024).ratio == pytest.approx(0.3 / h100.attention_efficiency(1024))


# --------------------------------------------------------------------------------------------- datasheet peaks
@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM5"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H800", "H800 SXM5"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H20", "H20"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A800-SXM4-80GB", "A800"),
        ("NVIDIA A40", "A40"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA B200", "B200"),
        ("Tesla V100-SXM2-32GB", "V100 SXM2"),
        ("AMD Instinct MI300X", "MI300X"),
        ("Ascend910B2", "Ascend 910B2"),
        ("NVIDIA GeForce RTX 4090", None),
        ("NVIDIA A400", None),
        ("NVIDIA RTX A1000", None),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA GH200 480GB", None),
        ("AMD Instinct MI300X VF", "MI300X"),
    ],
)
def test_known_peak_matches_runtime_names(name: str, label: str | None) -> None:
    kp = known_peak(name)
    assert (kp.label if kp else None) == label


def test_known_peaks_agree_with_shipped_tables() -> None:
    for kp in KNOWN_PEAKS:
        assert kp.source.startswith("https://")
        if kp.shipped_id is None:
            continue
        dev = CATALOG.device(kp.shipped_id)
        if kp.bf16 is not None:
            assert dev.peak_tflops["bf16"] == kp.bf16, kp.label
        assert dev.peak_tflops["fp16"] == kp.fp16, kp.label
        assert dev.peak_tflops.get("fp8") == kp.fp8, kp.label


def test_runtime_terms_are_measured_where_the_profiler_measures_them(tmp_path: Path) -> None:
    """launch/sync from the host probe, HBM fraction from the element-wise kernels, grouped_rows_half fitted
    to grouped GEMM points that were generated with a known value on the written table."""
    m = fake_measurements(host={"launch_us": 7.5, "sync_us": 42.0})
    colls = [fake_collectives("intra", 300.0), fake_collectives("inter", 40.0, world=8, local=4)]
    out = write_device_table(m, tmp_path, device_name="FakeGPU", collectives=colls)
    dev = Catalog(root=ROOT, devices_dirs=(tmp_path,)).device("fakegpu")
    assert dev.runtime.launch_us == 7.5 and dev.runtime.sync_us == 42.0
    assert dev.runtime.memory_efficiency == 0.7
    for name in ("launch_us", "sync_us", "memory_efficiency"):
        assert dev.runtime_basis(name) == "measured", name
    assert dev.runtime_basis("flex_inter_GBps") == "assumed"
    # grouped points priced by the cost model itself with rows_half = 400 on this very table
    from dataclasses import replace

    from hapmoe_milp.cost.primitives import gemm_time

    truth = replace(dev, runtime=replace(dev.runtime, grouped_rows_half=400.0))
    pts = []
    for tpe in (64, 256, 1024, 4096):
        t = gemm_time(truth, tpe, 2048, 4096, "bf16", groups=8)
        pts.append({"experts": 8, "tokens_per_expert": tpe, "hidden": 4096, "ffn": 2048, "median_s": t})
    out = write_device_table(fake_measurements(grouped_gemm=pts), tmp_path, device_name="FakeGPU2", collectives=colls)
    dev2 = Catalog(root=ROOT, devices_dirs=(tmp_path,)).device("fakegpu2")
    assert dev2.runtime.grouped_rows_half == pytest.approx(400.0, rel=0.15)
    assert dev2.runtime_basis("grouped_rows_half") == "measured"
    assert out.is_file()
