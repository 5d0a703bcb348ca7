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
                try:
                    check_plan(plan_of(sp, a), inst.model, inst.cluster)
                except PlanError:
                    continue
                val, fits = evaluate_assignment(sp, a)
                if fits and val < out.get(P, (math.inf, []))[0]:
                    out[P] = (val, a)
    return out
