"""Brute force over small instances: every plan enumerated, priced by ``Instance.evaluate`` and checked by
``check_plan`` -- independent of the formulation's arcs, reductions and bounds, and of the DP."""

from __future__ import annotations

import itertools
import math

from hapmoe_milp.errors import PlanError
from hapmoe_milp.plan import check_plan
from hapmoe_milp.search.formulation import SubProblem, evaluate_assignment, plan_of


def lead_block(model) -> int | None:
    """Leading decoder layers of another kind than the rest (None: more mixed than one leading block)."""
    dec = [k for k in model.layer_kinds if k != "mtp"]
    rest = len(dec)
    while rest and dec[rest - 1] == dec[-1]:
        rest -= 1
    return rest if len(set(dec[:rest])) <= 1 else None


def interleavable(model, counts: list[int], v: int, m: int) -> bool:
    """The interleaved plans the DP searches (its docstrings state the rule): Megatron's ``P > 1`` and
    ``M % P == 0``, a layer in every virtual chunk (the last rank also fits its MTP layers after ``v - 1``
    decoder layers), and a layer sequence whose chunks price like the stage's contiguous range."""
    p = len(counts)
    lead = lead_block(model)
    mtp = sum(1 for k in model.layer_kinds if k == "mtp")
    if p < 2 or m % p or lead is None:
        return False
    if any(c < v for c in counts) or counts[-1] < v + max(0, mtp - 1):
        return False
    return -(-counts[0] // v) >= lead


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
