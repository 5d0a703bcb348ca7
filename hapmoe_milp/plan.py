"""Plans: ordered pipeline stages with device type, mesh, recompute and layer range.

Micro-batch semantics follow FlagScale's heterogeneous meshes, which reduce to Megatron's when every
stage has the same DP: one pipeline micro-batch step carries ``mbs * dp_0`` samples; stage ``i`` splits
them over its ``dp_i`` replicas (``b_i = mbs * dp_0 / dp_i`` samples each), and there are
``M = GBS / (mbs * dp_0)`` micro-batches per iteration.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hapmoe_milp.config import RECOMPUTE_LEVELS, Family, ParallelConfig, Recompute, Settings
from hapmoe_milp.errors import PlanError, SpecError
from hapmoe_milp.specs._fields import Fields, load_document
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

PLAN_FORMAT = "hapmoe-milp/plan/v1"


@dataclass(frozen=True)
class Stage:
    device: str
    cfg: ParallelConfig
    layer_start: int
    layer_end: int
    recompute: Recompute = "none"

    @property
    def devices(self) -> int:
        return self.cfg.devices

    @property
    def num_layers(self) -> int:
        return self.layer_end - self.layer_start


@dataclass(frozen=True)
class Plan:
    model: str
    cluster: str
    family: Family
    stages: tuple[Stage, ...]
    global_batch_size: int
    seq_length: int
    micro_batch_size: int
    vpp: int = 1
    precision: str = "bf16"
    imbalance: float = 1.0
    dispatcher: str = "alltoall"
    predicted: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    solver: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    # ------------------------------------------------------------------ derived
    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def samples_per_microbatch(self) -> int:
        return self.micro_batch_size * self.stages[0].cfg.dp

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // self.samples_per_microbatch

    def stage_micro_batch(self, i: int) -> int:
        return self.samples_per_microbatch // self.stages[i].cfg.dp

    @property
    def devices_used(self) -> int:
        return sum(s.devices for s in self.stages)

    def devices_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.stages:
            out[s.device] = out.get(s.device, 0) + s.devices
        return out

    def settings(self, base: Settings | None = None) -> Settings:
        b = base or Settings()
        return b.with_(
            seq_length=self.seq_length,
            global_batch_size=self.global_batch_size,
            micro_batch_size=self.micro_batch_size,
            precision=self.precision,
            imbalance=self.imbalance,
            dispatcher=self.dispatcher,
        )

    def layer_counts(self) -> list[int]:
        return [s.num_layers for s in self.stages]

    def slot_offsets(self, cluster: ClusterSpec) -> list[int]:
        """Index of each stage's first device among its type's devices (in the cluster's group order).

        A type's stages take its *last* devices, contiguously in pipeline order; any devices the plan
        leaves idle are the first ones. This is the placement the search assumes when it checks that no
        stage straddles a node boundary (it places stages from the last one backwards).
        """
        tail: dict[str, int] = {}
        for s in self.stages:
            tail[s.device] = tail.get(s.device, 0) + s.devices
        inv = cluster.inventory
        seen: dict[str, int] = {}
        out: list[int] = []
        for s in self.stages:
            before = seen.get(s.device, 0)
            out.append(inv.get(s.device, 0) - tail[s.device] + before)
            seen[s.device] = before + s.devices
        return out

    def placement(self, cluster: ClusterSpec) -> list[list[tuple[int, int]]]:
        """(group index, node index within group) of each stage's devices (see :meth:`slot_offsets`)."""
        cursor: dict[str, list[tuple[int, int]]] = {}
        for gi, g in enumerate(cluster.groups):
            slots = cursor.setdefault(g.device.id, [])
            for node in range(g.nodes):
                slots.extend([(gi, node)] * g.devices_per_node)
        return [
            cursor.get(s.device, [])[off : off + s.devices]
            for s, off in zip(self.stages, self.slot_offsets(cluster), strict=True)
        ]

    def rank_ranges(self) -> list[tuple[int, int]]:
        """Global rank range [first, last] of each stage (pipeline stage s owns consecutive ranks)."""
        out, r = [], 0
        for s in self.stages:
            out.append((r, r + s.devices - 1))
            r += s.devices
        return out

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "model": self.model,
            "cluster": self.cluster,
            "family": self.family,
            "global_batch_size": self.global_batch_size,
            "seq_length": self.seq_length,
            "micro_batch_size": self.micro_batch_size,
            "num_microbatches": self.num_microbatches,
            "vpp": self.vpp,
            "precision": self.precision,
            "imbalance": self.imbalance,
            "dispatcher": self.dispatcher,
            "stages": [
                {
                    "device": s.device,
                    "devices": s.devices,
                    "ranks": list(r),
                    **asdict(s.cfg),
                    "recompute": s.recompute,
                    "layers": [s.layer_start, s.layer_end],
                }
                for s, r in zip(self.stages, self.rank_ranges(), strict=True)
            ],
            "predicted": self.predicted,
            "solver": self.solver,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def write(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")

    def with_predicted(self, predicted: dict[str, Any], solver: dict[str, Any] | None = None) -> Plan:
        return replace(self, predicted=predicted, solver=solver if solver is not None else self.solver)


def plan_from_dict(doc: dict[str, Any], source: str) -> Plan:
    f = Fields(doc, source)
    fmt = f.str_("format", PLAN_FORMAT)
    if fmt != PLAN_FORMAT:
        raise f.err("format", f"unsupported plan format {fmt!r} (expected {PLAN_FORMAT})")
    stages: list[Stage] = []
    for i, sd in enumerate(f.list_("stages")):
        sf = Fields(sd, source, f"stages[{i}]")
        cfg = ParallelConfig(
            tp=sf.int_("tp"), cp=sf.int_("cp", 1), dp=sf.int_("dp"), ep=sf.int_("ep", 1), etp=sf.int_("etp", 1)
        )
        layers = sf.list_("layers")
        if len(layers) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
            raise sf.err("layers", f"must be [start, end) as two integers, got {layers!r}")
        sf.raw("ranks", None)  # derived (rank_ranges); checked below
        devices = sf.int_("devices", cfg.devices)
        if devices != cfg.devices:
            raise sf.err("devices", f"is {devices} but tp*cp*dp = {cfg.devices}")
        stages.append(
            Stage(
                device=sf.str_("device"),
                cfg=cfg,
                layer_start=layers[0],
                layer_end=layers[1],
                recompute=sf.choice("recompute", RECOMPUTE_LEVELS, "none"),
            )
        )
        sf.reject_unknown()
    if not stages:
        raise f.err("stages", "must list at least one stage")
    plan = Plan(
        model=f.str_("model"),
        cluster=f.str_("cluster"),
        family=f.choice("family", ("megatron", "hetero")),
        stages=tuple(stages),
        global_batch_size=f.int_("global_batch_size"),
        seq_length=f.int_("seq_length"),
        micro_batch_size=f.int_("micro_batch_size"),
        vpp=f.int_("vpp", 1),
        precision=f.choice("precision", ("bf16", "fp8"), "bf16"),
        imbalance=f.float_("imbalance", 1.0),
        dispatcher=f.choice("dispatcher", ("allgather", "alltoall", "flex"), "alltoall"),
        predicted=dict(f.raw("predicted", {}) or {}),
        solver=dict(f.raw("solver", {}) or {}),
    )
    for i, (sd, rr) in enumerate(zip(f.list_("stages"), plan.rank_ranges(), strict=True)):
        ranks = sd.get("ranks") if isinstance(sd, dict) else None
        if ranks is not None and list(ranks) != list(rr):
            raise SpecError(f"is {ranks!r}, stage order implies {list(rr)}", source=source, field=f"stages[{i}].ranks")
    m = f.int_("num_microbatches", None)
    f.reject_unknown()
    if m is not None and plan.global_batch_size % plan.samples_per_microbatch == 0 and m != plan.num_microbatches:
        raise SpecError(
            f"is {m} but global_batch_size / (micro_batch_size * dp of stage 0) = {plan.num_microbatches}",
            source=source,
            field="num_microbatches",
        )
    return plan


def load_plan(path: str | Path) -> Plan:
    return plan_from_dict(load_document(path), str(path))


# ---------------------------------------------------------------------- invariants
def check_plan(plan: Plan, model: ModelSpec, cluster: ClusterSpec, source: str = "plan") -> None:
    """Invariants every plan must satisfy, whatever the target framework. Raises PlanError."""

    def bad(fld: str, msg: str) -> PlanError:
        return PlanError(msg, source=source, field=fld)

    n_layers = len(model.layer_kinds)
    pos = 0
    for i, s in enumerate(plan.stages):
        fld = f"stages[{i}]"
        if s.layer_start != pos:
            raise bad(f"{fld}.layers", f"starts at layer {s.layer_start}, expected {pos} (stages must be contiguous)")
        if s.layer_end < s.layer_start:
            raise bad(f"{fld}.layers", f"end {s.layer_end} is before start {s.layer_start}")
        pos = s.layer_end
        if s.device not in cluster.inventory:
            raise bad(f"{fld}.device", f"device type {s.device!r} is not in cluster {cluster.name}")
        check_config(s.cfg, model, plan, cluster.node_size(s.device), f"{fld}")
        if plan.samples_per_microbatch % s.cfg.dp:
            raise bad(
                f"{fld}.dp",
                f"micro-batch step of {plan.samples_per_microbatch} samples (mbs x dp of stage 0) is not divisible "
                f"by this stage's dp {s.cfg.dp}",
            )
    if pos != n_layers:
        raise bad("stages", f"cover {pos} layers, the model has {n_layers} (decoder + MTP)")
    if plan.family == "hetero":
        seen: list[str] = []
        for i, s in enumerate(plan.stages):
            if seen and seen[-1] == s.device:
                continue
            if s.device in seen:
                raise bad(
                    f"stages[{i}].device",
                    f"{s.device} stages must be contiguous in a hetero plan (FlagScale ranks processes by device type)",
                )
            seen.append(s.device)
    used = plan.devices_by_type()
    for did, n in used.items():
        have = cluster.inventory.get(did, 0)
        if n > have:
            raise bad("stages", f"use {n} {did} devices, cluster {cluster.name} has {have}")
    for i, (s, off) in enumerate(zip(plan.stages, plan.slot_offsets(cluster), strict=True)):
        node = cluster.node_size(s.device)
        if s.devices <= node and off // node != (off + s.devices - 1) // node:
            raise bad(f"stages[{i}].devices", f"{s.devices} {s.device} devices at slot {off} straddle a node boundary")
        if s.devices > node and off % node:
            raise bad(
                f"stages[{i}].devices", f"{s.devices} {s.device} devices must start on a node boundary, start {off}"
            )
    if plan.global_batch_size % plan.samples_per_microbatch:
        raise bad(
            "global_batch_size",
            f"{plan.global_batch_size} is not divisible by micro_batch_size x dp of stage 0 "
            f"({plan.samples_per_microbatch})",
        )
    if plan.vpp > 1:
        if plan.pp < 2:
            raise bad("vpp", "virtual pipeline stages need pipeline size > 1")
        if plan.num_microbatches % plan.pp:
            raise bad("vpp", f"interleaved 1F1B needs num_microbatches ({plan.num_microbatches}) divisible by pp")
    if plan.family == "megatron":
        first = plan.stages[0]
        for i, s in enumerate(plan.stages):
            if s.cfg != first.cfg:
                raise bad(f"stages[{i}]", f"megatron plans need one mesh shape; {s.cfg.label()} != {first.cfg.label()}")


def check_config(cfg: ParallelConfig, model: ModelSpec, plan: Plan | None, node_size: int, fld: str) -> None:
    """Megatron's per-mesh rules (reference/megatron.md §2.7) plus ours: TP and ETP inside a node."""

    def bad(sub: str, msg: str) -> PlanError:
        return PlanError(msg, field=f"{fld}.{sub}" if fld else sub)

    if model.num_attention_heads % cfg.tp:
        raise bad("tp", f"num_attention_heads {model.num_attention_heads} is not divisible by tp {cfg.tp}")
    if model.groups % cfg.tp and cfg.tp % model.groups:
        raise bad("tp", f"num_query_groups {model.groups} and tp {cfg.tp} do not divide each other")
    if cfg.tp > node_size:
        raise bad("tp", f"tp {cfg.tp} exceeds the node size {node_size}")
    if cfg.etp > node_size:
        raise bad("etp", f"etp {cfg.etp} exceeds the node size {node_size}")
    if model.is_moe:
        if (model.num_experts or 0) % cfg.ep:
            raise bad("ep", f"num_experts {model.num_experts} is not divisible by ep {cfg.ep}")
    elif cfg.ep != 1 or cfg.etp != 1:
        raise bad("ep", "a dense model needs ep = etp = 1")
    if cfg.edp == 0:
        raise bad("ep", f"etp x ep = {cfg.etp * cfg.ep} does not divide the stage's {cfg.devices} devices")
    seq = plan.seq_length if plan else model.defaults.seq_length
    if cfg.cp > 1 and seq % (2 * cfg.cp):
        raise bad("cp", f"seq_length {seq} is not divisible by 2 x cp = {2 * cfg.cp}")
