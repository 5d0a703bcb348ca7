"""HAPMoE's "MI" baseline: the best plan upstream Megatron-LM expresses without a pipeline layout.

An adapter: it enumerates the mesh shapes Megatron accepts (:func:`hapmoe_milp.space.configs`), builds
each as a :class:`Plan` and keeps the fastest that :func:`~hapmoe_milp.cost.estimate.estimate` says fits.
"""

from __future__ import annotations

import time

from hapmoe_milp.config import Settings
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.deadline import NO_DEADLINE, Deadline
from hapmoe_milp.plan import Plan, Stage
from hapmoe_milp.search.solution import Solution
from hapmoe_milp.space import configs
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

from .common import REC_ORDER, SOLVER_NAMES, divisors, finish, infeasible, is_valid, make_plan, stopped


def megatron_uniform(
    model: ModelSpec,
    cluster: ClusterSpec,
    settings: Settings,
    *,
    vpp: bool = True,
    max_vpp: int = 8,
    deadline: Deadline = NO_DEADLINE,
) -> Solution:
    """The fastest plan upstream Megatron-LM expresses with one mesh shape and no pipeline layout.

    Grid search over (TP, CP, EP, ETP, PP, VPP, recompute) with the whole cluster as the world:
    ``PP`` divides the world, each stage gets ``world/PP`` consecutive ranks in the cluster's group order
    (a stage must not span device types, which is what ``torchrun`` rank order gives a mixed cluster),
    decoder layers are split evenly (Megatron's default needs ``num_layers % PP == 0``; MTP layers go to
    the last stage), one recompute setting for every stage, and VPP needs ``num_layers % (PP*VPP) == 0``
    and ``M % PP == 0``. The fastest plan whose memory fits wins. Recompute levels are tried cheapest
    first per mesh because recomputation only ever adds time. This is HAPMoE's "MI" baseline, made
    stronger: a grid search instead of a hand-tuned configuration. Past ``deadline`` the search stops with
    the best plan so far (status ``timeout``).
    """
    name = SOLVER_NAMES["megatron"]
    t0 = time.perf_counter()
    world = cluster.world_size
    n_dec = model.num_layers
    n_all = len(model.layer_kinds)
    rank_type = [g.device.id for g in cluster.groups for _ in range(g.devices)]
    cm = CostModel(model, cluster, settings)
    best: tuple[float, Plan] | None = None
    tried = 0
    for pp in divisors(world):
        if pp > n_dec or n_dec % pp:
            continue
        g = world // pp
        types = [rank_type[i * g] for i in range(pp)]
        if any(len(set(rank_type[i * g : (i + 1) * g])) > 1 for i in range(pp)):
            continue
        node = min(cluster.node_size(t) for t in set(types))
        per = n_dec // pp
        bounds = [(i * per, (i + 1) * per) for i in range(pp)]
        bounds[-1] = (bounds[-1][0], n_all)
        for cfg in configs(model, g, node, settings.seq_length):
            if deadline.passed():
                break
            if settings.global_batch_size % (cfg.dp * settings.micro_batch_size):
                continue
            m = settings.global_batch_size // (cfg.dp * settings.micro_batch_size)
            vpps = [1]
            if vpp and pp > 1 and m % pp == 0:
                vpps += [v for v in range(2, max_vpp + 1) if per % v == 0]
            for v in vpps:
                for rec in REC_ORDER:
                    stages = [Stage(types[i], cfg, s, e, rec) for i, (s, e) in enumerate(bounds)]
                    plan = make_plan(model, cluster, settings, "megatron", stages, v)
                    tried += 1
                    if not is_valid(plan, model, cluster):
                        break
                    est = estimate(model, cluster, plan, settings, cost_model=cm)
                    if not est.fits:
                        continue
                    if best is None or est.iteration_time_s < best[0] - 1e-12:
                        best = (est.iteration_time_s, plan)
                    break  # costlier recompute levels are only slower
    if deadline.passed():
        return stopped(name, t0, best[1] if best else None, tried, model, cluster, settings)
    if best is None:
        return infeasible(name, t0, f"no uniform Megatron plan fits ({tried} candidates)", candidates=tried)
    plan = best[1]
    msg = (
        f"grid search: PP{plan.pp} x {plan.stages[0].cfg.label()} VPP{plan.vpp} recompute={plan.stages[0].recompute}, "
        f"even layer split, {tried} candidates"
    )
    return finish(name, model, cluster, settings, plan, t0, msg, {"candidates": tried})
