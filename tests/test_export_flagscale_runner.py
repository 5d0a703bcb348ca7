"""FlagScale's runner, re-enacted: what ``python run.py ... action=run`` does with our experiment.yaml and
hostfile before any training code runs.

Re-enacted (in our own code) from FlagOpen/FlagScale da4935ec: ``flagscale/runner/utils.py``
(``parse_hostfile``, ``update_nodes_envs``, ``get_nproc_per_node``, ``get_nnodes``) and
``flagscale/runner/runner_train.py`` (``SSHTrainRunner._prepare``/``run``, ``run_node``, ``_run_each``):
the hostfile is parsed into typed hosts, every host gets the base ``envs`` merged with its type's
``device_type_specific`` entry, ``run_node`` counts the host's processes from the first
``*_VISIBLE_DEVICES`` value (a string; without one its ``num_visible_devices`` is unbound and the launch
crashes), and ``_run_each`` passes the host's type as ``--hetero-current-device-type``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from hapmoe_milp.api import solve
from hapmoe_milp.export import export_plan
from hapmoe_milp.export.common import VISIBLE_DEVICES_ENV
from hapmoe_milp.specs import Catalog
from tests.test_export_flagscale import C16, HETERO, MIXTRAL, flagscale_asserts, flatten_dict_to_args

CAT = Catalog()
HOST_LINE = re.compile(r"^(\S+)\s+slots=(\d+)(?:\s+type=(\S+))?")


class RunnerError(Exception):
    """Where FlagScale's runner would stop (an assertion, an error it logs and raises, or a crash)."""


