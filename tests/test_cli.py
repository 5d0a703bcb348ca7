"""The CLI end to end: catalogs, estimate, solve, errors (one line, exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hapmoe_milp.specs import Catalog

CAT = Catalog()


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


# ---------------------------------------------------------------------- the tool people run
def _in_process(argv: list[str], capsys) -> tuple[int, str, str]:
    from hapmoe_milp import cli

    code = cli.run(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_every_option_has_help_text_and_help_fits_80_columns(monkeypatch, capsys):
    import typer

    from hapmoe_milp import cli

    group = typer.main.get_command(cli.app)
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        assert cmd.help, name
        for param in cmd.params:
            if param.param_type_name == "option":
                assert getattr(param, "help", None), f"{name} {param.opts}"
    monkeypatch.setenv("COLUMNS", "80")
    for argv in (["--help"], *([n, "--help"] for n in group.commands)):  # type: ignore[attr-defined]
        code, out, _ = _in_process(argv, capsys)
        assert code == 0 and out
        wide = [ln for ln in out.splitlines() if len(ln) > 80]
        assert not wide, (argv, wide[:3])


def test_progress_callback_reports_instances():
    from hapmoe_milp.api import solve

    events = []
    sol = solve("mixtral-s", "16-1-h", time_limit=30, progress=events.append)
    assert sol.plan is not None and events
    # the DP reports its phases (ProgressEvent's "build", "dp", "refine"), each counting its own units
    assert all(e.phase in ("build", "dp", "refine") and 1 <= e.done <= e.total for e in events)
    assert events[-1].best_s == pytest.approx(sol.objective_s)
    for phase in {e.phase for e in events}:
        done = [e.done for e in events if e.phase == phase]
        assert done == sorted(done)


def test_progress_on_a_terminal_goes_to_stderr_only(monkeypatch, capsys):
    from hapmoe_milp.cli import output

    monkeypatch.setattr(output, "stderr_is_tty", lambda: True)
    code, out, _ = _in_process(["solve", "-m", "mixtral-s", "-c", "16-1-h", "--json"], capsys)
    assert code == 0
    json.loads(out)  # the progress display did not touch stdout


def test_an_explicit_solver_flag_wins_over_the_preset(tmp_path, capsys):
    """A preset fills in what the user did not say; it never overrides a flag they typed. `--solver dp` with a
    preset naming another solver runs the DP (it used to be indistinguishable from the default and lost)."""
    preset = tmp_path / "exact.yaml"
    preset.write_text("name: exact\nsolver: milp\ntime_limit: 20\n")
    base = ["solve", "-m", "mixtral-s", "-c", "16-1-h", "--solver-config", str(preset), "--json"]
    code, out, _ = _in_process([*base, "--solver", "dp"], capsys)
    assert code == 0 and json.loads(out)["solver"]["name"] == "dp"
    code, out, _ = _in_process(base, capsys)  # no flag: the preset's solver
    assert code == 0 and json.loads(out)["solver"]["name"] == "milp"


def test_timeout_says_how_to_give_more_time(capsys):
    code, out, err = _in_process(["solve", "-m", "mixtral-l", "-c", "32-2", "--time-limit", "0.02"], capsys)
    assert "Traceback" not in err
    if code == 0:  # a plan was found before the limit: the note says the search was cut short
        assert "note:" in err and "--time-limit" in err and out
    else:
        assert code == 2 and "--time-limit" in err and out == ""


def test_idle_cluster_warning(monkeypatch):
    from hapmoe_milp import api
    from hapmoe_milp.search.solution import Solution

    c = CAT.cluster("16-1-h")
    big = CAT.cluster("2048-h800")
    sol = api.solve("mixtral-s", c, time_limit=30)
    plan = sol.plan.with_predicted({**sol.plan.predicted, "mfu": 0.18})
    msg = api.idle_warning(Solution("dp", "feasible", plan, 1.0, 1.0, 0.0), big)
    assert msg and f"{2048 - plan.devices_used} of 2048 devices idle" in msg and "MFU 18%" in msg and "--gbs" in msg
    assert "256 sequences per iteration for 2048 devices (0.125 per device)" in msg
    assert api.idle_warning(sol, c) is None  # a small cluster is never warned about
    # a deep pipeline with few micro-batches on a cluster it fills: the bubble is named
    monkeypatch.setattr(api, "LARGE_CLUSTER", 16)
    st = sol.plan.settings().with_(global_batch_size=sol.plan.samples_per_microbatch)
    few = sol.plan.with_settings(st)
    if few.pp > 1 and few.devices_used == c.world_size:
        assert "pipeline bubble" in api.idle_warning(Solution("dp", "feasible", few, 1.0, 1.0, 0.0), c)


def test_verbose_flags_turn_on_logging(capsys):
    import logging

    for flag, level in (([], logging.WARNING), (["-v"], logging.INFO), (["-vv"], logging.DEBUG)):
        code, _, _ = _in_process([*flag, "models", "--json"], capsys)
        assert code == 0 and logging.getLogger().level == level
    logging.getLogger().setLevel(logging.WARNING)


def test_milp_json_is_strict_json_on_stdout():
    """HiGHS prints a banner on file descriptor 1 from C; the CLI points fd 1 at stderr while it runs."""
    p = run("solve", "-m", "mixtral-s", "-c", "16-1-h", "--solver", "milp", "--time-limit", "10", "--json")
    json.loads(p.stdout, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert p.stdout.lstrip().startswith("{")


def test_plan_file_needs_no_model_or_cluster_and_says_which_wins(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    code, out, _ = _in_process(["solve", "-m", "mixtral-s", "-c", "16-1-h", "--out", str(plan), "--json"], capsys)
    assert code == 0
    objective = json.loads(out)["solver"]["objective_s"]
    for extra in ([], ["-m", "mixtral-s"], ["-c", "16-1-h"], ["-m", "mixtral-s", "-c", "16-1-h"]):
        code, out, _ = _in_process(["estimate", "--plan", str(plan), "--json", *extra], capsys)
        assert code == 0 and json.loads(out)["iteration_time_s"] == pytest.approx(objective, rel=1e-9)
    # a spec with the plan's name but other content: the given one wins, and a warning says so
    doc = json.loads(plan.read_text())
    spec = dict(doc["model"]["spec"], vocab_size=64000)
    changed = tmp_path / "m.json"
    changed.write_text(json.dumps(spec))
    code, out, err = _in_process(["estimate", "--plan", str(plan), "-m", str(changed), "--json"], capsys)
    assert code == 0 and "using --model's" in err
    assert json.loads(out)["iteration_time_s"] != pytest.approx(objective, rel=1e-9)
    # settings flags override the plan's, with a note
    code, out, err = _in_process(["estimate", "--plan", str(plan), "--imbalance", "1.5", "--json"], capsys)
    assert code == 0 and "note: evaluating under --imbalance 1.5" in err
    assert json.loads(out)["iteration_time_s"] > objective


@pytest.mark.slow
def test_deepseek_v3_on_2048_gpus_with_the_default_batch_is_warned_about(caplog):
    """The issue's example: DeepSeek-V3 on 2048 H800 with its default global batch 256 plans at MFU ~18%."""
    import logging

    from hapmoe_milp.api import solve

    with caplog.at_level(logging.WARNING, logger="hapmoe_milp.api"):
        sol = solve("deepseek-v3", "2048-h800", time_limit=30)
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "default global batch 256 is small for 2048 devices" in msg and "--gbs" in msg
    assert sol.plan.predicted["mfu"] < 0.3
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hapmoe_milp.api"):
        solve("deepseek-v3", "2048-h800", time_limit=30, global_batch_size=256)
    assert not caplog.records  # a batch the user chose is not second-guessed
