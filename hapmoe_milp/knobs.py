"""Plans from Megatron launch knobs (TP/PP/CP/EP/ETP/VPP, layout), as `estimate` and measured runs give them."""

from __future__ import annotations

from typing import Any

from hapmoe_milp.config import ParallelConfig
from hapmoe_milp.errors import PlanError
from hapmoe_milp.export.megatron import layout_problems, layout_rank_layers, parse_layout
from hapmoe_milp.plan import Plan, Stage


def plan_from_knobs(
    model: Any,
    cluster: Any,
    tp: int,
    pp: int,
    cp: int,
    ep: int,
    etp: int | None,
    vpp: int,
    mbs: int,
    gbs: int,
    seq: int,
    recompute: str,
    layout: str | None,
    dispatcher: str,
    precision: str,
    imbalance: float,
) -> Any:
    """A Megatron-style plan from launch knobs: one mesh for every stage, ranks in cluster order.

    Stage ``s`` takes ranks ``[s*g, (s+1)*g)`` in the cluster's group order and must be one device type;
    layers split evenly over ``pp`` unless ``layout`` (Megatron's ``--pipeline-model-parallel-layout``)
    says otherwise, in which case it also sets the virtual stages.
    """
    world = cluster.world_size
    if world % (tp * pp * cp):
        raise PlanError(f"cluster has {world} devices, not divisible by tp*pp*cp = {tp * pp * cp}", field="--pp")
    g = world // pp
    if etp is None:
        etp = tp if model.is_moe else 1  # Megatron's default expert-TP is TP; a dense model has no experts
    cfg = ParallelConfig(tp=tp, cp=cp, dp=world // (tp * pp * cp), ep=ep, etp=etp)
    # stage s takes ranks [s*g, (s+1)*g) in the cluster's group order; it must be one device type
    kinds: list[str] = []
    for grp in cluster.groups:
        kinds += [grp.device.id] * grp.devices
    n_layers = len(model.layer_kinds)
    if layout:
        problems = layout_problems(layout, pp, model.num_layers, model.mtp_num_layers)
        if problems:
            raise PlanError(f"{layout!r}: {problems[0]}", field="--layout")
        counts = [r.total for r in layout_rank_layers(layout, pp)]
        vpp = len(parse_layout(layout)) // pp
    else:
        if n_layers % pp:
            raise PlanError(f"{n_layers} layers do not split evenly over pp={pp}; give --layout", field="--pp")
        counts = [n_layers // pp] * pp
    stages = []
    pos = 0
    for s in range(pp):
        types = set(kinds[s * g : (s + 1) * g])
        if len(types) != 1:
            raise PlanError(
                f"pipeline stage {s} (ranks {s * g}-{(s + 1) * g - 1}) spans device types {sorted(types)}; "
                "choose pp so that stages align with the cluster's groups",
                field="--pp",
            )
        stages.append(Stage(types.pop(), cfg, pos, pos + counts[s], recompute))  # type: ignore[arg-type]
        pos += counts[s]
    return Plan(
        model=model.name,
        cluster=cluster.name,
        family="megatron",
        stages=tuple(stages),
        global_batch_size=gbs,
        seq_length=seq,
        micro_batch_size=mbs,
        vpp=vpp,
        precision=precision,
        imbalance=imbalance,
        dispatcher=dispatcher,
    )