def parse_hostfile(text: str) -> dict[str, dict[str, Any]]:
    hosts: dict[str, dict[str, Any]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = HOST_LINE.search(line)
        if m is None:
            raise RunnerError(f"Invalid entry in hostfile: {line}")
        if m.group(1) in hosts:
            raise RunnerError(f"Hostfile contains multiple entries for host: {m.group(1)}")
        hosts[m.group(1)] = {"slots": int(m.group(2)), "type": m.group(3)}
    if len({info["type"] is None for info in hosts.values()}) > 1:
        raise RunnerError("All hosts must have a machine type or none")
    if not hosts:
        raise RunnerError("Hostfile is empty")
    return hosts


def host_envs(envs: dict[str, Any], host: str, info: dict[str, Any]) -> dict[str, Any]:
    out = dict(envs)
    by_type, by_node = out.pop("device_type_specific", None), out.pop("node_specific", None)
    if by_type is None and by_node is None:
        return out
    if by_type is not None and info["type"] is not None:
        out.update(by_type.get(info["type"], {}))
    if by_node is not None:
        out.update(by_node.get(host, {}))
    return out


def processes_on(envs: dict[str, Any], slots: int, nproc_arg: int | None = None) -> int:
    visible = next((v for k, v in envs.items() if k.endswith("_VISIBLE_DEVICES")), None)
    if not isinstance(visible, str):
        raise RunnerError("run_node: num_visible_devices is unbound (no *_VISIBLE_DEVICES string in envs)")
    n = len(visible.split(","))
    cap = slots if nproc_arg is None else min(slots, int(nproc_arg))
    return min(cap, n) if n else cap


def launch(conf_dir: Path) -> list[dict[str, Any]]:
    """Every host the runner starts: host, type, envs, process count and the train argv it passes."""
    exp = yaml.safe_load((conf_dir / "experiment.yaml").read_text())
    train = yaml.safe_load((conf_dir / "flagscale.yaml").read_text())
    e = exp["experiment"]
    if e["task"]["type"] != "train":
        raise RunnerError(f"Unsupported task type: {e['task']['type']}")
    if e["task"]["backend"] != "megatron" or not e.get("exp_dir"):
        raise RunnerError("the train runner needs backend megatron and an exp_dir")
    hostfile = Path(e["runner"]["hostfile"])
    if not hostfile.is_file():
        raise RunnerError(f"Hostfile {hostfile} not found")
    hosts = parse_hostfile(hostfile.read_text())
    nnodes = len(hosts) if e["runner"].get("nnodes") is None else min(len(hosts), int(e["runner"]["nnodes"]))
    argv = flatten_dict_to_args(train)
    out = []
    for host, info in list(hosts.items())[:nnodes]:
        envs = host_envs(e.get("envs", {}), host, info)
        n = processes_on(envs, info["slots"], e["runner"].get("nproc_per_node"))
        args = list(argv)
        if "--hetero-current-device-type" in args:
            args[args.index("--hetero-current-device-type") + 1] = info["type"]
        else:
            args += ["--hetero-current-device-type", info["type"]]
        out.append({"host": host, "type": info["type"], "envs": envs, "nproc": n, "argv": args})
    return out


def check_launch(conf_dir: Path, cluster_name: str) -> list[dict[str, Any]]:
    """The launch as FlagScale would do it, plus what must hold for the plan to start as planned."""
    cluster = CAT.cluster(cluster_name)
    train = yaml.safe_load((conf_dir / "flagscale.yaml").read_text())
    hosts = launch(conf_dir)
    h = train["system"]["hetero"]
    world = sum(tp * cp * dp * pp for tp, cp, _ep, dp, pp in zip(*[h["hetero_process_meshes"][i::5] for i in range(5)]))
    assert sum(x["nproc"] for x in hosts) == world, "every rank of the meshes gets a process"
    for x in hosts:
        argv = x["argv"]
        assert argv[argv.index("--hetero-current-device-type") + 1] in h["hetero_device_types"]
        var = VISIBLE_DEVICES_ENV[cluster.device(x["type"]).vendor]
        assert var in x["envs"], f"{x['host']}: {var}"
        assert x["nproc"] <= cluster.node_size(x["type"])
    return hosts


def test_runner_starts_every_rank_with_its_vendors_visible_devices(tmp_path: Path) -> None:
    export_plan(HETERO, MIXTRAL, C16, "flagscale", tmp_path)
    hosts = check_launch(tmp_path, "16-1")
    assert [(x["type"], x["nproc"]) for x in hosts] == [("h800", 8), ("910b", 8)]
    assert hosts[0]["envs"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert hosts[1]["envs"]["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert "CUDA_VISIBLE_DEVICES" not in hosts[1]["envs"]  # the 910B host counts its own devices
    flagscale_asserts(yaml.safe_load((tmp_path / "flagscale.yaml").read_text()), MIXTRAL)


def test_without_a_visible_devices_variable_the_runner_crashes(tmp_path: Path) -> None:
    """What issue 18 saw: an experiment.yaml without one fails in run_node before anything starts."""
    export_plan(HETERO, MIXTRAL, C16, "flagscale", tmp_path)
    exp = yaml.safe_load((tmp_path / "experiment.yaml").read_text())
    exp["experiment"]["envs"].pop("device_type_specific")
    (tmp_path / "experiment.yaml").write_text(yaml.safe_dump(exp))
    with pytest.raises(RunnerError, match="num_visible_devices"):
        launch(tmp_path)


@pytest.mark.parametrize(
    ("model", "cluster"), [("mixtral-s", "16-2"), ("mixtral-s", "24-3"), ("deepseek-v2-lite", "16-a100-910b")]
)
def test_solved_cross_vendor_plans_launch(model: str, cluster: str, tmp_path: Path) -> None:
    """Default solves on cross-vendor clusters name FlagScale and launch through its runner as written."""
    sol = solve(model, cluster, time_limit=20, catalog=CAT)
    assert sol.plan is not None and sol.plan.runtime == "flagscale"
    export_plan(sol.plan, CAT.model(model), CAT.cluster(cluster), "flagscale", tmp_path)
    check_launch(tmp_path, cluster)
    flagscale_asserts(yaml.safe_load((tmp_path / "flagscale.yaml").read_text()), CAT.model(model))
