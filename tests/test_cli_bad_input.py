"""Bad input, every way we can think of: each case must exit 2, print no traceback, print exactly one
``error:`` line that names the file or flag and the field, and leave the folder exactly as it was.

Table-driven cases cover every numeric and choice flag of the commands, and hand-picked broken model,
cluster, device, preset, HF-config and plan files; property-based cases (hypothesis) mutate the catalog's
model and cluster files and a valid plan file with values that are invalid by construction (non-integers,
non-positive or over-the-cap numbers, wrong types, unknown keys). Everything runs in this process through
``cli.run`` so the few hundred cases take seconds.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hapmoe_milp import cli
from hapmoe_milp.config import ParallelConfig, Settings
from hapmoe_milp.plan import Plan, Stage
from hapmoe_milp.specs import Catalog

CAT = Catalog()
ROOT = CAT.root
MIX = CAT.model("mixtral-s")
C16 = CAT.cluster("8xh800+8xa100")  # two NVIDIA types: a plan upstream Megatron-LM runs
G4 = ParallelConfig(tp=2, dp=2, ep=4)
GOOD_PLAN = Plan.from_settings(
    MIX,
    C16,
    "megatron",
    (Stage("h800", G4, 0, 8), Stage("h800", G4, 8, 15), Stage("a100", G4, 15, 20), Stage("a100", G4, 20, 24)),
    Settings(seq_length=4096, global_batch_size=256, micro_batch_size=1, dispatcher="allgather"),
)
GOOD_PLAN_DOC = json.loads(GOOD_PLAN.to_json())
MODEL_DOC = yaml.safe_load((ROOT / "models" / "mixtral-s.yaml").read_text())
CLUSTER_DOC = yaml.safe_load((ROOT / "clusters" / "16-1.yaml").read_text())
DEVICE_DOC = yaml.safe_load((ROOT / "clusters" / "devices" / "h800.yaml").read_text())
HF_DOC = {
    "model_type": "mixtral",
    "architectures": ["MixtralForCausalLM"],
    "num_hidden_layers": 4,
    "hidden_size": 1024,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
    "intermediate_size": 2048,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 4096,
}


# ---------------------------------------------------------------------- the harness
def snapshot(d: Path) -> dict[str, tuple[int, str]]:
    out = {}
    for p in sorted(d.rglob("*")):
        rel = str(p.relative_to(d))
        if p.is_dir():
            out[rel + "/"] = (0, "dir")
        else:
            out[rel] = (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def run_bad(argv: list[str], where: Path, capsys: Any, *names: str, only_line: bool = False) -> str:
    """Run the CLI on ``argv`` in folder ``where``; assert the bad-input promises; return the error line.

    ``validate`` reports every broken rule of a well-formed plan, one ``error: ... [rule]`` line each (that
    is its job); there the first line must name the field and every line its rule."""
    before = snapshot(where)
    cwd = os.getcwd()
    os.chdir(where)
    try:
        code = cli.run(argv)
    finally:
        os.chdir(cwd)
    out, err = capsys.readouterr()
    assert code == 2, f"{argv}: exit {code}\nstdout: {out[-500:]}\nstderr: {err[-1500:]}"
    assert "Traceback" not in out + err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    if argv[:1] == ["validate"] and len(errors) > 1:
        assert all(re.search(r"\[rule_\w+\]$", ln) for ln in errors), err
    else:
        assert len(errors) == 1, f"{argv}: expected one error line, got:\n{err}"
    line = errors[0]
    for name in names:
        assert name in line, f"{argv}: {name!r} not in {line!r}"
    assert out == "", f"{argv}: stdout must stay empty on error, got {out[:300]!r}"
    assert snapshot(where) == before, f"{argv}: the folder changed"
    if only_line:
        assert err.splitlines() == [line], f"{argv}: stderr must be the one error line, got:\n{err}"
    return line


def write(where: Path, name: str, doc: Any) -> Path:
    p = where / name
    if isinstance(doc, str):
        p.write_text(doc, encoding="utf-8")
    elif name.endswith(".json"):
        p.write_text(json.dumps(doc), encoding="utf-8")
    else:
        p.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return p


# ---------------------------------------------------------------------- flags (table-driven)
EST = ["estimate", "-m", "mixtral-s", "-c", "16-1-h", "--tp", "2", "--pp", "2", "--ep", "4", "--etp", "1"]
SOLVE = ["solve", "-m", "mixtral-s", "-c", "16-1"]
INT_BAD = ["0", "-1", "-8", "abc", "1.5", "99999999999999999999999", "nan", ""]
FLOAT_BAD = ["nan", "inf", "-inf", "abc", "0.5", "-1", "1e400"]

FLAG_CASES: list[tuple[list[str], str]] = []
for flag in ("--tp", "--pp", "--cp", "--ep", "--etp", "--vpp", "--mbs", "--gbs", "--seq"):
    for v in INT_BAD:
        base = EST if flag not in ("--tp", "--pp", "--ep", "--etp") else ["estimate", "-m", "mixtral-s", "-c", "16-1-h"]
        FLAG_CASES.append(([*base, flag, v], flag))
for flag in ("--gbs", "--seq", "--mbs"):
    for v in ("0", "-8", "abc", "16777217"):
        FLAG_CASES.append(([*SOLVE, flag, v], flag))
for v in FLOAT_BAD:
    FLAG_CASES.append(([*EST, "--imbalance", v], "--imbalance"))
    FLAG_CASES.append(([*SOLVE, "--imbalance", v], "--imbalance"))
for v in ("0", "-1", "nan", "inf", "abc", "-0.0", "1e9"):
    FLAG_CASES.append(([*SOLVE, "--time-limit", v], "--time-limit"))
    FLAG_CASES.append((["compare", "-m", "mixtral-s", "-c", "16-1", "--time-limit", v], "--time-limit"))
    FLAG_CASES.append(
        (["sweep", "-m", "mixtral-s", "--clusters", "16-1", "--out", "r.jsonl", "--time-limit", v], "--time-limit")
    )
for flag, bad in (
    ("--precision", ["fp4", "BF16", ""]),
    ("--dispatcher", ["magic", "all2all", ""]),
    ("--family", ["both2", "Megatron", ""]),
    ("--solver", ["gurobi", "DP", ""]),
    ("--optimizer-offload", ["yes", "1", ""]),
    ("--export", ["deepspeed", ""]),
):
    for v in bad:
        args = [*SOLVE, flag, v] + (["--out", "launch"] if flag == "--export" else [])
        FLAG_CASES.append((args, flag))
# optimizer offload has one vocabulary (auto/on/off); one fixed plan (estimate) is either on or off
for argv in (
    [*EST, "--optimizer-offload", "auto"],
    [*EST, "--optimizer-offload", "yes"],
    ["compare", "-m", "mixtral-s", "-c", "16-1", "--optimizer-offload", "true"],
):
    FLAG_CASES.append((argv, "--optimizer-offload"))
for v in ("fp4", "magic"):
    FLAG_CASES.append(
        ([*EST, "--precision" if v == "fp4" else "--dispatcher", v], "--precision" if v == "fp4" else "--dispatcher")
    )
FLAG_CASES += [
    ([*EST, "--recompute", "some"], "--recompute"),
    (["estimate", "-m", "mixtral-s", "-c", "16-1-h", "--tp", "3"], "tp"),
    (["estimate", "-m", "mixtral-s", "-c", "16-1-h", "--tp", "2", "--pp", "2", "--ep", "3"], "--ep"),
    (["estimate", "-m", "mixtral-s", "-c", "16-1-h", "--tp", "16"], "--tp"),
    (["estimate", "-m", "mixtral-s", "-c", "16-1", "--pp", "1"], "--pp"),
    (["estimate", "-m", "mixtral-s", "-c", "16-1-h", "--pp", "5"], "--pp"),
    ([*EST, "--vpp", "64"], "--vpp"),
    ([*EST, "--vpp", "1000"], "--vpp"),
    ([*EST, "--mbs", "3"], "--mbs"),
    ([*EST, "--layout", "Et*12|t*12"], "--layout"),
    ([*EST, "--layout", "Et*12|t*11L"], "--layout"),
    ([*EST, "--layout", "E(t|)*99999999L"], "--layout"),
    (["estimate", "-m", "mixtral-s"], "--cluster"),
    (["estimate", "-c", "16-1"], "--model"),
    (["estimate", "-m", "nope", "-c", "16-1"], "--model"),
    (["estimate", "-m", "mixtral-s", "-c", "nope"], "--cluster"),
    (["estimate", "-m", "mixtral-s", "-c", "16-1", "--plan", "missing.json"], "missing.json"),
    (["solve", "-m", "mixtral-s"], "--cluster"),
    ([*SOLVE, "--export", "megatron"], "--out"),
    ([*SOLVE, "--export", "megatron", "--family", "hetero", "--out", "x"], "--family"),
    (
        ["solve", "-m", "mixtral-s", "-c", "16-2-h", "--export", "mindspeed", "--family", "hetero", "--out", "x"],
        "--family",
    ),
    ([*SOLVE, "--out", "no/such/folder/plan.json"], "--out"),
    ([*SOLVE, "--out", "."], "--out"),
    ([*SOLVE, "--plot", "no/such/plot.png"], "--plot"),
    ([*SOLVE, "--plot", "plot.txt"], "--plot"),
    ([*SOLVE, "--solver-config", "no-such-preset"], "no-such-preset"),
    (["compare", "-m", "mixtral-s", "-c", "16-1", "--family", "x"], "--family"),
    (["compare", "-m", "mixtral-s", "-c", "16-1", "--solvers", ","], "--solvers"),
    (["compare", "-m", "mixtral-s", "-c", "16-1", "--against", ","], "--against"),
    (["compare", "-m", "mixtral-s", "-c", "16-1", "--gbs", "0"], "--gbs"),
    (["sweep", "-m", "mixtral-s", "--out", "r.jsonl"], "--clusters"),
    (["sweep", "-m", "mixtral-s", "--clusters", "16-1", "--mix", "h800:8", "--out", "r.jsonl"], "--clusters"),
    (["sweep", "-m", "mixtral-s", "--mix", "h800:8-99999999:8", "--out", "r.jsonl"], "--mix"),
    (["sweep", "-m", "mixtral-s", "--mix", "h800:8-9999:8", "--mix", "910b:8-9999:8", "--out", "r.jsonl"], "--mix"),
    (["sweep", "-m", "mixtral-s", "--mix", "h800:16-8", "--out", "r.jsonl"], "--mix"),
    (["sweep", "-m", "mixtral-s", "--mix", "h800", "--out", "r.jsonl"], "--mix"),
    (["sweep", "-m", "mixtral-s", "--mix", "h800:0-16:0", "--out", "r.jsonl"], "--mix"),
    (["sweep", "-m", "mixtral-s", "--mix", "nope:8", "--out", "r.jsonl"], "--mix"),
    (["sweep", "-m", "mixtral-s", "--mix", "h800:8", "--prices", "910b=1", "--out", "r.jsonl"], "--prices"),
    (["sweep", "-m", "mixtral-s", "--mix", "h800:8", "--prices", "h800=-1", "--out", "r.jsonl"], "--prices"),
    (["sweep", "-m", "mixtral-s", "--mix", "h800:8", "--prices", "h800=nan", "--out", "r.jsonl"], "--prices"),
    (["sweep", "-m", "mixtral-s", "--mix", "h800:8", "--budget", "gpus<4", "--out", "r.jsonl"], "--budget"),
    (["sweep", "-m", "mixtral-s", "--mix", "h800:8", "--budget", "devices<=4", "--out", "r.jsonl"], "--budget"),
    (["sweep", "-m", "mixtral-s", "--clusters", "16-1", "--out", "r.jsonl", "--workers", "0"], "--workers"),
    (["sweep", "-m", "mixtral-s", "--clusters", "16-1", "--out", "r.jsonl", "--backend", "slurm"], "--backend"),
    (["sweep", "-m", "mixtral-s", "--clusters", "16-1", "--out", "r.jsonl", "--solver", "gurobi"], "--solver"),
    (["sweep", "-m", "mixtral-s", "--clusters", "16-1", "--out", "r.jsonl", "--gbs", "0"], "--gbs"),
    (["sweep", "-m", "mixtral-s", "--clusters", "16-1", "--out", "r.jsonl", "--family", "x"], "--family"),
    (["sweep", "-m", "mixtral-s", "--clusters", "16-1", "--out", "r.jsonl", "--x", "cost"], "--x"),
    (["sweep", "-m", "mixtral-s", "--clusters", "16-1", "--out", "."], "--out"),
    (["sweep", "-m", "mixtral-s", "--clusters", "16-1", "--out", "r.jsonl", "--resume", "--overwrite"], "--resume"),
    (["models", "nope"], "unknown model"),
    (["clusters", "8xfoo"], "unknown device"),
    (["clusters", "0xh800"], "NAME"),
    (["clusters", "99999992xh800"], "NAME"),
    (["clusters", "12xh800"], "12xh800"),
    (["clusters", "8xh800+"], "NAME"),
    (["devices", "nope"], "unknown device"),
    (["validate", "missing.json"], "missing.json"),
    (["validate", "missing.json", "--target", "deepspeed"], "--target"),
    ([*SOLVE, "--export", "mindspeed", "--out", "x"], "--export"),  # 16-1 is not Ascend-only
    ([*SOLVE, "--runtime", "megatron"], "--runtime"),  # nor NVIDIA-only
    (["export", "missing.json", "--target", "megatron", "--out", "o"], "missing.json"),
    (["export", "missing.json", "--target", "tpu", "--out", "o"], "--target"),
    (["profile", "--device-name", "bad name", "--out", "p"], "--device-name"),
    (["compare-profile", "nope", "h800"], "unknown device"),
    # second pass (issue 20): folders that are not, layouts that expand without end, nothing to report
    (["--devices-dir", "no-such-folder", "devices"], "--devices-dir"),
    (["--devices-dir", "r.jsonl", "devices"], "--devices-dir"),
    ([*EST, "--layout", "E(t*999999|)*100000L"], "--layout"),
    ([*EST, "--layout", "E" + "(t*9|)*99999" * 40 + "L"], "--layout"),
    (["compare", "-m", "mixtral-s", "-c", "16-1", "--solvers", "dp", "--time-limit", "0.001"], "--time-limit"),
    (["fidelity", "public", "--device", "v100"], "--device"),
    # fresh hostile inputs found while hardening (issue 20): refused before any work, naming the flag
    (["estimate", "-m", "mixtral-s", "-c", "16-1-h", "--pp", "2", "--vpp", "2", "--layout", "Et*12|t*12L"], "--vpp"),
    (["sweep", "-m", "mixtral-s", "--mix", "h800:8", "--prices", "h800=1e300", "--out", "r.jsonl"], "--prices"),
    (["sweep", "-m", "mixtral-s", "--mix", "h800:8", "--prices", "h800=1e-320", "--out", "r.jsonl"], "--prices"),
    (["sweep", "-m", "mixtral-s", "--mix", "h800:8", "--budget", "price<=1e400", "--out", "r.jsonl"], "--budget"),
    (["calibrate", "public", "--device", "h100", "--params", ",", "--out", "cal"], "--params"),
    (["profile", "--device-name", "x", "--out", "p", "--nproc", "0"], "--nproc"),
    (["profile", "--device-name", "x", "--out", "p", "--collectives", "nope.json"], "nope.json"),
    (["sweep", "-m", "mixtral-s", "--clusters", "16-1", "--out", "/dev/null"], "--out"),
    ([*EST, "--gbs", "16777216", "--simulate"], "--simulate"),
    (["compare", "-m", "mixtral-s", "-c", "16-1", "--against", "megatron", "--time-limit", "1e-9"], "--time-limit"),
]
# usage errors: one error line (pointing at --help), exit 2
USAGE_CASES: list[tuple[list[str], str]] = [
    ([], "command"),
    (["frobnicate"], "frobnicate"),
    (["solve", "--bogus"], "--bogus"),
    (["estimate", "--tp"], "--tp"),
    (["export", "plan.json", "--out", "x", "--target", "deepspeed"], "--target"),
    (["export", "plan.json", "--target", "megatron"], "--out"),
    (["sweep", "--out", "r.jsonl"], "--model"),
    (["profile", "--out", "x"], "--device-name"),
    (["validate"], "plan"),
    (["-v", "nope"], "nope"),
    (["--devices-dir"], "--devices-dir"),
    (["models", "a", "b"], "b"),
]


@pytest.mark.parametrize(
    ("argv", "name"), FLAG_CASES + USAGE_CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else v
)
def test_bad_flags(argv: list[str], name: str, tmp_path: Path, capsys: Any) -> None:
    run_bad(argv, tmp_path, capsys, name)


@pytest.mark.parametrize(("argv", "name"), USAGE_CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_usage_errors_are_one_line(argv: list[str], name: str, tmp_path: Path, capsys: Any) -> None:
    """No usage banner, no hint line: stderr is the one error line, as for every other bad input."""
    run_bad(argv, tmp_path, capsys, name, only_line=True)


@pytest.mark.parametrize("cmd", ["solve", "sweep"])
def test_output_that_is_not_a_regular_file(cmd: str, tmp_path: Path, capsys: Any) -> None:
    """A FIFO (or a device such as /dev/full) as --out: an atomic write would replace the special file."""
    with tempfile.TemporaryDirectory() as other:  # outside the folder run_bad snapshots (reading a FIFO blocks)
        fifo = Path(other) / "fifo"
        os.mkfifo(fifo)
        argv = [*SOLVE, "--out", str(fifo)]
        if cmd == "sweep":
            argv = ["sweep", "-m", "mixtral-s", "--clusters", "x", "--out", str(fifo)]
        run_bad(argv, tmp_path, capsys, str(fifo), "--out", "regular file")
        assert fifo.is_fifo()


def test_profile_refuses_a_bad_peak_before_creating_anything(tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("torch")  # without torch the refusal is that torch is missing (also before any folder)
    run_bad(
        ["profile", "--device-name", "x", "--out", "p/q", "--peak-tflops", "1e-320"], tmp_path, capsys, "--peak-tflops"
    )


def test_profile_without_torch_creates_nothing(tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # as if the `profile` extra were not installed
    run_bad(["profile", "--device-name", "x", "--out", "p/q"], tmp_path, capsys, "PyTorch")


def test_inputs_that_look_hostile_but_are_valid(tmp_path: Path, capsys: Any) -> None:
    """Spreadsheet CSVs start with a byte-order mark; YAML 1.1 would read 1e3 as a string; nested repeats."""
    csv = tmp_path / "runs.csv"
    row = RUNS_DOC
    cols = ["id", "source", "model", "cluster", "ep", "etp", "seq_length", "global_batch_size", "step_time_s"]
    csv.write_bytes(("\ufeff" + ",".join(cols) + "\n" + ",".join(str(row[c]) for c in cols) + "\n").encode())
    assert cli.run(["fidelity", str(csv), "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)["runs"]] == [row["id"]]
    f = write(
        tmp_path,
        "m.yaml",
        "moe_layer_freq: '((([1]*2)*2)*6)'\n"
        + yaml.safe_dump({**MODEL_DOC, "moe_layer_freq": 1}).replace("moe_layer_freq: 1\n", ""),
    )
    assert cli.run(["models", str(f), "--json"]) == 0
    capsys.readouterr()


# ---------------------------------------------------------------------- files (table-driven)
def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    d = copy.deepcopy(doc)
    node: Any = d
    keys = re.findall(r"[^.\[\]]+", path)
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if value is _DEL:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return d


_DEL = object()


def _case_id(v: Any) -> str:
    """A stable test id (a deleted field reads as such, not as an address that differs per process)."""
    return "<deleted>" if v is _DEL else str(v)[:40]


MODEL_CASES: list[tuple[str, Any, str]] = [
    ("num_layers", 0, "num_layers"),
    ("num_layers", -3, "num_layers"),
    ("num_layers", 10**12, "num_layers"),
    ("num_layers", "24", "num_layers"),
    ("num_layers", 2.5, "num_layers"),
    ("num_layers", True, "num_layers"),
    ("num_layers", [24], "num_layers"),
    ("num_layers", _DEL, "num_layers"),
    ("hidden_size", 0, "hidden_size"),
    ("hidden_size", 10**9, "hidden_size"),
    ("num_attention_heads", 0, "num_attention_heads"),
    ("num_attention_heads", 7, "num_query_groups"),
    ("num_query_groups", 64, "num_query_groups"),
    ("num_query_groups", 3, "num_query_groups"),
    ("num_experts", -1, "num_experts"),
    ("num_experts", 10**7, "num_experts"),
    ("moe_router_topk", 9, "moe_router_topk"),
    ("moe_router_topk", 0, "moe_router_topk"),
    ("moe_layer_freq", 0, "moe_layer_freq"),
    ("moe_layer_freq", [1, 0], "moe_layer_freq"),
    ("moe_layer_freq", [2] * 24, "moe_layer_freq"),
    ("moe_layer_freq", "([1]*99999999)", "moe_layer_freq"),
    ("moe_layer_freq", "([0]*2+[1]*(22)", "moe_layer_freq"),
    ("moe_layer_freq", "__import__('os')", "moe_layer_freq"),
    ("moe_layer_freq", {"a": 1}, "moe_layer_freq"),
    ("vocab_size", 0, "vocab_size"),
    ("vocab_size", 10**10, "vocab_size"),
    ("ffn_hidden_size", -1, "ffn_hidden_size"),
    ("kv_channels", 0, "kv_channels"),
    ("mtp_num_layers", -1, "mtp_num_layers"),
    ("mtp_num_layers", 20000, "mtp_num_layers"),
    ("mtp_num_layers", 1010, "mtp_num_layers"),
    ("num_layers", 1025, "num_layers"),
    ("swiglu", "yes", "swiglu"),
    ("normalization", "BatchNorm", "normalization"),
    ("name", "mix tral", "name"),
    ("name", "x\nrm -rf /", "name"),
    ("name", "$(touch pwned)", "name"),
    ("name", "", "name"),
    ("name", ["a"], "name"),
    ("frobnicate", 1, "frobnicate"),
    ("defaults.seq_length", 0, "defaults.seq_length"),
    ("defaults.global_batch_size", -4, "defaults.global_batch_size"),
    ("defaults.micro_batch_size", 3, "defaults.micro_batch_size"),
    ("defaults.moe_token_dispatcher_type", "magic", "defaults.moe_token_dispatcher_type"),
    ("defaults.seq_length", 10**9, "defaults.seq_length"),
    ("defaults", [1], "defaults"),
    ("defaults.extra", 1, "defaults.extra"),
    ("source", {"a": 1}, "source"),
    ("moe_layer_freq", "(" * 400 + "[1]*24" + ")" * 400, "moe_layer_freq"),
    ("moe_layer_freq", "+".join(["[1]"] * 99_999), "moe_layer_freq"),
    ("num_experts", 2**70, "num_experts"),
    ("kv_channels", -(2**70), "kv_channels"),
    ("window_size", 2**200, "window_size"),
]

CLUSTER_CASES: list[tuple[str, Any, str]] = [
    ("groups", [], "groups"),
    ("groups", "h800", "groups"),
    ("groups[0].nodes", 0, "groups[0].nodes"),
    ("groups[0].nodes", -1, "groups[0].nodes"),
    ("groups[0].nodes", 99999999, "groups[0].nodes"),
    ("groups[0].nodes", 9000, "groups"),
    ("groups[0].nodes", "one", "groups[0].nodes"),
    ("groups[0].devices_per_node", 16, "groups[0].devices_per_node"),
    ("groups[0].devices_per_node", 0, "groups[0].devices_per_node"),
    ("groups[0].device", "nope", "groups[0].device"),
    ("groups[0].device", None, "groups[0].device"),
    ("groups[0].extra", 1, "groups[0].extra"),
    ("groups", [{"device": "h800", "nodes": 1}] * 65, "groups"),
    ("cross_link", {"efficiency": 2}, "cross_link.efficiency"),
    ("cross_link", {"efficiency": float("nan")}, "cross_link.efficiency"),
    ("cross_link", {"efficiency": -0.5}, "cross_link.efficiency"),
    ("cross_link", {"latency_us": -1}, "cross_link.latency_us"),
    ("cross_link", {"bandwidth_GBps": 0}, "cross_link.bandwidth_GBps"),
    ("cross_link", {"speed": 1}, "cross_link.speed"),
    ("prices", {"a100": 1.0}, "prices.a100"),
    ("prices", {"h800": -1.0}, "prices.h800"),
    ("prices", {"h800": "cheap"}, "prices.h800"),
    ("prices", [1], "prices"),
    ("name", "a b", "name"),
    ("name", "x;reboot", "name"),
    ("name", _DEL, "name"),
    ("colour", "red", "colour"),
    ("cross_link", {"bandwidth_GBps": 5e-324}, "cross_link.bandwidth_GBps"),
    ("cross_link", {"efficiency": 1e-300}, "cross_link.efficiency"),
    ("cross_link", {"latency_us": 1e300}, "cross_link.latency_us"),
    ("prices", {"h800": 1e300}, "prices.h800"),
]

DEVICE_CASES: list[tuple[str, Any, str]] = [
    ("id", "bad id", "id"),
    ("id", "$(id)", "id"),
    ("memory_gib", -1, "memory_gib"),
    ("memory_gib", 0, "memory_gib"),
    ("memory_gib", "80GB", "memory_gib"),
    ("devices_per_node", 0, "devices_per_node"),
    ("devices_per_node", 4096, "devices_per_node"),
    ("peak_tflops.bf16", -5, "peak_tflops.bf16"),
    ("peak_tflops", {}, "peak_tflops"),
    ("intra_node.fabric", "wormhole", "intra_node.fabric"),
    ("intra_node.per_pair_GBps", 10**6, "intra_node.per_pair_GBps"),
    ("nic_Gbps", float("inf"), "nic_Gbps"),
    ("provenance", "guess", "provenance"),
    ("tables.memory_bound_efficiency", 2, "tables.memory_bound_efficiency"),
    ("tables.gemm_efficiency.x", [3, 2, 1], "tables.gemm_efficiency"),
    ("tables.gemm_efficiency.y", [], "tables.gemm_efficiency.y"),
    ("tables.gemm_efficiency.extrapolate", "linear", "tables.gemm_efficiency.extrapolate"),
    ("sources", [], "sources"),
    ("colour", 1, "colour"),
    # denormal and extreme numbers: physical ranges (limits.RANGE_*), not just "positive"
    ("peak_tflops.bf16", 5e-324, "peak_tflops.bf16"),
    ("peak_tflops.bf16", 1e-300, "peak_tflops.bf16"),
    ("peak_tflops.fp8", 1e300, "peak_tflops.fp8"),
    ("memory_bandwidth_GBps", 5e-324, "memory_bandwidth_GBps"),
    ("memory_bandwidth_GBps", 1e30, "memory_bandwidth_GBps"),
    ("memory_gib", 1e-300, "memory_gib"),
    ("nic_Gbps", 5e-324, "nic_Gbps"),
    ("intra_node.per_device_GBps", 1e-320, "intra_node.per_device_GBps"),
    ("price_per_hour", 1e300, "price_per_hour"),
    ("tables.gemm_efficiency.y[0]", 5e-324, "tables.gemm_efficiency.y[0]"),
    ("tables.gemm_efficiency.x[0]", 5e-324, "tables.gemm_efficiency.x[0]"),
    ("tables.collectives.intra.all_reduce.y[0]", 1e-300, "tables.collectives.intra.all_reduce.y[0]"),
    ("tables.memory_bound_efficiency", 1e-300, "tables.memory_bound_efficiency"),
]


@pytest.mark.parametrize(("path", "value", "field"), MODEL_CASES, ids=_case_id)
def test_bad_model_files(path: str, value: Any, field: str, tmp_path: Path, capsys: Any) -> None:
    f = write(tmp_path, "model.yaml", _set(MODEL_DOC, path, value))
    run_bad(["estimate", "-m", str(f), "-c", "16-1-h", "--tp", "2"], tmp_path, capsys, str(f), field)


@pytest.mark.parametrize(("path", "value", "field"), CLUSTER_CASES, ids=_case_id)
def test_bad_cluster_files(path: str, value: Any, field: str, tmp_path: Path, capsys: Any) -> None:
    f = write(tmp_path, "cluster.yaml", _set(CLUSTER_DOC, path, value))
    run_bad(["estimate", "-m", "mixtral-s", "-c", str(f), "--pp", "2"], tmp_path, capsys, str(f), field)


@pytest.mark.parametrize(("path", "value", "field"), DEVICE_CASES, ids=_case_id)
def test_bad_device_files(path: str, value: Any, field: str, tmp_path: Path, capsys: Any) -> None:
    d = tmp_path / "devs"
    d.mkdir()
    doc = _set(DEVICE_DOC, path, value)
    if path != "id":
        doc["id"] = "mygpu"
    f = write(d, "mygpu.yaml", doc)
    run_bad(["--devices-dir", str(d), "devices", "mygpu"], tmp_path, capsys, str(f), field)


HF_CASES: list[tuple[str, Any, str]] = [
    ("num_hidden_layers", 10**12, "num_hidden_layers"),
    ("num_hidden_layers", 0, "num_hidden_layers"),
    ("hidden_size", "big", "hidden_size"),
    ("num_local_experts", 0, "num_local_experts"),
    ("num_experts_per_tok", 99, "moe_router_topk"),
    ("model_type", "bert", "model_type"),
    ("vocab_size", -1, "vocab_size"),
    ("num_local_experts", 2**70, "num_local_experts"),
    ("num_experts_per_tok", 2**70, "num_experts_per_tok"),
    ("intermediate_size", 2**70, "intermediate_size"),
    ("hidden_size", 2**70, "hidden_size"),
]


@pytest.mark.parametrize(("path", "value", "field"), HF_CASES, ids=_case_id)
def test_bad_hf_configs(path: str, value: Any, field: str, tmp_path: Path, capsys: Any) -> None:
    d = tmp_path / "my-model"
    d.mkdir()
    f = write(d, "config.json", _set(HF_DOC, path, value))
    run_bad(["models", str(f)], tmp_path, capsys, str(f), field)


def test_hidden_size_not_divisible_by_heads(tmp_path: Path, capsys: Any) -> None:
    doc = _set(_set(MODEL_DOC, "kv_channels", _DEL), "hidden_size", 4095)
    f = write(tmp_path, "model.yaml", doc)
    run_bad(["models", str(f)], tmp_path, capsys, str(f), "hidden_size")


def test_hf_mlp_only_layers_out_of_range(tmp_path: Path, capsys: Any) -> None:
    doc = {
        **HF_DOC,
        "model_type": "qwen2_moe",
        "num_experts": 8,
        "moe_intermediate_size": 512,
        "mlp_only_layers": [7],
        "shared_expert_intermediate_size": 0,
    }
    f = write(tmp_path, "config.json", doc)
    run_bad(["models", str(f)], tmp_path, capsys, str(f), "mlp_only_layers")


RAW_FILE_CASES: list[tuple[str, str, str]] = [
    ("model.yaml", "name: a\nname: b\n", "duplicate key"),
    ("model.yaml", "num_layers: [unclosed\n", "not valid YAML"),
    ("model.yaml", "- just\n- a list\n", "mapping"),
    ("model.yaml", "", "mapping"),
    ("model.yaml", "\x00\x01\x02", "YAML"),
    (
        "model.yaml",
        "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
        "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
        "name: *f\n",
        "expands to more than",
    ),
    ("model.json", '{"name": "a", "name": "b"}', "duplicate key"),
    ("model.json", '{"name": "a", "num_layers": NaN}', "NaN"),
    ("model.json", '{"name": "a", "num_layers": Infinity}', "Infinity"),
    ("model.json", '{"name": "a",', "not valid JSON"),
]


@pytest.mark.parametrize(("name", "text", "words"), RAW_FILE_CASES, ids=lambda v: str(v)[:30])
def test_bad_raw_model_files(name: str, text: str, words: str, tmp_path: Path, capsys: Any) -> None:
    f = write(tmp_path, name, text)
    line = run_bad(["models", str(f)], tmp_path, capsys, str(f), words)
    assert len(line) < 1100  # an alias bomb's expansion is never printed


def test_raw_bytes_model_file(tmp_path: Path, capsys: Any) -> None:
    f = tmp_path / "model.yaml"
    f.write_bytes(b"\xff\xfe\x00bad")
    run_bad(["models", str(f)], tmp_path, capsys, str(f), "UTF-8")


PRESET_CASES: list[tuple[str, str]] = [
    ("time_limit: 0\n", "time_limit"),
    ("time_limit: -1\n", "time_limit"),
    ("time_limit: .nan\n", "time_limit"),
    ("solver: gurobi\n", "solver"),
    ("pruning: {warp: true}\n", "pruning"),
    ("pruning: [1]\n", "pruning"),
    ("speed: 11\n", "speed"),
    # second pass: every value through the strict readers and its range (issue 20)
    ("threads: abc\n", "threads"),
    ("threads: -1\n", "threads"),
    ("threads: 1.5\n", "threads"),
    ("threads: 100000\n", "threads"),
    ("relative_gap: small\n", "relative_gap"),
    ("relative_gap: -1\n", "relative_gap"),
    ("relative_gap: .nan\n", "relative_gap"),
    ("relative_gap: 2\n", "relative_gap"),
    ("backend: foo\n", "backend"),
    ("backend: [cpsat]\n", "backend"),
    ("time_limit: 1e300\n", "time_limit"),
    ("time_limit: 1.0e+300\n", "time_limit"),
    ("time_limit: abc\n", "time_limit"),
    ("pruning: {delta: x}\n", "pruning.delta"),
    ("pruning: {delta: -0.5}\n", "pruning.delta"),
    ("pruning: {eta: -1}\n", "pruning.eta"),
    ("pruning: {max_stages: -1}\n", "pruning.max_stages"),
    ("pruning: {max_stages: 1.5}\n", "pruning.max_stages"),
    ("pruning: {max_vpp: 0}\n", "pruning.max_vpp"),
    ("pruning: {max_vpp: 65}\n", "pruning.max_vpp"),
    ("pruning: {pareto_eps: .nan}\n", "pruning.pareto_eps"),
    ("pruning: {pareto_eps: 5}\n", "pruning.pareto_eps"),
    ("pruning: {layer_band: yes please}\n", "pruning.layer_band"),
    ("pruning: {large_cluster_top_k: -1}\n", "pruning.large_cluster_top_k"),
    ("pruning: {large_cluster: 1e999}\n", "pruning.large_cluster"),
    ("pruning: 3\n", "pruning"),
    ("name: [a]\n", "name"),
]


@pytest.mark.parametrize(("text", "field"), PRESET_CASES)
def test_bad_solver_presets(text: str, field: str, tmp_path: Path, capsys: Any) -> None:
    f = write(tmp_path, "preset.yaml", text)
    line = run_bad([*SOLVE, "--solver-config", str(f)], tmp_path, capsys, str(f), field)
    assert not line.rstrip().endswith(":"), line  # a reason follows the field


RUNS_DOC = yaml.safe_load((ROOT / "bench" / "calibration" / "runs.yaml").read_text())["runs"][0]
RUNS_CASES: list[tuple[str, Any, str]] = [
    ("step_time_s", 1e-300, "step_time_s"),
    ("step_time_s", 5e-324, "step_time_s"),
    ("step_time_s", 1e300, "step_time_s"),
    ("step_time_s", "fast", "step_time_s"),
    ("peak_memory_gib", 1e-320, "peak_memory_gib"),
    ("tp", 2**70, "tp"),
    ("layout", "E(t*999999|)*100000L", "layout"),
]
RUNS_MEASURE_CASES: list[tuple[str, Any]] = [
    ("tokens_per_s_per_device", 1e-300),
    ("tokens_per_s_per_device", 1e-320),
    ("tokens_per_s_per_device", 1e-5),  # in range, but a step of ~1e10 s
    ("tokens_per_s", 1e308),
]


@pytest.mark.parametrize("cmd", ["fidelity", "calibrate"])
@pytest.mark.parametrize(("path", "value", "field"), RUNS_CASES, ids=lambda v: str(v)[:30])
def test_bad_runs_files(path: str, value: Any, field: str, cmd: str, tmp_path: Path, capsys: Any) -> None:
    f = write(tmp_path, "runs.yaml", {"runs": [_set(RUNS_DOC, path, value)]})
    extra = ["--device", "h100", "--out", "cal"] if cmd == "calibrate" else []
    run_bad([cmd, str(f), *extra], tmp_path, capsys, str(f), field)


@pytest.mark.parametrize("cmd", ["fidelity", "calibrate"])
@pytest.mark.parametrize(("measure", "value"), RUNS_MEASURE_CASES, ids=str)
def test_bad_runs_measurements(measure: str, value: float, cmd: str, tmp_path: Path, capsys: Any) -> None:
    run = {k: v for k, v in RUNS_DOC.items() if k != "step_time_s"}
    f = write(tmp_path, "runs.yaml", {"runs": [{**run, measure: value}]})
    extra = ["--device", "h100", "--out", "cal"] if cmd == "calibrate" else []
    run_bad([cmd, str(f), *extra], tmp_path, capsys, str(f), measure)


# ---------------------------------------------------------------------- plan files (table-driven)
PLAN_CASES: list[tuple[str, Any, str]] = [
    ("format", "hapmoe-milp/plan/v1", "format"),
    ("format", "hapmoe-milp/plan/v9", "format"),
    ("format", 2, "format"),
    ("family", "both", "family"),
    ("family", None, "family"),
    ("vpp", 0, "vpp"),
    ("vpp", 1000, "vpp"),
    ("vpp", "2", "vpp"),
    ("vpp", 12, "vpp"),
    ("num_microbatches", 7, "num_microbatches"),
    ("stages", [], "stages"),
    ("stages", {"0": 1}, "stages"),
    ("stages[0]", 5, "stages[0]"),
    ("stages[0].tp", 0, "stages[0].tp"),
    ("stages[0].tp", -2, "stages[0].tp"),
    ("stages[0].tp", 1.5, "stages[0].tp"),
    ("stages[0].tp", "2", "stages[0].tp"),
    ("stages[0].tp", 10**20, "stages[0].tp"),
    ("stages[0].tp", 3, "stages[0]"),
    ("stages[0].dp", 0, "stages[0].dp"),
    ("stages[1].ep", 3, "stages[1].ep"),
    ("stages[0].etp", 0, "stages[0].etp"),
    ("stages[0].cp", 0, "stages[0].cp"),
    ("stages[0].devices", 5, "stages[0].devices"),
    ("stages[0].ranks", [1, 2], "stages[0].ranks"),
    ("stages[0].layers", [0], "stages[0].layers"),
    ("stages[0].layers", [5, 1], "stages[0].layers"),
    ("stages[0].layers", [0, 10**9], "stages[0].layers"),
    ("stages[0].layers", [0, 1025], "stages[0].layers"),
    ("stages[0].layers", ["0", "8"], "stages[0].layers"),
    ("stages[1].layers", [9, 15], "stages[1].layers"),
    ("stages[3].layers", [20, 23], "stages"),
    ("stages[0].recompute", "some", "stages[0].recompute"),
    ("stages[0].device", "v100", "stages[0].device"),
    ("stages[0].device", "h800\n$(reboot)", "stages[0].device"),
    ("stages[0].device", "h800; rm -rf ~", "stages[0].device"),
    ("stages[0].extra", 1, "stages[0].extra"),
    ("settings", [], "settings"),
    ("settings.seq_length", 0, "settings.seq_length"),
    ("settings.seq_length", -1, "settings.seq_length"),
    ("settings.seq_length", "4096", "settings.seq_length"),
    ("settings.global_batch_size", -8, "settings.global_batch_size"),
    ("settings.global_batch_size", 250, "global_batch_size"),
    ("settings.micro_batch_size", 0, "settings.micro_batch_size"),
    ("settings.micro_batch_size", 3, "settings.micro_batch_size"),
    ("settings.precision", "fp4", "settings.precision"),
    ("settings.imbalance", 0.5, "settings.imbalance"),
    ("settings.imbalance", "x", "settings.imbalance"),
    ("settings.dispatcher", "magic", "settings.dispatcher"),
    ("settings.optimizer_offload", "yes", "settings.optimizer_offload"),
    ("settings.memory_headroom", 5, "settings.memory_headroom"),
    ("settings.offload_host_GBps", 0, "settings.offload_host_GBps"),
    ("settings.warp_drive", True, "settings.warp_drive"),
    ("predicted", [1, 2], "predicted"),
    ("predicted", "fast", "predicted"),
    ("solver", 3, "solver"),
    ("model", 5, "model"),
    ("model", "mix tral", "model"),
    ("model.name", "mixtral-l", "model"),
    ("model.name", "x\ny", "model.name"),
    ("model.sha256", "0000000000000000", "model.sha256"),
    ("model.spec.num_layers", 0, "model.spec"),
    ("model.spec", [], "model.spec"),
    ("model.extra", 1, "model.extra"),
    ("cluster.name", "16-2", "cluster"),
    ("cluster.name", "$(id)", "cluster.name"),
    ("cluster.sha256", "0000000000000000", "cluster.sha256"),
    ("cluster.spec.groups[0].nodes", 0, "cluster.spec"),
    ("cluster.spec.groups[0].device", "nope", "cluster.spec"),
    ("cluster.devices", [1], "cluster.devices"),
    ("unknown_key", 1, "unknown_key"),
]
PLAN_COMMANDS = [
    lambda f: ["estimate", "--plan", str(f)],
    lambda f: ["validate", str(f)],
    lambda f: ["export", str(f), "--target", "megatron", "--out", "launch"],
]


@pytest.mark.parametrize("cmd", range(len(PLAN_COMMANDS)), ids=["estimate", "validate", "export"])
@pytest.mark.parametrize(("path", "value", "field"), PLAN_CASES, ids=_case_id)
def test_bad_plan_files(path: str, value: Any, field: str, cmd: int, tmp_path: Path, capsys: Any) -> None:
    f = write(tmp_path, "plan.json", _set(GOOD_PLAN_DOC, path, value))
    run_bad(PLAN_COMMANDS[cmd](f), tmp_path, capsys, str(f), field)


RAW_PLAN_CASES: list[tuple[str, str]] = [
    ("", "JSON"),
    ("[]", "mapping"),
    ('{"format": "hapmoe-milp/plan/v2", "format": "x"}', "duplicate key"),
    (json.dumps(GOOD_PLAN_DOC).replace('"imbalance": 1.0', '"imbalance": NaN'), "NaN"),
    (json.dumps(GOOD_PLAN_DOC)[:-40], "not valid JSON"),
]


@pytest.mark.parametrize(("text", "words"), RAW_PLAN_CASES, ids=lambda v: str(v)[:20])
def test_bad_raw_plan_files(text: str, words: str, tmp_path: Path, capsys: Any) -> None:
    f = write(tmp_path, "plan.json", text)
    run_bad(["estimate", "--plan", str(f)], tmp_path, capsys, str(f), words)


def test_plan_flags_that_disagree(tmp_path: Path, capsys: Any) -> None:
    f = write(tmp_path, "plan.json", GOOD_PLAN_DOC)
    run_bad(["estimate", "--plan", str(f), "-m", "mixtral-l"], tmp_path, capsys, "--model", "mixtral-s")
    run_bad(["estimate", "--plan", str(f), "-c", "16-2"], tmp_path, capsys, "--cluster", "8xh800+8xa100")
    run_bad(["estimate", "--plan", str(f), "--tp", "2"], tmp_path, capsys, "--tp", "--plan")
    run_bad(["estimate", "--plan", str(f), "--gbs", "0"], tmp_path, capsys, "--gbs")
    run_bad(["export", str(f), "--target", "megatron", "--out", str(f)], tmp_path, capsys, "--out")


def test_failed_export_leaves_the_previous_one_intact(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "launch"
    f = write(tmp_path, "plan.json", GOOD_PLAN_DOC)
    assert cli.run(["export", str(f), "--target", "megatron", "--out", str(out)]) == 0
    capsys.readouterr()
    bad = write(tmp_path, "bad.json", _set(GOOD_PLAN_DOC, "stages[0].tp", 3))
    run_bad(["export", str(bad), "--target", "megatron", "--out", str(out)], tmp_path, capsys, "stages[0]")
    other = write(tmp_path, "other.json", _set(GOOD_PLAN_DOC, "settings.optimizer_offload", True))
    import errno

    from hapmoe_milp import fileio

    real = fileio._write_temp
    calls = []

    def disk_full(*a: Any, **k: Any) -> Path:
        calls.append(a)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fileio, "_write_temp", disk_full)
        run_bad(["export", str(other), "--target", "megatron", "--out", str(out)], tmp_path, capsys, "--out", "space")
    assert len(calls) == 3 and "optimizer-cpu-offload" not in (out / "megatron_args.txt").read_text()


# ---------------------------------------------------------------------- property-based
BAD_INTS = st.one_of(
    st.integers(max_value=0),
    st.integers(min_value=10**13),
    st.text(min_size=1, max_size=6),
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not (math.isfinite(x) and x.is_integer())),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), min_size=1, max_size=2),
)
MODEL_INT_FIELDS = ["num_layers", "hidden_size", "num_attention_heads", "vocab_size", "moe_router_topk"]
BAD_NAMES = st.text(min_size=1, max_size=20).filter(lambda s: re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", s) is None)
H = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@H
@given(field=st.sampled_from(MODEL_INT_FIELDS), value=BAD_INTS)
def test_property_model_int_fields(field: str, value: Any, capsys: Any) -> None:
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        f = write(d, "model.yaml", _set(MODEL_DOC, field, value))
        run_bad(["models", str(f)], d, capsys, str(f))


@H
@given(name=BAD_NAMES, which=st.sampled_from(["model", "cluster"]))
def test_property_unsafe_names_are_refused(name: str, which: str, capsys: Any) -> None:
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        if which == "model":
            f = write(d, "m.yaml", _set(MODEL_DOC, "name", name))
            run_bad(["models", str(f)], d, capsys, str(f), "name")
        else:
            f = write(d, "c.yaml", _set(CLUSTER_DOC, "name", name))
            run_bad(["clusters", str(f)], d, capsys, str(f), "name")


@H
@given(nodes=st.one_of(st.integers(max_value=0), st.integers(min_value=65_537), st.text(max_size=3)))
def test_property_cluster_nodes(nodes: Any, capsys: Any) -> None:
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        f = write(d, "c.yaml", _set(CLUSTER_DOC, "groups[1].nodes", nodes))
        run_bad(["clusters", str(f)], d, capsys, str(f), "groups")


PLAN_INT_PATHS = [f"stages[{i}].{k}" for i in range(4) for k in ("tp", "cp", "dp", "ep", "etp")] + [
    "settings.seq_length",
    "settings.global_batch_size",
    "settings.micro_batch_size",
    "vpp",
]


@H
@given(path=st.sampled_from(PLAN_INT_PATHS), value=BAD_INTS)
def test_property_plan_int_fields(path: str, value: Any, capsys: Any) -> None:
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        f = write(d, "plan.json", _set(GOOD_PLAN_DOC, path, value))
        run_bad(["estimate", "--plan", str(f)], d, capsys, str(f))


@H
@given(
    path=st.sampled_from(["settings.imbalance", "settings.memory_headroom", "settings.offload_host_GBps"]),
    value=st.one_of(
        st.floats(max_value=-1e-9, allow_infinity=False),
        st.floats(min_value=1e7, allow_infinity=False),
        st.text(max_size=4),
        st.just([]),
    ),
)
def test_property_plan_float_fields(path: str, value: Any, capsys: Any) -> None:
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        f = write(d, "plan.json", _set(GOOD_PLAN_DOC, path, value))
        run_bad(["validate", str(f)], d, capsys, str(f), path)


@H
@given(
    key=st.text(min_size=1, max_size=12).filter(lambda k: k not in GOOD_PLAN_DOC),
    where=st.sampled_from(["", "settings", "stages[0]"]),
)
def test_property_plan_unknown_keys(key: str, where: str, capsys: Any) -> None:
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        doc = copy.deepcopy(GOOD_PLAN_DOC)
        node = doc if not where else (doc["settings"] if where == "settings" else doc["stages"][0])
        if key in node:
            return
        node[key] = 1
        f = write(d, "plan.json", doc)
        run_bad(["estimate", "--plan", str(f)], d, capsys, str(f))


@H
@given(
    flag=st.sampled_from(["--tp", "--pp", "--cp", "--ep", "--etp", "--vpp", "--mbs", "--gbs", "--seq"]),
    value=st.integers(max_value=0),
)
def test_property_nonpositive_int_flags(flag: str, value: int, capsys: Any) -> None:
    with tempfile.TemporaryDirectory() as td:
        run_bad([*EST[:5], flag, str(value)], Path(td), capsys, flag)


@H
@given(value=st.one_of(st.floats(max_value=0.0), st.just(float("nan")), st.just(float("inf"))))
def test_property_time_limit(value: float, capsys: Any) -> None:
    with tempfile.TemporaryDirectory() as td:
        run_bad([*SOLVE, "--time-limit", repr(value)], Path(td), capsys, "--time-limit")


@H
@given(text=st.from_regex(r"[0-9]{0,12}[xX*][A-Za-z0-9$;| ]{1,8}(\+[0-9]{1,12}x[a-z0-9]{1,6}){0,2}", fullmatch=True))
def test_property_inline_clusters(text: str, capsys: Any) -> None:
    """Inline cluster strings that name no real layout: unknown devices, counts that are not whole nodes,
    zero or astronomical counts. (Valid ones are skipped: they are not bad input.)"""
    try:
        CAT.cluster(text)
        return
    except Exception:
        pass
    with tempfile.TemporaryDirectory() as td:
        run_bad(["clusters", text], Path(td), capsys)


def test_the_suite_has_at_least_300_table_cases() -> None:
    table = len(FLAG_CASES) + len(USAGE_CASES) + len(MODEL_CASES) + len(CLUSTER_CASES) + len(DEVICE_CASES)
    table += len(HF_CASES) + len(RAW_FILE_CASES) + len(PRESET_CASES) + len(PLAN_CASES) * len(PLAN_COMMANDS)
    table += len(RAW_PLAN_CASES) + 2 * (len(RUNS_CASES) + len(RUNS_MEASURE_CASES))
    assert table >= 400, table
