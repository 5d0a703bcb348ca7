"""FlagScale heterogeneous-mesh export (``system.hetero``; reference/megatron.md §5.1, anchors.md §2.6).

FlagScale runs a different (TP, CP, EP, DP) per *process mesh*; a mesh owns a contiguous block of
pipeline stages. We group consecutive plan stages with the same device type and mesh shape into one
mesh (``pp`` = how many), in plan order.

Rank order: FlagScale re-ranks processes by the position of their device type in
``hetero_device_types`` (``RankMapper`` uses ``list.index``, i.e. the first occurrence), then by rank.
So all meshes of one device type must be consecutive, and the hostfile lists hosts type by type in
that order, each host once (FlagScale rejects repeated hosts).

MTP: ``hetero_pipeline_layer_split`` counts decoder layers only (its sum must equal ``num_layers``);
FlagScale builds MTP layers on the last pipeline stage as Megatron does without a layout, so every MTP
layer of the plan must be in its last stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from hapmoe_milp.config import ParallelConfig, Settings, parse_recompute
from hapmoe_milp.errors import ExportError
from hapmoe_milp.export.common import (
    GENERATED_MARK,
    VISIBLE_DEVICES_ENV,
    host_name,
    nearest_expressible_recompute,
    rank_slots,
    recompute_expressible,
    selective_modules,
    stage_layers,
    uses_shared_embedding,
)
from hapmoe_milp.export.megatron import (
    OFFLOAD_FRACTION,
    comment,
    model_args,
    null_tokenizer_vocab_arg,
    parse_megatron_args,
)
from hapmoe_milp.plan import Plan
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

CONFIG_FILE = "flagscale.yaml"
EXPERIMENT_FILE = "experiment.yaml"
SAVE_INTERVAL = 1000  # iterations between checkpoints; FlagScale's runner always sets --save


@dataclass(frozen=True)
class Mesh:
    device: str
    cfg: ParallelConfig
    pp: int
    first_stage: int

    @property
    def devices(self) -> int:
        return self.cfg.devices * self.pp

    def five(self) -> list[int]:
        """FlagScale's 5 ints per mesh: tp, cp, ep, dp, pp (EP is folded into the mesh, not multiplied)."""
        return [self.cfg.tp, self.cfg.cp, self.cfg.ep, self.cfg.dp, self.pp]


def process_meshes(plan: Plan) -> list[Mesh]:
    out: list[Mesh] = []
    for i, s in enumerate(plan.stages):
        if out and out[-1].device == s.device and out[-1].cfg == s.cfg:
            last = out[-1]
            out[-1] = Mesh(last.device, last.cfg, last.pp + 1, last.first_stage)
        else:
            out.append(Mesh(s.device, s.cfg, 1, i))
    return out


def device_type_order(meshes: list[Mesh]) -> list[str]:
    order: list[str] = []
    for m in meshes:
        if m.device not in order:
            order.append(m.device)
    return order


def types_grouped(meshes: list[Mesh]) -> bool:
    """Meshes of one device type are consecutive (what FlagScale's RankMapper assumes)."""
    seen: list[str] = []
    for m in meshes:
        if seen and seen[-1] == m.device:
            continue
        if m.device in seen:
            return False
        seen.append(m.device)
    return True


def recompute_config(plan: Plan, model: ModelSpec) -> dict[str, Any]:
    """Global recompute keys, plus FlagScale's per-stage switch when full and none are mixed.

    ``recompute_granularity_per_stage_micro_batch`` lists ``[n_stages, n_microbatches, flag]`` per run of
    stages (flag 1 = recompute every layer, 0 = none); FlagScale requires global granularity ``full`` and a
    method for it (flagscale/train/arguments.py post_validate_args)."""
    levels = tuple(s.recompute for s in plan.stages)
    if not recompute_expressible(levels, "flagscale"):
        _, note = nearest_expressible_recompute(plan, "flagscale")
        raise ExportError(f"[rule_fs_recompute_expressible] {note}", field="stages.recompute")
    kinds = set(levels)
    if kinds == {"none"}:
        return {}
    if len(kinds) == 1 and parse_recompute(levels[0]).granularity == "selective":
        return {"recompute_granularity": "selective", "recompute_modules": list(selective_modules(model, levels[0]))}
    out: dict[str, Any] = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    if kinds == {"none", "full"}:
        runs: list[list[int]] = []
        for lv in levels:
            flag = 1 if lv == "full" else 0
            if runs and runs[-1][2] == flag:
                runs[-1][0] += 1
            else:
                runs.append([1, plan.num_microbatches, flag])
        out["recompute_granularity_per_stage_micro_batch"] = runs
    return out


