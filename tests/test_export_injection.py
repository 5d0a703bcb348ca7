"""Launch files cannot be used to run someone else's command.

Names reach generated files (model, cluster, device ids become comments, host names and YAML values).
The loaders refuse unsafe names (``tests/test_cli_bad_input.py``); here a plan built in Python with hostile
names must be refused by the exporter before anything is written, the allowed characters must survive a
real ``bash`` run of the exported scripts as inert data, and YAML must come out of the YAML emitter: what
``yaml.safe_load`` reads back is exactly the config we built.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from hapmoe_milp.config import ParallelConfig, Settings
from hapmoe_milp.errors import ExportError
from hapmoe_milp.export import export_plan, flagscale_config
from hapmoe_milp.export.megatron import comment
from hapmoe_milp.plan import Plan, Stage
from hapmoe_milp.specs import Catalog, ClusterSpec, NodeGroup

CAT = Catalog()
MIX = CAT.model("mixtral-s")
H800, A100 = CAT.device("h800"), CAT.device("a100")  # NVIDIA both: Megatron-LM runs it
G4 = ParallelConfig(tp=2, dp=2, ep=4)
HOSTILE = [
    "x\ntouch PWNED",
    "x; touch PWNED",
    "$(touch PWNED)",
    "`touch PWNED`",
    "x' && touch PWNED && '",
    'x" && touch PWNED && "',
    "x\r\ntouch PWNED",
    "a: {b: c}",
    "- item",
    "x\u2028touch PWNED",
    "../../etc/passwd",
    "",
]


def cluster(h800_id: str = "h800", name: str = "c16") -> ClusterSpec:
    return ClusterSpec(name=name, groups=(NodeGroup(replace(H800, id=h800_id), 1, 8), NodeGroup(A100, 1, 8)))


def plan_on(c: ClusterSpec, model_name: str = "mixtral-s", family: str = "megatron") -> tuple[Plan, object]:
    m = replace(MIX, name=model_name)
    h = c.groups[0].device.id
    stages = (Stage(h, G4, 0, 8), Stage(h, G4, 8, 15), Stage("a100", G4, 15, 20), Stage("a100", G4, 20, 24))
    st = Settings(seq_length=4096, global_batch_size=256, micro_batch_size=1)
    return Plan.from_settings(m, c, family, stages, st), m  # type: ignore[arg-type]


@pytest.mark.parametrize("target", ["megatron", "flagscale"])
@pytest.mark.parametrize("bad", HOSTILE, ids=range(len(HOSTILE)))
@pytest.mark.parametrize("where", ["model", "cluster", "device"])
def test_hostile_names_are_refused_before_writing(tmp_path: Path, where: str, bad: str, target: str) -> None:
    if where == "device":
        c = cluster(h800_id=bad)
        p, m = plan_on(c)
    elif where == "cluster":
        c = cluster(name=bad)
        p, m = plan_on(c)
    else:
        c = cluster()
        p, m = plan_on(c, model_name=bad)
    out = tmp_path / "out"
    with pytest.raises(ExportError, match="not a safe name"):
        export_plan(p, m, c, target, out)  # type: ignore[arg-type]
    assert not out.exists()
    assert not list(tmp_path.rglob("PWNED"))


def test_comment_lines_stay_one_line() -> None:
    for bad in HOSTILE:
        c = comment(f"plan {bad}")
        assert c.startswith("# ") and "\n" not in c and "\r" not in c and "\u2028" not in c


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_exported_scripts_run_names_as_data(tmp_path: Path) -> None:
    """Every character a safe name may hold, in every name, through a real bash run with a fake torchrun:
    the script starts exactly one torchrun with our arguments and creates no other file."""
    c = cluster(h800_id="h.8+0_0-x", name="c.1+6_x-y")
    p, m = plan_on(c, model_name="m.x+7_b-1")
    out = tmp_path / "launch"
    export_plan(p, m, c, "megatron", out)  # type: ignore[arg-type]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "torchrun").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" >> "$OUT"\n')
    (bindir / "torchrun").chmod(0o755)
    before = {q.name for q in tmp_path.rglob("*")}
    for script in sorted(out.glob("launch_node*.sh")):
        env = {
            "PATH": f"{bindir}:{os.environ['PATH']}",
            "MASTER_ADDR": "10.0.0.1",
            "MEGATRON_LM": str(tmp_path / "megatron"),
            "OUT": str(tmp_path / "argv.txt"),
            "PYTHON": sys.executable,
        }
        subprocess.run(["bash", str(script)], check=True, env=env, cwd=tmp_path, timeout=60)
    after = {q.name for q in tmp_path.rglob("*")}
    assert after - before == {"argv.txt"}
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert argv.count(str(tmp_path / "megatron" / "pretrain_gpt.py")) == len(list(out.glob("launch_node*.sh")))
    hosts = [ln.split()[0] for ln in (out / "hostfile").read_text().splitlines() if not ln.startswith("#")]
    assert all(h.startswith(("h.8+0_0-x-node", "a100-node")) for h in hosts)


@pytest.mark.parametrize("name", ["m.x+7_b-1", "yes", "null", "1e3", "0x10", "true", "NaN", "2048"])
def test_flagscale_yaml_reads_back_exactly(tmp_path: Path, name: str) -> None:
    """Names YAML would read as booleans, numbers or null stay strings: the emitter quotes them."""
    c = cluster(name=name)
    p, m = plan_on(c, model_name=name, family="hetero")
    export_plan(p, m, c, "flagscale", tmp_path)  # type: ignore[arg-type]
    assert yaml.safe_load((tmp_path / "flagscale.yaml").read_text()) == flagscale_config(p, m, c)  # type: ignore[arg-type]
    exp = yaml.safe_load((tmp_path / "experiment.yaml").read_text())
    assert exp["experiment"]["exp_name"] == f"{name}-{name}"
