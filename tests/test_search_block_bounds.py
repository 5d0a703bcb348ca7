"""Block bounds (search/block_bounds.py) against brute force, and the exact search and ``auto`` that use them.

Every depth bound must stay at or below the brute-force optimum of that depth (every plan of the depth,
priced by ``Instance.evaluate`` and checked by ``check_plan``), whatever the cutoff; a depth it closes
has no plan below the cutoff. The layer patterns have a leading block of another kind and an MTP layer,
the clusters one or two device types with memory that binds.
"""

from __future__ import annotations

import math

import pytest

from hapmoe_milp.search import exact
from hapmoe_milp.search.block_bounds import BlockBounds
from hapmoe_milp.search.dp import solve_dp
from hapmoe_milp.space import Pruning
from tests.helpers import tiny_cluster, tiny_model
from tests.oracles.brute_force import depth_optima
from tests.test_search_exact import _check_plan_objective, _settings, _subproblems

OFF = Pruning.off()
SPECS = [
    [("h800", 2, 2.6), ("910b", 2, None)],
    [("h800", 4, 2.4)],
    [("a100", 2, None), ("h800", 1, 3.0)],
    [("910b", 3, 3.0)],
]


def _check_bounds(sp, optima: dict, factor: float) -> int:
    """Every depth bound below the depth's brute-force optimum, under no cutoff and under cutoffs around
    the optima; returns how many depths the bounds closed."""
    bb = BlockBounds(sp)
    assert bb.ok
    best = min((v for v, _ in optima.values()), default=math.inf)
    closed = 0
    for cutoff in (math.inf, best * factor, *(v * factor for v, _ in optima.values())):
        lbs = bb.depth_bounds(cutoff)
        assert set(lbs) == set(sp.depths)
        for P, lb in lbs.items():
            assert lb <= cutoff
            if P in optima and optima[P][0] < cutoff:
                assert lb <= optima[P][0] * (1 + 1e-9), (P, lb, optima[P][0], cutoff)
            closed += lb >= cutoff
        for P, lb in bb.depth_bounds(cutoff, deadline=0.0).items():  # out of time: fewer, weaker, still valid
            if P in optima and optima[P][0] < cutoff:
                assert lb <= optima[P][0] * (1 + 1e-9)
    return closed


# (lead dense layers, MoE body layers, MTP, cluster, GBS, family, cutoff factor): every cluster shape with
# the families that apply to it, a leading block of 0-2 layers, with and without MTP, cutoffs at, above and below the optima.
# The brute force over four devices of one kind grows past minutes at four layers, so those stay at three.
BOUND_CASES = [
    (2, 3, 1, 3, 8, "hetero", 1 + 1e-9),
    (2, 3, 1, 2, 8, "hetero", 0.99),
    (2, 3, 1, 1, 8, "megatron", 1.01),
    (2, 2, 0, 1, 2, "megatron", 0.99),
    (2, 2, 0, 0, 2, "hetero", 0.99),
    (1, 2, 1, 0, 8, "hetero", 1 + 1e-9),
    (0, 2, 0, 1, 4, "hetero", 1.01),
    (1, 2, 0, 1, 2, "hetero", 0.99),
    (1, 3, 0, 3, 4, "megatron", 1 + 1e-9),
    (2, 2, 1, 2, 2, "hetero", 1.01),
    (0, 3, 1, 2, 4, "megatron", 0.99),
]


@pytest.mark.parametrize(("lead", "body", "mtp", "spec", "gbs", "family", "factor"), BOUND_CASES)
def test_block_bounds_never_exceed_brute_forcedepth_optima(catalog, lead, body, mtp, spec, gbs, family, factor):
    model = tiny_model((0,) * lead + (1,) * body, mtp=mtp)
    cluster = tiny_cluster(catalog, SPECS[spec])
    checked = 0
    for sp in _subproblems(model, cluster, _settings(gbs), family):
        if BlockBounds.applicable(sp):
            _check_bounds(sp, depth_optima(sp), factor)
            checked += 1
    assert checked  # every case reaches the bounds


def test_block_bounds_are_tight_on_a_dense_prefix_case(catalog):
    """Not only valid: on a dense-prefix + MTP case the bounds close the depths the optimum is not in
    under a cutoff at the optimum, and a single stage is priced exactly."""
    model = tiny_model((0, 1, 1, 1), mtp=1)
    cluster = tiny_cluster(catalog, [("h800", 2, 2.6), ("910b", 2, None)])
    subs = [sp for sp in _subproblems(model, cluster, _settings(4)) if BlockBounds.applicable(sp)]
    assert subs
    closed = 0
    for sp in subs:
        optima = depth_optima(sp)
        closed += _check_bounds(sp, optima, 1 + 1e-9)
        if 1 in optima:
            assert BlockBounds(sp).depth_bounds()[1] == pytest.approx(optima[1][0], rel=1e-12)
    assert closed > 0