def flagscale_config(
    plan: Plan, model: ModelSpec, cluster: ClusterSpec, settings: Settings | None = None
) -> dict[str, Any]:
    """The FlagScale train config (``conf/train/<name>.yaml``): ``system``, ``model``, ``data``.

    Raises ExportError for what FlagScale's format cannot say at all (MTP off the last stage, device types
    interleaved across meshes, inexpressible per-stage recompute); ``validate.check`` runs the other rules.
    """
    st = plan.settings(settings)
    meshes = process_meshes(plan)
    if not types_grouped(meshes):
        raise ExportError(
            "[rule_fs_device_types_grouped] FlagScale orders ranks by device type, so all meshes of one type must "
            f"be consecutive; mesh types are {[m.device for m in meshes]}",
            field="stages",
        )
    layers = stage_layers(plan, model)
    if any(sl.mtp for sl in layers[:-1]):
        raise ExportError(
            "[rule_fs_mtp_on_last_stage] FlagScale builds MTP layers on the last pipeline stage; move them there",
            field="stages",
        )
    first, last = meshes[0], meshes[-1]
    hetero: dict[str, Any] = {
        "enable_hetero": True,
        "hetero_process_meshes": [x for m in meshes for x in m.five()],
        "hetero_pipeline_layer_split": [sl.decoder for sl in layers],
        "hetero_device_types": [m.device for m in meshes],
        "hetero_current_device_type": first.device,
        "standalone_embedding_stage": False,
    }
    if model.is_moe:
        hetero["expert_tensor_parallel_size_per_process_mesh"] = [m.cfg.etp for m in meshes]
    if uses_shared_embedding(model) and first.cfg.dp != last.cfg.dp and st.distributed_optimizer:
        hetero["use_partial_reduce_for_shared_embedding"] = True
    system: dict[str, Any] = {
        "tensor_model_parallel_size": first.cfg.tp,
        "pipeline_model_parallel_size": plan.pp,
        "context_parallel_size": first.cfg.cp,
    }
    if model.is_moe:
        system["expert_model_parallel_size"] = first.cfg.ep
        system["expert_tensor_parallel_size"] = first.cfg.etp
    system["sequence_parallel"] = any(m.cfg.tp > 1 for m in meshes)  # FlagScale turns it off per TP=1 mesh
    system["use_distributed_optimizer"] = st.distributed_optimizer
    if st.optimizer_offload:  # FlagScale passes these keys to its Megatron as the same flags
        system["optimizer_cpu_offload"] = True
        system["use_precision_aware_optimizer"] = True
        system["optimizer_offload_fraction"] = float(OFFLOAD_FRACTION)
    system["overlap_grad_reduce"] = st.overlap_grad_reduce
    system["overlap_param_gather"] = st.overlap_param_gather and st.distributed_optimizer and st.overlap_grad_reduce
    precision: dict[str, Any] = {"bf16": True}
    if plan.precision == "fp8":
        precision.update({"fp8_format": "hybrid", "fp8_recipe": st.fp8_recipe})
    system["precision"] = precision
    rec = recompute_config(plan, model)
    if rec:
        system["recompute"] = rec
    # FlagScale's runner always passes --save (checkpoint.save defaults to <exp_dir>/checkpoints), and
    # Megatron's validate_args then asserts save_interval is set and positive.
    checkpoint: dict[str, Any] = {"save_interval": SAVE_INTERVAL}
    if len({m.cfg.tp for m in meshes}) > 1:
        checkpoint["ckpt_format"] = "torch"  # dist_ckpt breaks when TP differs (FlagScale #319)
    system["checkpoint"] = checkpoint
    vendors = {cluster.device(m.device).vendor for m in meshes}
    if len(vendors) > 1:
        system["distributed_backend"] = "flagcx"  # NCCL/HCCL/RCCL do not talk to each other
    system["hetero"] = hetero

    model_cfg: dict[str, Any] = dict(parse_megatron_args(model_args(model)))
    model_cfg.update(
        {
            "seq_length": plan.seq_length,
            "max_position_embeddings": plan.seq_length,
            "micro_batch_size": plan.micro_batch_size,
            "global_batch_size": plan.global_batch_size,
        }
    )
    if model.is_moe:
        model_cfg["moe_token_dispatcher_type"] = plan.dispatcher
        model_cfg["moe_grouped_gemm"] = True
    # FlagScale pins a Megatron-LM of about core 0.15, whose NullTokenizer adds one EOD token
    vocab = null_tokenizer_vocab_arg(model.vocab_size, adds_eod=True)
    data = {"mock_data": True, "tokenizer": {"tokenizer_type": "NullTokenizer", "vocab_size": vocab}}
    return {"system": system, "model": model_cfg, "data": data}


