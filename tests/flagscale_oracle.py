"""FlagScale, re-enacted for the tests: the pieces of FlagOpen/FlagScale da4935ec that consume our export,
written in our own code from reading them (FlagScale itself is not installable here; it patches a pinned
Megatron-LM):

* ``flagscale/runner/utils.py::flatten_dict_to_args`` (YAML -> CLI);
* ``flagscale/train/arguments.py::pre_validate_args`` / ``post_validate_args`` (the asserts);
* ``flagscale/train/hetero/parallel_context.py::RankMapper`` (rank order);
* the patched ``get_transformer_layer_offset`` (``backends/Megatron-LM/.../transformer_layer.py.patch``):
  which layer ids each stage builds;
* the runner (``flagscale/runner/utils.py``: ``parse_hostfile``, ``update_nodes_envs``,
  ``get_nproc_per_node``; ``flagscale/runner/runner_train.py``: ``SSHTrainRunner._prepare``/``run``,
  ``run_node``, ``_run_each``): the hostfile is parsed into typed hosts, every host gets the base ``envs``
  merged with its type's ``device_type_specific`` entry, ``run_node`` counts the host's processes from the
  first ``*_VISIBLE_DEVICES`` value (a string; without one its ``num_visible_devices`` is unbound and the
  launch crashes), and ``_run_each`` passes the host's type as ``--hetero-current-device-type``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from hapmoe_milp.export.common import VISIBLE_DEVICES_ENV
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs.model import ModelSpec

CAT = Catalog()


def flatten_dict_to_args(config: dict[str, Any]) -> list[str]:
    """flagscale/runner/utils.py::flatten_dict_to_args (keys '_' -> '-', lists spread, True -> bare flag)."""
    args: list[str] = []
    for key, value in config.items():
        key = key.replace("_", "-")
        if isinstance(value, dict):
            args.extend(flatten_dict_to_args(value))
        elif isinstance(value, list):
            args.append(f"--{key}")
            args.extend(f"{v}" for v in value)
        elif isinstance(value, bool):
            if value:
                args.append(f"--{key}")
        else:
            args += [f"--{key}", f"{value}"]
    return args


def flagscale_asserts(cfg: dict[str, Any], model: ModelSpec) -> list[int]:
    """pre_validate_args / post_validate_args asserts; returns the per-mesh micro-batch sizes."""
    sysc, hetero, mc = cfg["system"], cfg["system"]["hetero"], cfg["model"]
    flat = hetero["hetero_process_meshes"]
    assert len(flat) % 5 == 0
    tps, cps, eps, dps, pps = flat[0::5], flat[1::5], flat[2::5], flat[3::5], flat[4::5]
    etps = hetero["expert_tensor_parallel_size_per_process_mesh"]
    assert len(etps) == len(tps)
    mbs = mc["micro_batch_size"]
    assert all(dps[0] * mbs % d == 0 for d in dps)
    assert all(c == cps[0] for c in cps)
    assert all(e == 1 for e in eps) or all(e != 1 for e in eps)  # what FlagScale *should* check (#717)
    assert sysc["pipeline_model_parallel_size"] == sum(pps)
    assert hetero["standalone_embedding_stage"] is False
    if not model.untie_embeddings_and_output_weights or model.mtp_num_layers:
        assert tps[0] == tps[-1]
        if dps[0] != dps[-1] and sysc["use_distributed_optimizer"]:
            assert dps[0] % dps[-1] == 0 or dps[-1] % dps[0] == 0
            assert hetero["use_partial_reduce_for_shared_embedding"] is True
    split = hetero["hetero_pipeline_layer_split"]
    assert sum(split) == mc["num_layers"] and len(split) == sysc["pipeline_model_parallel_size"]
    assert len(hetero["hetero_device_types"]) == len(tps)
    assert hetero["hetero_current_device_type"] in hetero["hetero_device_types"]
    assert cps[0] == 1  # ParallelContext: "Context parallelism is not supported."
    for tp, cp, ep, dp, pp, etp in zip(tps, cps, eps, dps, pps, etps):
        assert (tp * cp * dp * pp) % (etp * ep * pp) == 0
    return [dps[0] * mbs // d for d in dps]


def built_layer_ids(cfg: dict[str, Any]) -> list[int]:
    """Layer numbers each rank builds, in pipeline order, as FlagScale's patched Megatron computes them: a
    stage's offset is the layer split's prefix sum when its mesh's PP > 1 (pre_validate_args sets the
    rank's pipeline size to its mesh's pp), else 0; it then builds split[stage] layers from there."""
    h = cfg["system"]["hetero"]
    flat, split = h["hetero_process_meshes"], h["hetero_pipeline_layer_split"]
    out: list[int] = []
    stage = 0
    for pp in flat[4::5]:
        for _ in range(pp):
            offset = sum(split[:stage]) if pp > 1 else 0
            out += range(offset, offset + split[stage])
            stage += 1
    return out


def rank_mapper(hostfile_text: str, device_types: list[str]) -> list[str]:
    """Device type of each logical rank: physical ranks follow the hostfile, then RankMapper sorts them by
    the first index of their type in hetero_device_types, then by rank."""
    physical: list[str] = []
    hosts: set[str] = set()
    for line in hostfile_text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        host, slots, typ = line.split()
        assert host not in hosts, "FlagScale rejects a host listed twice"
        hosts.add(host)
        physical += [typ.removeprefix("type=")] * int(slots.removeprefix("slots="))
    order = sorted(range(len(physical)), key=lambda r: (device_types.index(physical[r]), r))
    return [physical[r] for r in order]


# ---------------------------------------------------------------------- the runner
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
