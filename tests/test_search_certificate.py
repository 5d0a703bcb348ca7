"""``auto``'s certificate: the bound over two spaces searched apart (``certificate.union``), and the
megatron-only space proved by the unpruned DP at scale."""

from __future__ import annotations

import math

import pytest

from hapmoe_milp.search import exact
from hapmoe_milp.search.certificate import union
from hapmoe_milp.search.dp import solve_dp
from hapmoe_milp.search.solution import Solution
from hapmoe_milp.space import Pruning
from tests.helpers import tiny_cluster, tiny_model
from tests.test_search_exact import _check_plan_objective, _settings

NAN = math.nan


def _sol(status, obj, bound, plan=True, solver="auto"):
    return Solution(solver, status, object() if plan else None, obj, bound, 0.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kept", "other", "status", "bound"),
    [
        # both proved, the other space's optimum above the plan: still optimal, the plan's bound
        (("optimal", 1.0, 1.0), ("optimal", 2.0, 2.0), "optimal", 1.0),
        # the other space only bounded below the plan: not proved over both, its bound counts
        (("optimal", 1.0, 1.0), ("feasible", 2.0, 0.8), "feasible", 0.8),
        # the other space proved empty: it bounds nothing
        (("optimal", 1.0, 1.0), ("infeasible", math.inf, NAN, False), "optimal", 1.0),
        # the other space not bounded at all: no bound over both
        (("optimal", 1.0, 1.0), ("timeout", math.inf, NAN, False), "feasible", NAN),
        # a feasible plan keeps the lesser bound
        (("feasible", 1.0, 0.9), ("feasible", 1.5, 0.95), "feasible", 0.9),
    ],
)
def test_union_bound_holds_over_both_spaces(kept, other, status, bound):
    out = union(_sol(*kept), _sol(*other))
    assert out.status == status
    assert (out.bound_s != out.bound_s) if bound != bound else out.bound_s == bound


def test_union_leaves_dp_answers_alone():
    dp = _sol("feasible", 1.0, NAN, solver="dp")
    assert union(dp, _sol("feasible", 0.5, 0.4, solver="dp")) is dp


def test_auto_proves_a_megatron_only_space_with_the_unpruned_dp(catalog, monkeypatch):
    """At scale (forced) with the megatron family alone (as in the EP-overlap alternative) the unpruned DP
    proves it and the exact backend does not run; the optimum is the unpruned DP's."""
    model = tiny_model((0, 1, 1, 1), mtp=1)
    cluster = tiny_cluster(catalog, [("h800", 2, 2.6), ("910b", 2, None)])
    st_ = _settings(4)
    ref = solve_dp(model, cluster, st_, family="megatron", pruning=Pruning.off())
    ran = []
    real = exact._solve_exact
    monkeypatch.setattr(exact, "_solve_exact", lambda *a, **k: ran.append(1) or real(*a, **k))
    auto = exact.solve(model, cluster, st_, solver="auto", family="megatron", time_limit=60, split_families=True)
    assert auto.status == "optimal" and not ran
    assert auto.objective_s == pytest.approx(ref.objective_s, rel=1e-9)
    assert auto.bound_s <= ref.objective_s * (1 + 1e-9)
    assert auto.stats["proof"]["megatron"]["method"] == "dp-exact" and auto.stats["proved_by"] == "dp-exact"
    _check_plan_objective(auto, model, cluster, st_)