def experiment_config(plan: Plan, cluster: ClusterSpec, hostfile_path: str = "hostfile") -> dict[str, Any]:
    """FlagScale's experiment config: what to run (task), how (runner with our hostfile), with which
    environment (``envs``), and the train config it composes (``defaults: [_self_, flagscale@train]``).

    ``envs.device_type_specific`` gives every host type its vendor's visible-devices variable
    (``CUDA_VISIBLE_DEVICES``, ``ASCEND_RT_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES``) listing the node's
    devices, as every FlagScale example sets one: the runner's ``run_node`` (runner_train.py) counts the
    processes per host from the first ``*_VISIBLE_DEVICES`` value among the host's envs and fails without
    one; ``update_nodes_envs`` merges the entry of the host's ``type=`` (our hostfile's device id) into the
    envs. A host then starts ``min(slots, visible devices)`` = ``slots`` processes.

    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` goes under ``envs`` whenever a mesh has TP > 1 or CP > 1: Megatron's
    ``validate_args`` asserts it on those ranks (pre-Blackwell GPUs), and the runner exports ``envs`` on
    every host it starts."""
    envs: dict[str, Any] = {}
    if any(s.cfg.tp > 1 or s.cfg.cp > 1 for s in plan.stages):
        envs["CUDA_DEVICE_MAX_CONNECTIONS"] = 1
    per_type: dict[str, dict[str, str]] = {}
    for dev in device_type_order(process_meshes(plan)):
        var = VISIBLE_DEVICES_ENV.get(cluster.device(dev).vendor, "CUDA_VISIBLE_DEVICES")
        per_type[dev] = {var: ",".join(str(i) for i in range(cluster.node_size(dev)))}
    envs["device_type_specific"] = per_type
    name = f"{plan.model}-{plan.cluster}"
    return {
        "defaults": ["_self_", f"{CONFIG_FILE.removesuffix('.yaml')}@train"],
        "experiment": {
            "exp_name": name,
            "exp_dir": f"./outputs/{name}",
            "task": {"type": "train", "backend": "megatron", "entrypoint": "flagscale/train/train_gpt.py"},
            "runner": {"backend": "torchrun", "hostfile": hostfile_path, "rdzv_backend": "static"},
            "envs": envs,
        },
        "action": "run",
        "hydra": {"run": {"dir": "${experiment.exp_dir}/hydra"}},
    }


def experiment_yaml(plan: Plan, cluster: ClusterSpec, hostfile_path: str = "hostfile") -> str:
    header = (
        comment(f"{GENERATED_MARK}: FlagScale experiment config for {plan.model} on {plan.cluster}.")
        + f"\n# It composes {CONFIG_FILE} (same folder) as the train config; run from a FlagScale checkout with\n"
        "#   python run.py --config-path <this folder> --config-name experiment action=run\n"
    )
    return header + yaml.dump(
        experiment_config(plan, cluster, hostfile_path),
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        width=120,
    )


