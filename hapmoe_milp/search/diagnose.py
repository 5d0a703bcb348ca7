"""Say why nothing fits: the tightest constraint, with its numbers."""

from __future__ import annotations

import math

from hapmoe_milp.config import Family, Settings
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.cost.primitives import GIB
from hapmoe_milp.errors import InfeasibleError
from hapmoe_milp.instance import build_options
from hapmoe_milp.space import PruneCounter, Pruning
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec


def diagnose(model: ModelSpec, cluster: ClusterSpec, settings: Settings, families: list[Family]) -> InfeasibleError:
    """Build the most favourable memory case and report by how much it misses.

    Each device type's best chance is a stage holding its compute-proportional share of the layers
    spread over the whole cluster (at least one layer), at the last pipeline position (one micro-batch
    in flight), with the option and recompute level that need the least memory per device.
    """
    cm = CostModel(model, cluster, settings)
    n_layers = len(model.layer_kinds)
    gbs = settings.global_batch_size
    steps = [d * settings.micro_batch_size for d in range(1, gbs + 1) if gbs % (d * settings.micro_batch_size) == 0]
    if not steps:
        return InfeasibleError(
            f"global batch {gbs} is not divisible by micro-batch {settings.micro_batch_size}",
            constraint="batch",
            field="--gbs",
        )
    total = cluster.world_size
    worst: tuple[float, str] | None = None
    any_option = False
    for fam in families:
        for step in steps:
            if step > total * settings.micro_batch_size:
                break
            opts = build_options(model, cluster, cm, fam, step, Pruning.off(), PruneCounter())
            for o in opts:
                any_option = True
                share = max(1, math.ceil(n_layers * o.devices / total))
                kinds = model.layer_kinds
                # the cheapest-in-memory window of `share` consecutive layers
                best_mem = min(
                    o.seg("weights", s, s + share) + o.seg("act", s, s + share) + o.fixed
                    for s in range(0, n_layers - share + 1)
                )
                ratio = best_mem / o.capacity
                if worst is None or ratio < worst[0]:
                    dev = cluster.device(o.device)
                    msg = (
                        f"memory: a stage of {o.devices} {dev.id} holding {share} of {len(kinds)} layers needs "
                        f"{best_mem / GIB:.1f} GiB per device even with {o.cfg.label()} and recompute "
                        f"{o.recompute}; {dev.name} has {o.capacity / GIB:.1f} GiB usable "
                        f"({dev.memory_gib:g} GiB less {settings.memory_headroom:.0%} headroom)"
                    )
                    worst = (ratio, msg)
    if not any_option:
        return InfeasibleError(
            f"no valid stage configuration: no (TP, CP, DP, EP, ETP) for {model.name} on {cluster.name} divides "
            f"the global batch {gbs} with micro-batch {settings.micro_batch_size} (check --gbs/--mbs, heads, experts)",
            constraint="divisibility",
        )
    assert worst is not None
    if worst[0] > 1.0:
        hint = "" if settings.optimizer_offload else "; try --optimizer-offload"
        return InfeasibleError(worst[1] + hint, constraint="memory")
    return InfeasibleError(
        f"no plan satisfies memory, inventory and divisibility together for {model.name} on {cluster.name} "
        f"(closest: {worst[1]})",
        constraint="combination",
    )
