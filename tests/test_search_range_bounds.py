"""Exact-layer range bounds (search/range_bounds.py) against brute force, and the exact search that uses them.

Every depth bound must stay at or below the brute-force optimum of that depth (every plan of the depth,
priced by ``Instance.evaluate``, checked by ``check_plan`` and, where a runtime's rules between stages
apply, by ``SubProblem.admissible``), whatever the cutoff. The layer patterns have a dense prefix and MTP
layers; the clusters one or two device types with memory that binds; some cases carry FlagScale's rules
(every mesh after the first holds two stages), which the bound relaxes by device size.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hapmoe_milp.errors import PlanError
from hapmoe_milp.instance import build_instances, group_keys
from hapmoe_milp.plan import check_plan
from hapmoe_milp.runtimes import FLAGSCALE
from hapmoe_milp.search import exact
from hapmoe_milp.search.block_bounds import BlockBounds
from hapmoe_milp.search.dp import solve_dp
from hapmoe_milp.search.formulation import SubProblem, evaluate_assignment, plan_of
from hapmoe_milp.search.range_bounds import RangeBounds
from hapmoe_milp.space import Pruning
from tests.helpers import tiny_cluster, tiny_model
from tests.test_search_exact import _check_plan_objective, _settings

OFF = Pruning.off()
SPECS = [
    [("h800", 2, 2.6), ("910b", 2, None)],
    [("h800", 4, 2.4)],
    [("a100", 2, None), ("h800", 1, 3.0)],
    [("910b", 3, 3.0)],
]
#: brute force only the depths with at most this many (layer cuts x options) plans
PLANS = 40_000


def _subs(model, cluster, st_, family, runtime=None):
    for inst in build_instances(model, cluster, st_, family, OFF, runtime=runtime):
        for key in group_keys(inst):
            sp = SubProblem(inst, [key])
            if sp.O and BlockBounds.applicable(sp):
                yield sp


def _optima(sp: SubProblem) -> dict[int, float]:
    """Brute force over every plan (layer cuts x options) of the depths small enough, with the runtime's
    rules."""
    out: dict[int, float] = {}
    n = sp.N
    for P in sp.depths:
        if math.comb(n - 1, P - 1) * sp.O**P > PLANS:
            continue
        for cuts in itertools.combinations(range(1, n), P - 1):
            bounds = (0, *cuts, n)
            for combo in itertools.product(range(sp.O), repeat=P):
                a = [(i, bounds[j], bounds[j + 1]) for j, i in enumerate(combo)]
                if not sp.admissible(a) or sp.options[combo[0]].cfg.dp != sp.inst.first_dp:
                    continue
                try:
                    check_plan(plan_of(sp, a), sp.inst.model, sp.inst.cluster)
                except PlanError:
                    continue
                val, fits = evaluate_assignment(sp, a)
                if fits and val < out.get(P, math.inf):
                    out[P] = val
    return out


def _check(sp: SubProblem, optima: dict[int, float], factor: float) -> int:
    """Every depth bound at or below the depth's optimum, under no cutoff and cutoffs around the optima
    (and out of time); returns how many depth bounds reach the optimum (tight)."""
    depths = [P for P in sp.depths if P >= 2]
    rb = RangeBounds(sp, depths)
    best = min(optima.values(), default=math.inf)
    tight = 0
    for cutoff in (math.inf, best * factor, *(v * factor for v in optima.values())):
        for deadline in (None, 0.0):
            lbs = rb.depth_bounds(cutoff, deadline)
            # out of time before the first pass: no bounds at all (the block bounds stand alone)
            assert set(lbs) == (set(depths) if deadline is None else set())
            for P, lb in lbs.items():
                assert lb <= cutoff
                if P in optima and optima[P] < cutoff:
                    assert lb <= optima[P] * (1 + 1e-9), (P, lb, optima[P], cutoff)
                    tight += deadline is None and lb >= optima[P] * (1 - 1e-9)
    return tight


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    lead=st.integers(0, 2),
    body=st.integers(2, 3),
    mtp=st.sampled_from([0, 1]),
    spec=st.sampled_from(SPECS),
    gbs=st.sampled_from([2, 4, 8]),
    family=st.sampled_from(["hetero", "megatron"]),
    rules=st.booleans(),
    factor=st.sampled_from([1 + 1e-9, 1.01, 0.99]),
)
def test_range_bounds_never_exceed_brute_force_depth_optima(catalog, lead, body, mtp, spec, gbs, family, rules, factor):
    model = tiny_model((0,) * lead + (1,) * body, mtp=mtp)
    cluster = tiny_cluster(catalog, spec)
    runtime = FLAGSCALE if rules and family == "hetero" else None
    for sp in _subs(model, cluster, _settings(gbs), family, runtime):
        _check(sp, _optima(sp), factor)


def test_range_bounds_with_mesh_rules_are_valid(catalog):
    """FlagScale's rules on a dense-prefix + MTP model (meshes after the first hold two stages, the edge
    stages share TP and DP): the bounds, which count runs of one device size, stay below the
    rule-respecting optima of every depth."""
    model = tiny_model((0, 1, 1), mtp=1)
    cluster = tiny_cluster(catalog, [("h800", 2, 2.6), ("910b", 2, None)])
    subs = list(_subs(model, cluster, _settings(4), "hetero", FLAGSCALE))
    assert subs and any(sp.rules.mesh_min_stages >= 2 for sp in subs)
    checked = 0
    for sp in subs:
        optima = _optima(sp)
        _check(sp, optima, 1 + 1e-9)
        checked += len(optima)
    assert checked > 0


@pytest.mark.parametrize("solver", ["cpsat", "milp"])
def test_exact_search_with_range_bounds_matches_unpruned_dp(catalog, solver):
    """The scale path (block bounds, then range bounds on the depths they leave open) reaches the unpruned
    DP's optimum on a dense prefix + MTP hetero case."""
    model = tiny_model((0, 0, 1, 1, 1), mtp=1)
    cluster = tiny_cluster(catalog, [("h800", 2, 2.6), ("910b", 2, None)])
    st_ = _settings(4)
    ref = solve_dp(model, cluster, st_, family="hetero", pruning=OFF)
    sol = exact.solve(
        model, cluster, st_, solver=solver, family="hetero", pruning=OFF, threads=2, time_limit=60, block_bounds=True
    )
    assert sol.status == "optimal"
    assert sol.objective_s == pytest.approx(ref.objective_s, rel=1e-5)
    assert sol.bound_s <= ref.objective_s * (1 + 1e-9)
    assert "range_bounds_s" in sol.stats
    _check_plan_objective(sol, model, cluster, st_)
