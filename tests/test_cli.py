"""The CLI end to end: catalogs, estimate, solve, errors (one line, exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([sys.executable, "-m", "hapmoe_milp.cli", *args], capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}: {p.stderr}")
    return p


def test_models_json_lists_catalog_with_counts():
    rows = json.loads(run("models", "--json").stdout)
    names = {r["name"] for r in rows}
    assert {"mixtral-s", "mixtral-l", "deepseek-v3", "llama-2-7b"} <= names
    ds = next(r for r in rows if r["name"] == "deepseek-v3")
    assert ds["total_params"] > 6.7e11 and ds["active_params"] > 3.6e10


def test_clusters_show_table1_with_devices_and_peak():
    p = run("clusters")
    for sym in ("16-1-h", "16-2", "24-3", "32-1"):
        assert sym in p.stdout
    one = json.loads(run("clusters", "16-1", "--json").stdout)
    assert one["devices"] == 16
    # 8 x 989.4 (H800) + 8 x 353.9 (910B) dense BF16 TFLOP/s
    assert one["aggregate_bf16_pflops"] == pytest.approx((8 * 989.4 + 8 * 353.9) / 1000, abs=0.01)


def test_devices_show_provenance():
    """A device with a shipped calibration uses it by default and says so; one without shows its datasheet table."""
    d = json.loads(run("devices", "910b", "--json").stdout)
    assert d["provenance"] == "calibrated" and d["sources"] and "devices-calibrated" in d["origin"]
    assert d["calibration"]["runs"] and all(v["basis"] == "calibrated" for v in d["runtime"].values())
    d = json.loads(run("devices", "mi300x", "--json").stdout)
    assert d["provenance"] == "datasheet+public-benchmarks" and d["runtime"]["flex_intra_GBps"]["basis"] == "source"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("models", "nope"), "unknown model"),
        (("clusters", "8xfoo"), "unknown device"),
        (("estimate", "-m", "mixtral-s", "-c", "16-1-h", "--tp", "3"), "tp"),
        (("estimate", "-m", "mixtral-s", "-c", "16-1", "--pp", "1"), "spans device types"),
        (("solve", "-m", "mixtral-l", "-c", "16-1", "--optimizer-offload", "off"), "memory:"),
        (("estimate", "-m", "mixtral-s", "-c", "16-1-h", "--plan", "/nonexistent/plan.json"), "file not found"),
    ],
)
def test_user_errors_are_one_line_exit_2(args, words):
    p = run(*args, check=False)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.strip().splitlines() if ln]
    assert len(lines) == 1 and "Traceback" not in p.stderr
    assert words in lines[0]


def test_solve_then_estimate_reports_the_same_objective(tmp_path):
    out = tmp_path / "plan.json"
    sol = json.loads(run("solve", "-m", "mixtral-s", "-c", "16-1", "--out", str(out), "--json").stdout)
    assert set(sol) >= {"plan", "predicted", "solver"}
    assert {"name", "status", "objective_s", "wall_s", "pruned"} <= set(sol["solver"])
    est = json.loads(run("estimate", "-m", "mixtral-s", "-c", "16-1", "--plan", str(out), "--json").stdout)
    assert est["iteration_time_s"] == pytest.approx(sol["solver"]["objective_s"], rel=1e-9)
    assert est["iteration_time_s"] == pytest.approx(sol["predicted"]["iteration_time_s"], rel=1e-12)
    for key in (
        "tokens_per_s",
        "tokens_per_s_per_device",
        "model_tflops_per_device",
        "mfu",
        "fits",
        "stages",
        "breakdown",
    ):
        assert key in est


def test_estimate_knobs_and_simulation_agree_on_uniform_homogeneous_plan():
    cf = json.loads(
        run(
            "estimate", "-m", "mixtral-s", "-c", "16-1-h", "--tp", "2", "--pp", "2", "--ep", "4", "--etp", "1", "--json"
        ).stdout
    )
    sim = json.loads(
        run(
            "estimate",
            "-m",
            "mixtral-s",
            "-c",
            "16-1-h",
            "--tp",
            "2",
            "--pp",
            "2",
            "--ep",
            "4",
            "--etp",
            "1",
            "--simulate",
            "--json",
        ).stdout
    )
    assert sim["simulated"] and not cf["simulated"]
    # equal stages differ only by the p2p delay model; the closed form is an upper bound
    assert sim["iteration_time_s"] <= cf["iteration_time_s"] * (1 + 1e-12)
    assert sim["iteration_time_s"] == pytest.approx(cf["iteration_time_s"], rel=0.01)


def test_estimate_layout_flag_sets_uneven_stages():
    d = json.loads(
        run(
            "estimate",
            "-m",
            "mixtral-s",
            "-c",
            "16-1-h",
            "--pp",
            "2",
            "--tp",
            "2",
            "--ep",
            "4",
            "--etp",
            "1",
            "--layout",
            "Et*14|t*10L",
            "--json",
        ).stdout
    )
    assert [s["layers"] for s in d["stages"]] == [14, 10]


def test_faster_type_gets_more_layers_per_device():
    d = json.loads(run("solve", "-m", "mixtral-s", "-c", "16-1", "--json").stdout)
    per_dev: dict[str, list[float]] = {}
    for s in d["predicted"]["stages"]:
        per_dev.setdefault(s["device"], []).append(s["layers"] / s["devices"])
    if len(per_dev) == 2:
        assert sum(per_dev["h800"]) / len(per_dev["h800"]) > sum(per_dev["910b"]) / len(per_dev["910b"])
    layers = [s["layers"] for s in d["predicted"]["stages"]]
    assert len(set(layers)) > 1, "a heterogeneous cluster should get a non-uniform split"
