"""Sweeps: case generation from mixes, local and Ray runs, streaming JSONL, resume after a kill, analysis."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.specs import Catalog
from hapmoe_milp.sweep import (
    SweepCase,
    best_table,
    cases_from_clusters,
    cases_from_mix,
    mix_clusters,
    pareto_front,
    parse_budget,
    parse_mix,
    parse_prices,
    read_results,
    run_case,
    run_sweep,
)
from hapmoe_milp.sweep.results import error_row

# Fast cases: each solves in ~1-4 s with the DP; mixtral-l on 8 H800 without offload cannot fit.
OK_A = ("mixtral-s", "16-1-h")
OK_B = ("mixtral-s", "8xh800+8x910b")
INFEASIBLE = ("mixtral-l", "8xh800")


def lines_of(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert data.endswith(b"\n"), "every line must be complete"
    return [json.loads(ln) for ln in data.decode().splitlines()]


# ---------------------------------------------------------------------- case generation
def test_mix_generates_every_combination_without_the_empty_cluster():
    got = mix_clusters(["h800:0-16:8", "910b:0-16:8"])
    assert got == [
        "8x910b",
        "16x910b",
        "8xh800",
        "8xh800+8x910b",
        "8xh800+16x910b",
        "16xh800",
        "16xh800+8x910b",
        "16xh800+16x910b",
    ]
    # comma-separated in one string is the same mix
    assert mix_clusters("h800:0-16:8,910b:0-16:8") == got


def test_mix_budget_on_devices_and_price():
    assert mix_clusters(["h800:0-32:8", "910b:0-32:8"], "devices<=16") == [
        "8x910b",
        "16x910b",
        "8xh800",
        "8xh800+8x910b",
        "16xh800",
    ]
    assert "16xh800" not in mix_clusters(["h800:0-32:8", "910b:0-32:8"], "devices<16")
    # 8 h800 at 2.5 = 20/h, 8 910b at 1.0 = 8/h
    priced = mix_clusters(["h800:0-16:8", "910b:0-16:8"], "price<=28", prices="h800=2.5,910b=1")
    assert priced == ["8x910b", "16x910b", "8xh800", "8xh800+8x910b"]
    both = mix_clusters(["h800:0-16:8", "910b:0-16:8"], "devices<=8,price<=28", prices={"h800": 2.5, "910b": 1})
    assert both == ["8x910b", "8xh800"]


def test_mix_counts_follow_the_node_size_rule():
    r = parse_mix("h800:0-16:4")
    assert r.counts == (0, 4, 8, 16)  # 12 is neither whole nodes nor under one node
    assert parse_mix("h800:3").counts == (3,)
    assert parse_mix("910b:8-24").counts == (8, 16, 24)  # STEP defaults to one node
    assert parse_mix("h800:1-9:1").counts == tuple(range(1, 9))


def test_mix_uses_the_devices_per_node_of_the_device_entry(tmp_path):
    src = (Catalog().root / "clusters" / "devices" / "h800.yaml").read_text()
    text = src.replace("id: h800", "id: quad").replace("devices_per_node: 8", "devices_per_node: 4")
    (tmp_path / "quad.yaml").write_text(text)
    cat = Catalog(devices_dirs=(tmp_path,))
    assert parse_mix("quad:0-12:2", cat).counts == (0, 2, 4, 8, 12)
    assert mix_clusters(["quad:0-8:4", "h800:0-8:8"], catalog=cat) == [
        "8xh800",
        "4xquad",
        "4xquad+8xh800",
        "8xquad",
        "8xquad+8xh800",
    ]
    assert cat.cluster("4xquad+8xh800").groups[0].devices_per_node == 4  # the generated spec resolves


@pytest.mark.parametrize(
    "spec",
    ["h800", "h800:", "h800:a-b:8", "h800:16-8:8", "h800:0-8:0", "h800:12-12:1", "nosuchdevice:0-8:8", ":0-8:8"],
)
def test_bad_mix_specs_name_the_mixes_argument(spec):
    with pytest.raises(HapmoeError) as ei:
        mix_clusters([spec])
    assert ei.value.field == "mixes"
    assert "mixes" in str(ei.value)


def test_mix_rejects_the_same_device_twice():
    with pytest.raises(HapmoeError, match="given twice") as ei:
        mix_clusters(["h800:0-8:8", "h800:8-16:8"])
    assert ei.value.field == "mixes"


@pytest.mark.parametrize("text", ["devices<=", "gpus<=8", "devices>=8", "devices<=8.5", "price<=x", ""])
def test_bad_budget_names_the_budget_argument(text):
    with pytest.raises(HapmoeError) as ei:
        parse_budget(text)
    assert ei.value.field == "budget"


def test_price_budget_needs_prices():
    with pytest.raises(HapmoeError, match="--prices h800") as ei:
        mix_clusters(["h800:0-8:8"], "price<=100")
    assert ei.value.field == "budget"


def test_budget_that_excludes_everything_is_an_error():
    with pytest.raises(HapmoeError, match="fits the budget"):
        mix_clusters(["h800:8-16:8"], "devices<=4")


@pytest.mark.parametrize("text", ["h800", "h800=", "h800=abc", "h800=-1", "=2"])
def test_bad_prices_name_the_prices_argument(text):
    with pytest.raises(HapmoeError) as ei:
        parse_prices(text)
    assert ei.value.field == "prices"


def test_case_ids_are_stable_and_canonical():
    a = SweepCase.make("Mixtral-S", " 8 x H800 + 8*910b ")
    b = SweepCase.make("mixtral-s", "8xh800+8x910b", prices={"h800": 3.0})
    assert a.id == b.id  # case, whitespace, '*' and prices do not change the id
    assert a.cluster == "8xh800+8x910b"
    c = SweepCase.make("mixtral-s", "8xh800+8x910b", {"global_batch_size": 64})
    assert c.id != a.id
    # settings order does not matter; the id is a pure function of the content (same across processes)
    d1 = SweepCase.make("m", "c", {"seq_length": 2048, "family": "hetero"})
    d2 = SweepCase.make("m", "c", {"family": "hetero", "seq_length": 2048})
    assert d1.id == d2.id and len(d1.id) == 16
    assert SweepCase.make("mixtral-s", "16-1-h").id == "2bc629c6509ac1b6"


def test_cases_from_clusters_grid_and_order():
    cases = cases_from_clusters(["mixtral-s", "mixtral-l"], ["16-1", "16-1-h"], {"global_batch_size": [64, 128]})
    assert [(c.model, c.cluster, c.settings_dict["global_batch_size"]) for c in cases] == [
        ("mixtral-s", "16-1", 64),
        ("mixtral-s", "16-1", 128),
        ("mixtral-s", "16-1-h", 64),
        ("mixtral-s", "16-1-h", 128),
        ("mixtral-l", "16-1", 64),
        ("mixtral-l", "16-1", 128),
        ("mixtral-l", "16-1-h", 64),
        ("mixtral-l", "16-1-h", 128),
    ]
    assert len({c.id for c in cases}) == 8
    with pytest.raises(HapmoeError) as ei:
        cases_from_clusters(["mixtral-s"], ["16-1"], {"num_gpus": [1]})
    assert ei.value.field == "settings.num_gpus"


def test_cases_from_mix_carry_prices_and_settings():
    cases = cases_from_mix(
        ["mixtral-s"], ["h800:0-8:8", "910b:0-8:8"], "devices<=8", prices="h800=2", settings_grid=[{"family": "hetero"}]
    )
    assert [c.cluster for c in cases] == ["8x910b", "8xh800"]
    assert all(dict(c.prices) == {"h800": 2.0} and c.settings_dict == {"family": "hetero"} for c in cases)


# ---------------------------------------------------------------------- running
def test_local_sweep_records_results_and_errors_and_goes_on(tmp_path):
    out = tmp_path / "r.jsonl"
    cases = cases_from_clusters([OK_A[0]], [OK_A[1], OK_B[1]], prices={"h800": 2.5, "910b": 1.0})
    cases += cases_from_clusters([INFEASIBLE[0]], [INFEASIBLE[1]], {"optimizer_offload": [False]})
    cases += cases_from_clusters(["mixtral-s"], ["no-such-cluster"])
    s = run_sweep(cases, out, workers=2, progress=False)
    assert (s.total, s.ran, s.ok, s.errors, s.skipped) == (4, 4, 2, 2, 0)
    rows = {r["id"]: r for r in lines_of(out)}
    assert set(rows) == {c.id for c in cases} and len(lines_of(out)) == 4
    assert [r["id"] for r in s.rows] == [c.id for c in cases]  # summary rows in case order

    a = rows[cases[0].id]
    assert a["status"] == "ok" and a["model"] == "mixtral-s"
    assert a["cluster"]["spec"] == "16-1-h" and a["cluster"]["by_type"] == {"h800": 16}
    assert a["devices"] == 16 and a["devices_used"] <= 16
    assert a["tokens_per_s"] > 0 and 0 < a["mfu"] < 1 and a["iteration_time_s"] > 0
    assert a["tokens_per_s_per_device"] == pytest.approx(a["tokens_per_s"] / a["devices_used"])
    assert a["price_per_hour"] == pytest.approx(16 * 2.5)
    assert a["tokens_per_dollar"] == pytest.approx(a["tokens_per_s"] * 3600 / 40.0)
    assert sum(st["devices"] for st in a["plan"]["stages"]) == a["devices_used"]
    assert a["plan"]["stages"][-1]["layers"][1] == 24 and a["plan"]["pp"] == len(a["plan"]["stages"])
    assert a["solver"]["name"] == "dp" and a["solver"]["wall_s"] > 0

    b = rows[cases[1].id]
    assert b["status"] == "ok" and b["cluster"]["by_type"] == {"h800": 8, "910b": 8}
    assert b["price_per_hour"] == pytest.approx(8 * 2.5 + 8 * 1.0)

    bad = rows[cases[2].id]
    assert bad["status"] == "error" and bad["error_type"] == "InfeasibleError"
    assert "memory" in bad["error"] and bad["settings"] == {"optimizer_offload": False}
    unknown = rows[cases[3].id]
    assert unknown["status"] == "error" and "unknown cluster" in unknown["error"]


def test_worker_exception_becomes_an_error_row():
    case = SweepCase.make("mixtral-s", "16-1-h")
    row = run_case(case, None, None)  # type: ignore[arg-type]
    assert row["status"] == "error" and row["id"] == case.id
    assert row["error_type"] not in ("", "HapmoeError") and row["error"]


def test_refuses_to_overwrite_unless_asked(tmp_path):
    out = tmp_path / "r.jsonl"
    cases = cases_from_clusters(["mixtral-s"], ["no-such-a", "no-such-b"])  # fail on the driver: no pool
    run_sweep(cases, out, progress=False)
    with pytest.raises(HapmoeError, match="--resume") as ei:
        run_sweep(cases, out, progress=False)
    assert ei.value.field == "out_jsonl"
    s = run_sweep(cases[:1], out, progress=False, overwrite=True)
    assert s.ran == 1 and len(lines_of(out)) == 1
    s = run_sweep(cases, out, progress=False, resume=True)
    assert (s.skipped, s.ran) == (1, 1) and len(lines_of(out)) == 2
    s = run_sweep(cases + cases, out, progress=False, resume=True)  # duplicates in the input are dropped
    assert (s.total, s.skipped, s.ran) == (2, 2, 0) and len(lines_of(out)) == 2


def test_resume_keeps_a_complete_last_line_without_newline(tmp_path):
    out = tmp_path / "r.jsonl"
    cases = cases_from_clusters(["mixtral-s"], ["no-such-a", "no-such-b"])
    run_sweep(cases, out, progress=False)
    out.write_bytes(out.read_bytes().rstrip(b"\n"))  # newline lost, JSON complete
    s = run_sweep(cases, out, progress=False, resume=True)
    assert (s.skipped, s.ran) == (2, 0)
    assert [r["id"] for r in lines_of(out)] == [c.id for c in cases]


def test_corrupt_line_in_the_middle_is_reported(tmp_path):
    out = tmp_path / "r.jsonl"
    a, b = (json.dumps(error_row(c, "no plan")) for c in cases_from_clusters(["mixtral-s"], ["16-1", "16-2"]))
    out.write_text(f"{a}\nnot json\n{b}\n")
    with pytest.raises(HapmoeError, match="line 2"):
        read_results(out)
    out.write_text(f'{a}\n{b[:-1]}, "status": "ok"}}\n')  # an ok row without its numbers: line 2's field
    with pytest.raises(HapmoeError, match=r"line 2: status: duplicate key|line 2.*status"):
        read_results(out)


KILLED_SWEEP = textwrap.dedent(
    """
    import sys
    from hapmoe_milp.sweep import cases_from_clusters, run_sweep
    cases = cases_from_clusters(["mixtral-s"], sys.argv[2].split(";"))
    run_sweep(cases, sys.argv[1], workers=1, progress=False)
    """
)
KILL_CLUSTERS = ["8xh800", "8x910b", "4xh800+4x910b", "4xh800", "16-1-h", "8xh800+8x910b"]


def test_resume_after_kill_runs_every_case_exactly_once(tmp_path):
    out = tmp_path / "killed.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_SWEEP, str(out), ";".join(KILL_CLUSTERS)],
        start_new_session=True,  # its own process group, so the pool worker dies with it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if out.exists() and out.read_bytes().count(b"\n") >= 1:
                break
            if proc.poll() is not None:
                pytest.fail(f"sweep exited early: {proc.stderr.read().decode() if proc.stderr else ''}")
            time.sleep(0.02)
        else:
            pytest.fail("no result line within 90 s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    before = lines_of(out)
    assert 1 <= len(before) < len(KILL_CLUSTERS), "the kill should interrupt the sweep"
    # what a kill in the middle of a write would leave behind
    with out.open("ab") as f:
        f.write(b'{"id": "0123456789abcdef", "status": "o')
    assert [r["id"] for r in read_results(out)] == [r["id"] for r in before]  # reading ignores the torn line

    cases = cases_from_clusters(["mixtral-s"], KILL_CLUSTERS)
    s = run_sweep(cases, out, workers=2, resume=True, progress=False)
    assert (s.skipped, s.ran, s.total) == (len(before), len(KILL_CLUSTERS) - len(before), len(KILL_CLUSTERS))
    after = lines_of(out)  # every line parses: the truncated one was removed
    ids = [r["id"] for r in after]
    assert sorted(ids) == sorted(c.id for c in cases) and len(ids) == len(set(ids))
    assert after[: len(before)] == before  # earlier results untouched
    assert all(r["status"] == "ok" for r in after)
    # resuming a finished sweep does nothing
    again = run_sweep(cases, out, resume=True, progress=False)
    assert again.ran == 0 and lines_of(out) == after


@pytest.mark.ray
def test_ray_backend_runs_a_small_sweep_in_a_local_instance(tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "ray.jsonl"
    cases = cases_from_clusters(["mixtral-s"], ["8xh800", "8xh800+8x910b"])
    cases += cases_from_clusters([INFEASIBLE[0]], [INFEASIBLE[1]], {"optimizer_offload": [False]})
    s = run_sweep(cases, out, backend="ray", workers=2, progress=False)
    assert (s.ran, s.ok, s.errors) == (3, 2, 1)
    rows = {r["id"]: r for r in lines_of(out)}
    assert set(rows) == {c.id for c in cases}
    assert rows[cases[2].id]["error_type"] == "InfeasibleError"
    import ray

    assert not ray.is_initialized(), "the sweep shuts down the instance it started"
    # same cases, same answers as the local backend would give (deterministic solver)
    local = run_case(cases[0], Catalog().model("mixtral-s"), Catalog().cluster("8xh800"))
    assert rows[cases[0].id]["tokens_per_s"] == pytest.approx(local["tokens_per_s"])


def test_ray_missing_gives_install_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    cases = cases_from_clusters(["mixtral-s"], ["8xh800"])
    with pytest.raises(HapmoeError, match=r"hapmoe-milp\[ray\]") as ei:
        run_sweep(cases, tmp_path / "r.jsonl", backend="ray", progress=False)
    assert ei.value.field == "backend"
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize(
    ("kw", "fld"),
    [
        ({"backend": "slurm"}, "backend"),
        ({"workers": 0}, "workers"),
        ({"address": "ray://x:10001"}, "address"),
        ({"resume": True, "overwrite": True}, "resume"),
        ({"solver": "gurobi"}, "solver"),
    ],
)
def test_bad_run_options(tmp_path, kw, fld):
    with pytest.raises(HapmoeError) as ei:
        run_sweep([], tmp_path / "r.jsonl", progress=False, **kw)
    assert ei.value.field == fld


# ---------------------------------------------------------------------- analysis
def _row(model: str, spec: str, devices: int, tps: float, price: float | None = None, status: str = "ok") -> dict:
    return {
        "id": f"{model}/{spec}",
        "model": model,
        "cluster": {"spec": spec, "devices": devices},
        "status": status,
        "devices": devices,
        "tokens_per_s": tps,
        "tokens_per_s_per_device": tps / devices,
        "price_per_hour": price,
        "tokens_per_dollar": tps * 3600 / price if price else None,
    }


ROWS = [
    _row("m", "8a", 8, 100.0, 8.0),
    _row("m", "8b", 8, 120.0, 16.0),
    _row("m", "16a", 16, 110.0, 12.0),  # dominated by 8b on devices, not on price
    _row("m", "16b", 16, 300.0, 40.0),
    _row("m", "24a", 24, 310.0, 30.0),
    _row("m", "32a", 32, 0.0, 1.0, status="error"),
    _row("n", "8a", 8, 50.0),
]


def test_pareto_front_on_devices_and_price():
    front = [(r["model"], r["cluster"]["spec"]) for r in pareto_front(ROWS)]
    assert front == [("m", "8b"), ("m", "16b"), ("m", "24a"), ("n", "8a")]
    by_price = [r["cluster"]["spec"] for r in pareto_front(ROWS, x="price")]
    assert by_price == ["8a", "16a", "8b", "24a"]  # rows without a price (model n) drop out
    with pytest.raises(HapmoeError) as ei:
        pareto_front([_row("n", "8a", 8, 50.0)], x="price")
    assert ei.value.field == "prices"


def test_best_table_per_model_and_metric():
    best = {(b["model"], b["metric"]): b["cluster"] for b in best_table(ROWS)}
    assert best == {
        ("m", "tokens_per_s"): "24a",
        ("m", "tokens_per_s_per_device"): "16b",
        ("m", "tokens_per_dollar"): "8a",
        ("n", "tokens_per_s"): "8a",
        ("n", "tokens_per_s_per_device"): "8a",
    }
    top2 = [b["cluster"] for b in best_table(ROWS, top=2) if b["model"] == "m" and b["metric"] == "tokens_per_s"]
    assert top2 == ["24a", "16b"]


def test_plot_sweep_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    from hapmoe_milp.sweep import plot_sweep

    for x in ("devices", "price"):
        p = plot_sweep(ROWS, tmp_path / f"s-{x}.png", x=x)
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    with pytest.raises(HapmoeError):
        plot_sweep([_row("m", "x", 8, 1.0, status="error")], tmp_path / "none.png")


CRASHY = """
import os

