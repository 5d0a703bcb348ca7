"""The README's commands, run as written and in order, in an empty folder.

Every line of a ``bash`` block that starts with ``hapmoe-milp`` runs through the CLI entry point (in this
process, so the suite stays fast); the set-up block's ``pip``/``pytest`` lines are the only others and are
not run here (CI runs them). The ``python`` block runs as a script. A command that needs an optional extra
(torch for ``profile``) makes the rest of the run skip rather than fail when the extra is missing.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from hapmoe_milp import cli

README = Path(__file__).resolve().parents[1] / "README.md"
NOT_RUN = ("pip install", "python -m pytest")


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def commands() -> list[str]:
    out = []
    for block in blocks("bash"):
        for line in block.splitlines():
            cmd = re.split(r"\s{2,}#", line)[0].strip()
            if not cmd:
                continue
            if cmd.startswith("hapmoe-milp "):
                out.append(cmd)
            else:
                assert cmd.startswith(NOT_RUN) or " && hapmoe-milp " in cmd, f"README line not covered: {line}"
                if " && hapmoe-milp " in cmd:
                    out.append("hapmoe-milp " + cmd.split(" && hapmoe-milp ", 1)[1])
    return out


def test_readme_lists_the_commands_this_test_runs() -> None:
    cmds = commands()
    assert len(cmds) >= 15
    for sub in ("solve", "estimate", "validate", "export", "compare", "sweep", "profile", "models"):
        assert any(c.split()[1:2] == [sub] or f" {sub} " in c for c in cmds), sub


@pytest.mark.slow
def test_readme_commands_run_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    for cmd in commands():
        argv = shlex.split(cmd)[1:]
        if "profile" in argv:
            pytest.importorskip("torch")
        code = cli.run(argv)
        out, err = capsys.readouterr()
        assert code == 0, f"{cmd}\nexit {code}\n{err[-2000:]}"
        assert "Traceback" not in err
        if "--json" in argv:
            json.loads(out)  # stdout is the answer only
    # what the commands promised to leave behind
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["format"] == "hapmoe-milp/plan/v2" and plan["model"]["name"] == "mixtral-l"
    assert (tmp_path / "launch" / "megatron_args.txt").is_file()
    assert (tmp_path / "launch-fs" / "flagscale.yaml").is_file()
    assert (tmp_path / "launch-fs" / "experiment.yaml").is_file()
    assert (tmp_path / "launch-ms" / "mindspeed_args.txt").is_file()
    for folder, runtime in (("launch-fs", "flagscale"), ("launch", "megatron"), ("launch-ms", "mindspeed")):
        assert json.loads((tmp_path / folder / "plan.json").read_text())["runtime"]["name"] == runtime
    assert sum(1 for _ in (tmp_path / "results.jsonl").open()) == 3
    assert list((tmp_path / "profiled").glob("my-gpu.yaml"))


@pytest.mark.slow
def test_readme_python_api_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (code,) = blocks("python")
    exec(compile(code, "README.md", "exec"), {})
    assert json.loads((tmp_path / "plan-api.json").read_text())["model"]["name"] == "mixtral-s"


def test_setup_command_returns_a_flagscale_runnable_plan(capsys) -> None:
    """The set-up command's answer on 8 H800 + 8 910B is FlagScale's: no VPP, CP 1, its rules met."""
    (setup,) = [c for c in commands() if c.startswith("hapmoe-milp solve --model mixtral-s --cluster 16-1")]
    argv = [*shlex.split(setup)[1:], "--time-limit", "20", "--json"]
    assert cli.run(argv) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["runtime"]["name"] == "flagscale" and plan["vpp"] == 1
    assert {s["cp"] for s in plan["stages"]} == {1}
    from hapmoe_milp.export.validate import validate
    from hapmoe_milp.plan import plan_from_dict

    p = plan_from_dict(plan, "stdout")
    assert validate(p, p.model_spec, p.cluster_spec, "flagscale") == []
