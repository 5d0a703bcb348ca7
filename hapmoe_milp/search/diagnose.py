"""Say why nothing fits: the tightest constraint, with its numbers."""

from __future__ import annotations

import math

import numpy as np

from hapmoe_milp.config import Family, Settings
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.cost.primitives import GIB
from hapmoe_milp.deadline import NO_DEADLINE, Deadline
from hapmoe_milp.errors import InfeasibleError
from hapmoe_milp.instance import build_options
from hapmoe_milp.space import PruneCounter, Pruning
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec


def diagnose(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    families: list[Family],
    deadline: Deadline = NO_DEADLINE,
) -> InfeasibleError:
    """Build the most favourable memory case and report by how much it misses.

    Each device type's best chance is a stage holding its compute-proportional share of the layers
    spread over the whole cluster (at least one layer), at the last pipeline position (one micro-batch
    in flight), with the option and recompute level that need the least memory per device.

    On thousands of devices this takes tens of seconds; past ``deadline`` it reports the closest case
    among the micro-batch steps it has looked at, and says so.
    """
    cm = CostModel(model, cluster, settings)
    n_layers = len(model.layer_kinds)
    gbs = settings.global_batch_size
    steps = [d * settings.micro_batch_size for d in range(1, gbs + 1) if gbs % (d * settings.micro_batch_size) == 0]
    if not steps:
        return InfeasibleError(
            f"global batch {gbs} is not divisible by micro-batch {settings.micro_batch_size}",
            constraint="batch",
            field="global_batch_size",
        )
    total = cluster.world_size
    worst: tuple[float, str] | None = None
    any_option = False
    kinds = model.layer_kinds
    kind_set = sorted(set(kinds))
    # layers of each kind in [0, x): a window's memory is its kind counts times the per-kind bytes
    count = np.array([[0, *np.cumsum([1 if x == k else 0 for x in kinds])] for k in kind_set])
    stopped = False
    # the whole cluster's memory against the model's: each layer on its leanest option (bytes per device times
    # the devices of its stage), a necessary condition that names the shortfall when no stage is the culprit
    lean = {k: math.inf for k in kind_set}
    usable: dict[str, float] = {}
    for fam in families:
        for step in steps:
            if step > total * settings.micro_batch_size:
                break
            if deadline.passed():
                stopped = True
                break
            opts = build_options(model, cluster, cm, fam, step, Pruning.off(), PruneCounter())
            for o in opts:
                any_option = True
                usable[o.device] = max(usable.get(o.device, 0.0), o.capacity)
                for k in kind_set:
                    c = o.per_kind[k]  # type: ignore[index]
                    lean[k] = min(lean[k], (c.weights + c.act) * o.devices)
                share = max(1, math.ceil(n_layers * o.devices / total))
                per_layer = np.array([o.per_kind[k].weights + o.per_kind[k].act for k in kind_set])  # type: ignore[index]
                # the cheapest-in-memory window of `share` consecutive layers
                windows = count[:, share:] - count[:, : n_layers - share + 1]
                best_mem = float((per_layer @ windows).min()) + o.fixed
                ratio = best_mem / o.capacity if o.capacity > 0 else math.inf
                if worst is None or ratio < worst[0]:
                    dev = cluster.device(o.device)
                    msg = (
                        f"memory: a stage of {o.devices} {dev.id} holding {share} of {len(kinds)} layers needs "
                        f"{best_mem / GIB:.1f} GiB per device even with {o.cfg.label()} and recompute "
                        f"{o.recompute}; {dev.name} has {o.capacity / GIB:.1f} GiB usable "
                        f"({dev.memory_gib:g} GiB less {settings.memory_headroom:.0%} headroom, context, buffers and "
                        "allocator fragmentation: cost/memory.py)"
                    )
                    worst = (ratio, msg)
    if stopped and worst is None:
        return InfeasibleError(
            f"no plan fits {model.name} on {cluster.name} (the search proved it); the time limit ran out before the "
            "tightest constraint was found -- give a longer --time-limit to see it",
            constraint="unknown",
        )
    if not any_option:
        return InfeasibleError(
            f"no valid stage configuration: no (TP, CP, DP, EP, ETP) for {model.name} on {cluster.name} divides "
            f"the global batch {gbs} with micro-batch {settings.micro_batch_size} (check --gbs/--mbs, heads, experts)",
            constraint="divisibility",
        )
    assert worst is not None
    need = sum(kinds.count(k) * lean[k] for k in kind_set)
    have = sum(usable.get(d, 0.0) * n for d, n in cluster.inventory.items())
    if not stopped and need > have:
        return InfeasibleError(
            f"memory: {model.name} needs at least {need / GIB:,.0f} GiB across the cluster (every layer's weights, "
            f"optimizer state and one micro-batch of activations, each on its leanest stage option), and "
            f"{cluster.name} has {have / GIB:,.0f} GiB usable on {total} devices (cost/memory.py); use more "
            "devices" + ("" if settings.optimizer_offload else " or try --optimizer-offload"),
            constraint="memory",
        )
    partial = " (the closest case among the micro-batch sizes checked before the time limit)" if stopped else ""
    if worst[0] > 1.0:
        hint = "" if settings.optimizer_offload else "; try --optimizer-offload"
        return InfeasibleError(worst[1] + partial + hint, constraint="memory")
    return InfeasibleError(
        f"no plan satisfies memory, inventory and divisibility together for {model.name} on {cluster.name} "
        f"(closest: {worst[1]}{partial})",
        constraint="combination",
    )
