"""`hapmoe-milp calibrate` and `fidelity` end to end: the user's workflow, its JSON, its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hapmoe_milp.cli", *args], capture_output=True, text=True, timeout=600)


def test_fidelity_json_parses_and_reports_every_run():
    p = run("fidelity", str(ROOT / "bench" / "calibration" / "runs.yaml"), "--device", "h100", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["summary"]["uncalibrated"]["runs"] == len(d["runs"]) > 0
    assert all(r["devices"] == ["h100"] for r in d["runs"])
    for r in d["runs"]:
        assert r["error"] == pytest.approx((r["predicted_step_s"] - r["measured_step_s"]) / r["measured_step_s"])
        assert r["errors"]["uncalibrated"] == pytest.approx(r["error"])
        assert r["breakdown"] and r["source"].startswith("https://")
    # the shipped calibrated h100 table was fitted to these runs: the planner column is in-sample, and says so
    assert any(r["in_sample"] for r in d["runs"])


def test_fidelity_cross_validates_by_model(tmp_path):
    runs = yaml.safe_load((ROOT / "bench" / "calibration" / "runs.yaml").read_text())["runs"]
    mine = [r for r in runs if r["cluster"].endswith(("xa800", "xh800"))]
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"runs": mine}))
    p = run("fidelity", str(path), "--cross-validate", "model,run", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert set(d["summary"]) == {"uncalibrated", "planner", "model", "run"}
    assert d["columns"]["model"] == "leave-one-model-out"
    assert all(set(r["errors"]) == {"uncalibrated", "planner", "model", "run"} for r in d["runs"])
    bad = run("fidelity", str(path), "--cross-validate", "device")
    assert bad.returncode == 2 and "--cross-validate" in bad.stderr


def test_calibrate_writes_a_table_and_the_next_command_uses_it(tmp_path):
    runs = yaml.safe_load((ROOT / "bench" / "calibration" / "runs.yaml").read_text())["runs"]
    mine = [r for r in runs if r["cluster"].endswith("xa800")][:4]
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"runs": mine}))
    out = tmp_path / "cal"
    p = run("calibrate", str(path), "--device", "a800", "--out", str(out), "--params", "launch_us,gemm_scale",
            "--force", "--json")  # fmt: skip
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert Path(d["path"]) == out / "a800.yaml" and (out / "a800.yaml").is_file()
    assert d["identifiability"]["fitted"] == [q["term"] for q in d["parameters"]]
    assert {q["name"] for q in d["parameters"]} <= {"launch_us", "gemm_scale"}
    assert set(d["identifiability"]["terms"]) == {"launch_us@flagperf-megatron-2024", "gemm_scale@a800"}
    # --devices-dir makes the fitted table the one in use; fidelity marks the runs it was fitted to as in-sample
    q = run("--devices-dir", str(out), "devices", "a800", "--json")
    assert json.loads(q.stdout)["provenance"] == "calibrated"
    f = run("--devices-dir", str(out), "fidelity", str(path), "--json")
    fd = json.loads(f.stdout)
    assert all(r["in_sample"] for r in fd["runs"])
    after = {r["id"]: r["error_after"] for r in d["runs"]}
    for r in fd["runs"]:
        assert r["errors"]["planner"] == pytest.approx(after[r["id"]], rel=1e-6, abs=1e-9)


def test_calibrate_on_one_run_says_it_cannot_cross_validate(tmp_path):
    runs = yaml.safe_load((ROOT / "bench" / "calibration" / "runs.yaml").read_text())["runs"]
    mine = [r for r in runs if r["cluster"].endswith("xa800")][:1]
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"runs": mine}))
    p = run("calibrate", str(path), "--device", "a800", "--out", str(tmp_path / "cal"))
    assert p.returncode == 0, p.stderr
    assert "identifiability:" in p.stderr and "one run" in p.stderr
    assert "fitted (#1)" in p.stderr or "kept at prior" in p.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("calibrate", "nope.yaml", "--device", "h100"), "file not found"),
        (("calibrate", "RUNS", "--device", "mi300x"), "no run in the file uses device 'mi300x'"),
        (("calibrate", "RUNS", "--device", "h100", "--params", "launch_us,warp_speed"), "unknown runtime parameter"),
        (("calibrate", "RUNS", "--device", "nodevice"), "unknown device"),
        (("fidelity", "BAD"), "exactly one measurement"),
    ],
)
def test_calibration_errors_are_one_line_and_exit_2(tmp_path, args, words):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"runs": [{"id": "x", "source": "https://e.org", "model": "llama-2-7b",
                                             "cluster": "8xh100", "seq_length": 4096, "global_batch_size": 8}]}))  # fmt: skip
    argv = [str(ROOT / "bench" / "calibration" / "runs.yaml") if a == "RUNS" else str(bad) if a == "BAD" else a
            for a in args]  # fmt: skip
    p = run(*argv)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert words in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert p.stdout == ""