def test_scope_of_the_block_bounds(catalog):
    """Three device types in a hetero plan (no two-block order), interleaved schedules and patterns with
    more than one leading block are out of scope; the exact search then builds depth models as before."""
    three = tiny_cluster(catalog, [("h800", 1, None), ("910b", 1, None), ("a100", 1, None)])
    model = tiny_model((1, 1, 1))
    assert not any(BlockBounds.applicable(sp) for sp in _subproblems(model, three, _settings()))
    two = tiny_cluster(catalog, [("h800", 2, None), ("910b", 2, None)])
    mixed = tiny_model((0, 1, 0, 1))
    assert not any(BlockBounds.applicable(sp) for sp in _subproblems(mixed, two, _settings()))
    four = tiny_model((1, 1, 1, 1))
    vpp = [sp for sp in _subproblems(four, two, _settings(4), "megatron", max_vpp=2) if sp.vpp > 1]
    assert vpp and not any(BlockBounds.applicable(sp) for sp in vpp)


@pytest.mark.parametrize("solver", ["cpsat", "milp"])
def test_exact_search_with_block_bounds_matches_unpruned_dp(catalog, solver):
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
    assert sol.stats["closed_by_block_bounds"] > 0
    _check_plan_objective(sol, model, cluster, st_)


def test_auto_proves_the_families_apart(catalog):
    """``auto`` at scale (forced here on a small cluster): the unpruned DP proves the megatron family, the
    exact backend shows that no hetero plan beats the best plan; the optimum is the unpruned DP's over
    both families and the certificate names who proved what."""
    model = tiny_model((0, 1, 1, 1), mtp=1)
    cluster = tiny_cluster(catalog, [("h800", 2, 2.6), ("910b", 2, None)])
    st_ = _settings(4)
    ref = solve_dp(model, cluster, st_, pruning=OFF)
    auto = exact.solve(
        model, cluster, st_, solver="auto", time_limit=60, threads=2, split_families=True, block_bounds=True
    )
    assert auto.status == "optimal"
    assert auto.objective_s == pytest.approx(ref.objective_s, rel=1e-6)
    assert auto.bound_s <= ref.objective_s * (1 + 1e-9)
    proof = auto.stats["proof"]
    assert proof["megatron"]["method"] == "dp-exact"
    assert proof["hetero"]["method"] == "cpsat"
    assert set(auto.stats["proved_by"].split(" + ")) == {"dp-exact (megatron)", "cpsat (hetero)"}
    assert auto.stats["dp_gap_to_bound"] >= 0
    _check_plan_objective(auto, model, cluster, st_)


# the scale path on small instances: dense prefix + MTP, plain and interleaved (megatron) plans
SCALE_CASES = [
    # (layer pattern, MTP layers, cluster, global batch)
    ((0, 0, 1, 1, 1, 1), 1, [("h800", 2, 2.6), ("910b", 2, None)], 8),
    ((0, 1, 1, 1, 1, 1, 1), 1, [("a100", 4, 2.6)], 8),
    ((0, 1, 1, 1, 1), 1, [("h800", 2, None), ("mi300x", 2, 3.0)], 4),
]


@pytest.mark.parametrize(("pattern", "mtp", "spec", "gbs"), SCALE_CASES)
def test_scale_path_matches_the_unpruned_dp(catalog, pattern, mtp, spec, gbs):
    """Block bounds in both backends and ``auto`` proving the families apart reach the unpruned DP's
    optimum over plain and interleaved plans (the DP is itself checked against brute force)."""
    model = tiny_model(pattern, mtp=mtp)
    cluster = tiny_cluster(catalog, spec)
    st_ = _settings(gbs)
    ref = solve_dp(model, cluster, st_, pruning=OFF)
    assert ref.status == "optimal"
    for solver in ("cpsat", "milp"):
        sol = exact.solve(model, cluster, st_, solver=solver, pruning=OFF, threads=2, time_limit=60, block_bounds=True)
        assert sol.status == "optimal"
        assert sol.objective_s == pytest.approx(ref.objective_s, rel=1e-5)
        assert sol.bound_s <= ref.objective_s * (1 + 1e-9)
    auto = exact.solve(
        model, cluster, st_, solver="auto", time_limit=60, threads=2, split_families=True, block_bounds=True
    )
    assert auto.status == "optimal"
    assert auto.objective_s == pytest.approx(ref.objective_s, rel=1e-6)
    assert auto.bound_s <= ref.objective_s * (1 + 1e-9)
    _check_plan_objective(auto, model, cluster, st_)


def test_auto_without_time_for_the_exact_stage_still_answers(catalog, monkeypatch):
    """When the stages after the pruned DP get no time (here: the unpruned megatron DP stops at once and
    nothing else runs), ``auto`` returns the DP's plan, no proof and no invented bound."""
    import hapmoe_milp.search.dp as dp_mod

    real = dp_mod.solve_dp

    def stopped(*args, **kw):
        sol = real(*args, **kw)
        if kw.get("name") == "dp-exact":
            return sol.__class__(sol.solver, "timeout", None, math.inf, math.nan, 0.0)
        return sol

    monkeypatch.setattr(dp_mod, "solve_dp", stopped)
    monkeypatch.setattr(exact._Certificate, "time_for", lambda self, need: False)
    model = tiny_model((0, 1, 1, 1), mtp=1)
    cluster = tiny_cluster(catalog, [("h800", 2, 2.6), ("910b", 2, None)])
    auto = exact.solve(model, cluster, _settings(4), solver="auto", time_limit=60, split_families=True)
    assert auto.plan is not None and auto.status == "feasible"
    assert auto.stats["proved_by"] is None and auto.bound_s != auto.bound_s  # nan: nothing bounded it