def run_case(case, model, cluster, solver="dp", time_limit=None):
    if case.cluster.startswith("crash"):
        os._exit(3)
    return {
        "id": case.id, "model": case.model, "cluster": {"spec": case.cluster}, "settings": {}, "status": "ok",
        "tokens_per_s": 8.0, "tokens_per_s_per_device": 1.0, "iteration_time_s": 1.0, "devices": 8,
    }
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_a_dying_worker_fails_only_its_own_case(tmp_path, monkeypatch, workers):
    """A worker killed mid-case (out of memory, native crash) is that case's error; in-flight neighbours re-run."""
    (tmp_path / "crashy_worker.py").write_text(CRASHY)
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers inherit sys.path
    import importlib

    import hapmoe_milp.sweep.runners as runners

    crashy = importlib.import_module("crashy_worker")
    monkeypatch.setattr(runners, "run_case", crashy.run_case)
    monkeypatch.setattr(runners._Resolver, "cluster", lambda self, ref: Catalog().cluster("8xh800"))
    specs = ["ok-1", "crash-1", "ok-2", "ok-3", "ok-4"]
    cases = cases_from_clusters(["mixtral-s"], specs)
    out = tmp_path / "r.jsonl"
    s = run_sweep(cases, out, workers=workers, progress=False)
    rows = {r["cluster"]["spec"]: r for r in lines_of(out)}
    assert sorted(rows) == sorted(specs) and len(lines_of(out)) == len(specs)
    assert rows["crash-1"]["status"] == "error" and "worker process died" in rows["crash-1"]["error"]
    assert all(rows[k]["status"] == "ok" for k in specs if k != "crash-1")
    assert (s.ok, s.errors) == (4, 1)


