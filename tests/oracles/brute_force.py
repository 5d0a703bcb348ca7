"""Brute force over small instances: every plan enumerated, priced by ``Instance.evaluate`` and checked by
``check_plan`` -- independent of the formulation's arcs, reductions and bounds, and of the DP."""

from __future__ import annotations

import itertools
import math

from hapmoe_milp.errors import PlanError
from hapmoe_milp.plan import check_plan
from hapmoe_milp.search.formulation import SubProblem, evaluate_assignment, plan_of
from tests.helpers import interleavable


def depth_optima(sp: SubProblem) -> dict[int, tuple[float, list]]:
    """Brute force: the best plan of every depth of a sub-problem (instance pricing, layout rules by
    ``check_plan``), independent of the formulation's arcs and reductions."""
    inst = sp.inst
    n = sp.N
    out: dict[int, tuple[float, list]] = {}
    for P in range(1, sp.K + 1):
        for cuts in itertools.combinations(range(1, n), P - 1):
            bounds = (0, *cuts, n)
            counts = [bounds[j + 1] - bounds[j] for j in range(P)]
            if inst.vpp > 1 and not interleavable(inst.model, counts, inst.vpp, inst.num_microbatches):
                continue  # the interleaved space of tests/test_search_dp.py's brute force
            for combo in itertools.product(range(sp.O), repeat=P):
                if len({int(sp.gid[i]) for i in combo}) > 1:
                    continue
                a = [(i, bounds[j], bounds[j + 1]) for j, i in enumerate(combo)]
                if sp.options[combo[0]].cfg.dp != inst.first_dp:
                    continue
                val, fits = evaluate_assignment(sp, a)
                if not fits or val >= out.get(P, (math.inf, []))[0]:
                    continue  # cannot improve: whether the layout is valid does not matter
                try:  # validated only when it would improve, so the minimum is still over valid plans only
                    check_plan(plan_of(sp, a), inst.model, inst.cluster)
                except PlanError:
                    continue
                out[P] = (val, a)
    return out


def plan_optimum(model, cluster, st, family: str, runtimes=None, max_vpp: int = 8) -> tuple[float, object]:
    """Brute force over whole plans: every stage count, layer split and option per stage of each family's
    instances (``build_instances`` with that family's runtime, for its option rules), plain and, for the
    megatron family where the runtime has VPP, every interleaved schedule ``interleavable`` allows. A plan
    counts if it meets the runtime's rules between stages (``stage_rule_problems``, what ``validate``
    checks), the last stage's decoder minimum (``Instance.stage_min_layers``), the inventory and
    ``check_plan``; it is scored by ``estimate`` (the closed form, not the DP's or the arcs' pricing)."""
    from hapmoe_milp.cost.estimate import estimate
    from hapmoe_milp.instance import build_instances, group_keys, in_group
    from hapmoe_milp.plan import Plan, Stage
    from hapmoe_milp.space import Pruning, StageRules, stage_rule_problems, stage_rules

    best, best_plan = math.inf, None
    n = len(model.layer_kinds)
    for fam in ("megatron", "hetero") if family == "both" else (family,):
        rt = (runtimes or {}).get(fam)
        rules = stage_rules(rt, model, st) if rt is not None else StageRules()
        top = max_vpp if fam == "megatron" and (rt is None or rt.vpp) else 1
        for inst in build_instances(model, cluster, st, fam, Pruning.off(), runtime=rt):
            last_min = inst.stage_min_layers[1]
            for key in group_keys(inst):
                opts = [o for o in inst.options if in_group(o, key)]
                for p in range(1, n + 1):
                    for cuts in itertools.combinations(range(1, n), p - 1):
                        bounds = (0, *cuts, n)
                        counts = [bounds[i + 1] - bounds[i] for i in range(p)]
                        if counts[-1] < last_min:
                            continue
                        vpps = [
                            1,
                            *(v for v in range(2, top + 1) if interleavable(model, counts, v, inst.num_microbatches)),
                        ]
                        for combo in itertools.product(opts, repeat=p):
                            if combo[0].cfg.dp != inst.first_dp:
                                continue
                            used: dict[str, int] = {}
                            for o in combo:
                                used[o.device] = used.get(o.device, 0) + o.devices
                            if any(u > inst.inventory[d] for d, u in used.items()):
                                continue
                            stages = tuple(
                                Stage(o.device, o.cfg, bounds[i], bounds[i + 1], o.recompute)  # type: ignore[arg-type]
                                for i, o in enumerate(combo)
                            )
                            if stage_rule_problems(rules, stages):
                                continue
                            for vpp in vpps:
                                plan = Plan(
                                    model.name,
                                    cluster.name,
                                    fam,  # type: ignore[arg-type]
                                    stages,
                                    st.global_batch_size,
                                    st.seq_length,
                                    st.micro_batch_size,
                                    vpp=vpp,
                                    dispatcher=st.dispatcher,
                                )
                                try:
                                    check_plan(plan, model, cluster)
                                except PlanError:
                                    continue  # outside the space: non-contiguous types, straddled nodes, ...
                                e = estimate(model, cluster, plan, st)
                                if e.fits and e.iteration_time_s < best:
                                    best, best_plan = e.iteration_time_s, plan
    return best, best_plan