class _Dumper(yaml.SafeDumper):
    """Block-style mappings with flow-style lists, the way FlagScale's own configs read."""


_Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def flagscale_yaml(plan: Plan, model: ModelSpec, cluster: ClusterSpec, settings: Settings | None = None) -> str:
    cfg = flagscale_config(plan, model, cluster, settings)
    header = (
        comment(f"{GENERATED_MARK}: FlagScale train config for {plan.model} on {plan.cluster}.")
        + "\n# experiment.yaml composes it as the train config (defaults: [_self_, flagscale@train]);\n"
        "# micro_batch_size is the first mesh's; mesh i runs dp0*mbs/dp_i (FlagScale rescales it).\n"
    )
    return header + yaml.dump(cfg, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


def flagscale_hostfile(plan: Plan, cluster: ClusterSpec) -> str:
    """``HOST slots=N type=DEVICE``, hosts grouped by device type in mesh order, each host once."""
    order = device_type_order(process_meshes(plan))
    counts: dict[tuple[str, int], int] = {}
    for s in rank_slots(plan, cluster):
        counts[(s.device, s.node)] = counts.get((s.device, s.node), 0) + 1
    lines = [f"# {GENERATED_MARK}: FlagScale hostfile (replace the placeholder host names)"]  # no plan data
    for dev in order:
        for (d, node), n in sorted(counts.items(), key=lambda kv: kv[0][1]):
            if d == dev:
                lines.append(f"{host_name(d, node)} slots={n} type={d}")
    return "\n".join(lines) + "\n"


def readme(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> str:
    meshes = process_meshes(plan)
    layers = stage_layers(plan, model)
    lines = [
        f"{GENERATED_MARK}: FlagScale heterogeneous launch for {plan.model} on {plan.cluster}",
        "",
        "Process meshes (tp, cp, ep, dp, pp), in pipeline order:",
    ]
    for i, m in enumerate(meshes):
        split = [sl.decoder for sl in layers[m.first_stage : m.first_stage + m.pp]]
        lines.append(
            f"  mesh {i}: {m.device:>8}  {m.five()}  etp {m.cfg.etp}  decoder layers per stage {split}  "
            f"micro-batch {plan.stage_micro_batch(m.first_stage)}"
        )
    if model.mtp_num_layers:
        lines.append(f"  + {model.mtp_num_layers} MTP layer(s) on the last stage (FlagScale places them there)")
    lines += [
        "",
        "Files:",
        f"  {CONFIG_FILE}       FlagScale train config (system/model/data)",
        f"  {EXPERIMENT_FILE}      FlagScale experiment config: task, runner (this hostfile), envs; it composes",
        f"                       {CONFIG_FILE} as the train config",
        "  hostfile             'host slots=N type=DEVICE', hosts grouped by device type in mesh order",
        "  plan.json            the plan with its predicted cost",
        "",
        "Launch from a FlagScale checkout with its runner:",
        "  python run.py --config-path <this folder> --config-name experiment action=run",
        "The runner reads the hostfile path relative to where it runs; give an absolute path in experiment.yaml",
        f"if you run it elsewhere. Checkpoints are saved every {SAVE_INTERVAL} iterations (system.checkpoint.",
        "save_interval; FlagScale always passes --save, and Megatron then requires an interval).",
        "The data section uses synthetic data with a NullTokenizer of exactly "
        f"{model.vocab_size} tokens; replace it with your data_path and tokenizer.",
    ]
    vendors = sorted({cluster.device(m.device).vendor for m in meshes})
    if len(vendors) > 1:
        lines += [
            "",
            f"Vendors {', '.join(vendors)}: the config selects distributed_backend flagcx (FlagCX must be installed);",
            "hetero_use_cpu_communication: true is the slower gloo fallback.",
        ]
    return "\n".join(lines) + "\n"