def test_progress_bar_goes_to_stderr(tmp_path, capsys):
    cases = cases_from_clusters(["mixtral-s"], ["no-such-a", "no-such-b"])
    run_sweep(cases, tmp_path / "r.jsonl", progress=True)
    cap = capsys.readouterr()
    assert "sweep (local)" in cap.err and "2/2" in cap.err
    assert cap.out == ""


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_driver_takes_its_workers_along(tmp_path):
    """SIGKILL cannot be caught, so the workers watch their parent and exit when it is gone."""
    import signal
    import subprocess
    import time

    script = (
        "import sys\n"
        "from hapmoe_milp.sweep import cases_from_clusters, run_sweep\n"
        "cases = cases_from_clusters(['mixtral-l'], ['256-h800-910b', '1024-h100-a100'])\n"
        "run_sweep(cases, sys.argv[1], workers=2, time_limit=600, progress=False)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "r.jsonl")])
    try:
        deadline = time.monotonic() + 120
        kids: list[int] = []
        while time.monotonic() < deadline and len(kids) < 2:
            time.sleep(0.2)
            kids = [k for k in _children(p.pid) if _alive(k)]
        assert len(kids) >= 2, "the pool did not start"
        time.sleep(1.0)  # let the workers reach their solve
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(k) for k in kids):
        time.sleep(0.2)
    assert not [k for k in kids if _alive(k)]
