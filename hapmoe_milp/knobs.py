"""Plans from Megatron launch knobs (TP/PP/CP/EP/ETP/VPP, layout), as `estimate` and measured runs give them."""

from __future__ import annotations

from typing import Any

from hapmoe_milp.config import ParallelConfig, Settings, check_int, check_recompute
from hapmoe_milp.errors import PlanError
from hapmoe_milp.layout import layout_problems, layout_rank_layers, parse_layout
from hapmoe_milp.limits import MAX_DEVICES
from hapmoe_milp.plan import Plan, Stage


def plan_from_knobs(
    model: Any,
    cluster: Any,
    settings: Settings,
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    vpp: int | None = None,
    recompute: str = "none",
    layout: str | None = None,
) -> Plan:
    """The megatron-family plan the knobs describe on the whole cluster: one mesh for every stage.

    Stage ``s`` takes ranks ``[s*g, (s+1)*g)`` in the cluster's group order and must be one device type;
    layers split evenly over ``pp`` unless ``layout`` (Megatron's ``--pipeline-model-parallel-layout``)
    says otherwise, in which case it also sets the virtual stages. ``etp`` defaults to Megatron's default
    (= ``tp``) for MoE models and to 1 for dense ones. Errors name the knob (``pp``, ``layout``, ...).
    """
    recompute = check_recompute(recompute)
    pp = check_int("pp", pp, 1, MAX_DEVICES)
    if etp is None:
        etp = tp if model.is_moe else 1
    cfg0 = ParallelConfig(tp=tp, cp=cp, ep=ep, etp=etp)
    world = cluster.world_size
    if world % (cfg0.tp * pp * cfg0.cp):
        raise PlanError(
            f"cluster has {world} devices, not divisible by tp*pp*cp = {cfg0.tp * pp * cfg0.cp}", field="pp"
        )
    g = world // pp
    cfg = ParallelConfig(tp=cfg0.tp, cp=cfg0.cp, dp=world // (cfg0.tp * pp * cfg0.cp), ep=cfg0.ep, etp=cfg0.etp)
    # stage s takes ranks [s*g, (s+1)*g) in the cluster's group order; it must be one device type
    kinds: list[str] = []
    for grp in cluster.groups:
        kinds += [grp.device.id] * grp.devices
    n_layers = len(model.layer_kinds)
    if layout:
        problems = layout_problems(layout, pp, model.num_layers, model.mtp_num_layers)
        if problems:
            raise PlanError(f"{layout[:80]!r}: {problems[0]}", field="layout")
        counts = [r.total for r in layout_rank_layers(layout, pp)]
        chunks = len(parse_layout(layout)) // pp
        if vpp not in (None, 1, chunks):  # the layout sets the chunks; a different --vpp contradicts it
            raise PlanError(f"{vpp} disagrees with the layout, which has {chunks} chunk(s) per stage", field="vpp")
        vpp = chunks
    else:
        if n_layers % pp:
            what = f"{n_layers} layers"
            if model.mtp_num_layers:
                mtp = model.mtp_num_layers
                what += f" ({model.num_layers} decoder layers + {mtp} MTP layer{'s' if mtp > 1 else ''})"
            raise PlanError(f"{what} do not split evenly over pp={pp}; give a layout", field="pp")
        counts = [n_layers // pp] * pp
        vpp = 1 if vpp is None else vpp
    stages = []
    pos = 0
    for s in range(pp):
        types = set(kinds[s * g : (s + 1) * g])
        if len(types) != 1:
            raise PlanError(
                f"pipeline stage {s} (ranks {s * g}-{(s + 1) * g - 1}) spans device types {sorted(types)}; "
                "choose pp so that stages align with the cluster's groups",
                field="pp",
            )
        stages.append(Stage(types.pop(), cfg, pos, pos + counts[s], recompute))  # type: ignore[arg-type]
        pos += counts[s]
    return Plan.from_settings(model, cluster, "megatron", tuple(stages), settings, vpp=vpp)
