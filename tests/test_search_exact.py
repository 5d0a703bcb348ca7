"""CP-SAT and MILP against the unpruned DP: same optimum, valid bounds, same infeasibility message.

The DP with every pruning switch off is exact over the instance (tests/test_search_dp.py checks it
against brute force), so on random small instances all three must agree -- CP-SAT within the scaling
tolerance it states, the MILP within its relative gap -- and every plan must re-evaluate, through the
independent `cost.estimate` path, to exactly the objective its solver reports.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hapmoe_milp.api import solve as api_solve
from hapmoe_milp.compare import DP_EXACT_MAX_WORK, compare_solvers, dp_exact_work
from hapmoe_milp.config import Settings
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.errors import InfeasibleError
from hapmoe_milp.instance import build_instances
from hapmoe_milp.plan import check_plan
from hapmoe_milp.search import cpsat, exact, milp
from hapmoe_milp.search.dp import solve_dp
from hapmoe_milp.space import Pruning
from tests.conftest import tiny_cluster, tiny_model

# the exact solvers search plain 1F1B plans (no VPP instances yet), so the DP is compared on that space
OFF = replace(Pruning.off(), max_vpp=1)


def _settings(gbs: int = 4) -> Settings:
    return Settings(seq_length=1024, global_batch_size=gbs, micro_batch_size=1, dispatcher="alltoall")


def _check_plan_objective(sol, model, cluster, st) -> None:
    """The plan is valid and `estimate` reproduces the reported objective (closed form, to 1e-9)."""
    assert sol.plan is not None
    check_plan(sol.plan, model, cluster)
    est = estimate(model, cluster, sol.plan, st)
    assert est.fits
    assert est.iteration_time_s == pytest.approx(sol.objective_s, rel=1e-9)


def _assert_agree(model, cluster, st, family: str = "both", time_limit: float | None = 60) -> None:
    ref = solve_dp(model, cluster, st, family=family, pruning=OFF)
    cp = exact.solve(model, cluster, st, solver="cpsat", family=family, pruning=OFF, time_limit=time_limit, threads=2)
    mi = exact.solve(model, cluster, st, solver="milp", family=family, pruning=OFF, time_limit=time_limit, threads=2)
    if ref.plan is None:
        assert ref.status == "infeasible"
        assert cp.status == "infeasible" and cp.plan is None
        assert mi.status == "infeasible" and mi.plan is None
        assert cp.message == mi.message and cp.message
        return
    opt = ref.objective_s
    assert ref.status == "optimal"
    _check_plan_objective(ref, model, cluster, st)
    # CP-SAT: the plan is within the stated scaling tolerance of the optimum, the bound below it
    assert cp.status == "optimal", cp
    tol = cp.stats["tolerance_s"]
    assert tol <= 1e-5 * opt  # the automatic time unit keeps the scaling error tiny
    assert opt * (1 - 1e-9) <= cp.objective_s <= opt + tol + 1e-12
    assert cp.bound_s <= opt * (1 + 1e-9)
    assert cp.bound_s >= opt - tol - 1e-12
    _check_plan_objective(cp, model, cluster, st)
    # MILP: real-valued model, optimal within its relative gap
    assert mi.status == "optimal", mi
    gap = milp.DEFAULT_GAP
    assert opt * (1 - 1e-9) <= mi.objective_s <= opt * (1 + gap) + 1e-12
    assert mi.bound_s <= opt * (1 + 1e-9)
    assert mi.bound_s >= opt * (1 - 2 * gap) - 1e-12
    _check_plan_objective(mi, model, cluster, st)


CASES = [
    # (layer pattern, cluster: (device, devices, memory GiB or None), family)
    ((1, 0, 1), [("h800", 2, None), ("910b", 2, None)], "both"),
    ((0, 1, 1, 1), [("h800", 2, 3.0), ("mi300x", 1, 3.0)], "hetero"),
    ((1, 1, 0, 1, 1), [("a100", 2, 2.6), ("v100", 1, None)], "both"),
    ((1, 1, 1, 1, 1, 1), [("h800", 4, 2.5), ("910b", 2, 3.0)], "hetero"),
    ((0, 1, 1, 0, 1), [("h100", 1, 3.0), ("a40", 1, None), ("910b", 1, 3.0)], "hetero"),
]


@pytest.mark.parametrize(("pattern", "spec", "family"), CASES)
def test_exact_solvers_match_unpruned_dp(catalog, pattern, spec, family):
    model = tiny_model(pattern)
    cluster = tiny_cluster(catalog, spec)
    _assert_agree(model, cluster, _settings(), family)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    pattern=st.lists(st.integers(0, 1), min_size=2, max_size=6).filter(any),
    sizes=st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2), (1, 1, 1), (2, 1, 1)]),
    mem=st.sampled_from([None, 2.2, 3.0]),
    types=st.sampled_from([("h800", "910b", "a100"), ("a100", "mi300x", "v100"), ("h100", "a40", "910b")]),
    gbs=st.sampled_from([2, 4]),
    family=st.sampled_from(["both", "hetero"]),
)
def test_exact_solvers_match_unpruned_dp_random(catalog, pattern, sizes, mem, types, gbs, family):
    """2-3 device types, the first with its memory cut so that it binds on some draws."""
    spec = [(types[j], n, mem if j == 0 else None) for j, n in enumerate(sizes)]
    model = tiny_model(tuple(pattern))
    cluster = tiny_cluster(catalog, spec)
    _assert_agree(model, cluster, _settings(gbs), family)


@pytest.mark.slow
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    pattern=st.lists(st.integers(0, 1), min_size=6, max_size=10).filter(any),
    mem=st.sampled_from([None, 2.5, 4.0]),
    third=st.booleans(),
)
def test_exact_solvers_match_unpruned_dp_larger(catalog, pattern, mem, third):
    spec = [("h800", 4, mem), ("910b", 2, None)] + ([("a100", 1, None)] if third else [])
    model = tiny_model(tuple(pattern), hidden=1024, heads=8)
    cluster = tiny_cluster(catalog, spec)
    _assert_agree(model, cluster, _settings(8), "hetero", time_limit=300)


def test_infeasible_instances_give_the_same_message_from_every_solver(catalog):
    model = tiny_model((1, 1, 1, 1))
    cluster = tiny_cluster(catalog, [("h800", 1, 1.0), ("910b", 1, 1.0)])
    msgs = {}
    for solver in ("dp", "cpsat", "milp"):
        with pytest.raises(InfeasibleError) as exc:
            api_solve(model, cluster, solver, settings=_settings(), pruning=OFF, optimizer_offload=False)
        msgs[solver] = str(exc.value)
        assert exc.value.constraint == "memory"
    assert len(set(msgs.values())) == 1
    assert "memory:" in msgs["cpsat"] and "GiB" in msgs["cpsat"]
    # the exact solvers say the same thing directly, without the API
    direct = exact.solve(model, cluster, _settings(), solver="milp", pruning=OFF)
    assert direct.status == "infeasible" and direct.message == msgs["milp"]


def _dp_plan_and_sub(catalog, pattern=(0, 1, 1, 1, 1), spec=(("h800", 2, 3.0), ("910b", 2, None))):
    model = tiny_model(pattern)
    cluster = tiny_cluster(catalog, list(spec))
    st_ = _settings()
    ref = solve_dp(model, cluster, st_, family="hetero", pruning=OFF)
    for inst in build_instances(model, cluster, st_, "hetero", OFF):
        for sub in exact.submodels(inst):
            a = exact.assignment_of(sub, ref.plan)
            if a is not None:
                return model, cluster, st_, ref, sub, a
    raise AssertionError("the DP plan is in no sub-problem")


def test_dp_plan_is_a_solution_of_both_models_with_the_same_cost(catalog):
    """Fixing every variable to the DP plan's values is feasible in both models and prices it the same."""
    _, _, _, ref, sub, a = _dp_plan_and_sub(catalog)
    res = cpsat.solve_sub(sub, hint=a, fix_hint=True, threads=1)
    assert res.status == "optimal" and res.assignment == a
    scaled = res.stats["model_objective"] * res.stats["resolution_s"]
    assert ref.objective_s - res.stats["tolerance_s"] <= scaled <= ref.objective_s * (1 + 1e-12)
    res_m = milp.solve_sub(sub, hint=a, check_hint=True, threads=1)
    assert res_m.stats["hint_violations"] == []
    assert res_m.status == "optimal", res_m.stats


def test_milp_rows_have_unique_readable_names(catalog):
    import pulp

    sub = _dp_plan_and_sub(catalog)[4]
    captured = {}
    real = pulp.LpProblem.solve

    def spy(self, solver=None, **kw):  # type: ignore[no-untyped-def]
        captured["prob"] = self
        return real(self, solver, **kw)

    pulp.LpProblem.solve = spy
    try:
        milp.solve_sub(sub, threads=1)
    finally:
        pulp.LpProblem.solve = real
    names = [name for name, _ in milp._rows(captured["prob"])]
    assert len(names) == len(set(names))
    assert any(n.startswith("mem_k1_") and "_TP" in n for n in names)
    for family in ("one_option_k1", "inventory_", "time_k1", "tau_max_k1", "sync_k1_p0", "count_split_k1_"):
        assert any(n.startswith(family) for n in names), family
    # the solution breaks nothing; knocking the last stage's time to zero breaks exactly its time row
    prob = captured["prob"]
    assert milp.violated_rows(prob) == []
    tau1 = next(v for v in prob.variables() if v.name == "tau_k1")
    tau1.varValue = 0.0
    assert "time_k1" in milp.violated_rows(prob)


def test_warm_start_and_auto(catalog):
    model = tiny_model((0, 1, 1, 1, 1, 1))
    cluster = tiny_cluster(catalog, [("h800", 2, 3.0), ("910b", 2, None)])
    st_ = _settings()
    ref = solve_dp(model, cluster, st_, family="hetero", pruning=OFF)
    pruned = solve_dp(model, cluster, st_, family="hetero")
    for solver in ("cpsat", "milp"):
        sol = exact.solve(model, cluster, st_, solver=solver, family="hetero", pruning=OFF, hint=pruned, threads=2)
        assert sol.stats["warm_start"] is True
        assert sol.status == "optimal"
        assert sol.objective_s <= pruned.objective_s * (1 + 1e-12)
        assert sol.objective_s == pytest.approx(ref.objective_s, rel=1e-5)
    auto = exact.solve(model, cluster, st_, solver="auto", family="hetero", time_limit=60, threads=2)
    assert auto.solver == "auto" and auto.status == "optimal"
    assert auto.objective_s <= pruned.objective_s * (1 + 1e-12)
    assert auto.stats["dp_objective_s"] == pytest.approx(pruned.objective_s)
    assert auto.bound_s <= ref.objective_s * (1 + 1e-9)
    _check_plan_objective(auto, model, cluster, st_)
    # through the API, as the CLI calls it
    via_api = api_solve(model, cluster, "auto", family="hetero", settings=st_, time_limit=60)
    assert via_api.plan is not None and via_api.objective_s == pytest.approx(auto.objective_s, rel=1e-9)


def test_time_limit_keeps_the_bound_valid(catalog):
    model = tiny_model((0, 1, 1, 1, 1, 1, 1, 1), hidden=1024, heads=8)
    cluster = tiny_cluster(catalog, [("h800", 4, None), ("910b", 4, None)])
    st_ = _settings(8)
    sol = exact.solve(model, cluster, st_, solver="cpsat", family="hetero", pruning=OFF, time_limit=1.0, threads=2)
    assert sol.status in ("optimal", "feasible", "timeout")
    assert sol.wall_s < 10
    pruned = solve_dp(model, cluster, st_, family="hetero")
    if sol.plan is not None:
        _check_plan_objective(sol, model, cluster, st_)
        assert sol.bound_s <= sol.objective_s
    # the bound may be weak after one second, but it must never exceed a feasible plan's objective
    assert sol.bound_s <= pruned.objective_s * (1 + 1e-9)


def test_compare_reports_agreement_and_diffs(catalog):
    model = tiny_model((1, 1, 0, 1, 1))
    cluster = tiny_cluster(catalog, [("a100", 2, 2.6), ("v100", 1, None)])
    rep = compare_solvers(model, cluster, _settings(), time_limit=60, family="both", threads=2)
    by = {r["solver"]: r for r in rep["results"]}
    assert set(by) == {"dp", "dp-exact", "cpsat", "milp"}
    assert rep["agree"] is True and rep["consistent"] is True
    assert by["dp-exact"]["status"] == "optimal"
    assert rep["dp_gap"] >= 0
    for name, rows in rep["diffs"].items():
        assert name in by and rows and {"stage", "reference", "other"} <= set(rows[0])


def test_compare_skips_the_unpruned_dp_when_too_large(catalog):
    from hapmoe_milp.api import make_settings

    model = catalog.model("mixtral-s")
    cluster = catalog.cluster("16-1")
    st_ = make_settings(model)
    work = dp_exact_work(model, cluster, st_, "hetero")
    assert 1e7 < work < DP_EXACT_MAX_WORK  # Table 1 sizes are within reach of the unpruned DP
    rep = compare_solvers(
        model, cluster, st_, solvers=("dp-exact",), family="hetero", time_limit=5, dp_exact_max_work=work / 2
    )
    assert rep["results"][0]["status"] == "skipped" and "too large" in rep["results"][0]["message"]
    assert rep["agree"] is None


def test_unknown_solver_and_backend_are_user_errors(catalog):
    from hapmoe_milp.errors import SolverError

    model = tiny_model((1, 1))
    cluster = tiny_cluster(catalog, [("h800", 1, None)])
    with pytest.raises(SolverError):
        exact.solve(model, cluster, _settings(), solver="gurobi")
    with pytest.raises(SolverError):
        exact.solve(model, cluster, _settings(), solver="milp", backend="gurobi", pruning=OFF)


def test_cbc_backend_agrees(catalog):
    model = tiny_model((1, 0, 1))
    cluster = tiny_cluster(catalog, [("h800", 2, None), ("910b", 2, None)])
    st_ = _settings()
    ref = solve_dp(model, cluster, st_, pruning=OFF)
    sol = exact.solve(model, cluster, st_, solver="milp", backend="cbc", pruning=OFF, time_limit=60)
    assert sol.status == "optimal"
    assert sol.objective_s == pytest.approx(ref.objective_s, rel=1e-6)
    assert not math.isnan(sol.bound_s) and sol.bound_s <= ref.objective_s * (1 + 1e-9)


@pytest.mark.parametrize("solver", ["cpsat", "milp"])
def test_one_model_per_instance_with_group_booleans(catalog, solver):
    """``split='instance'`` puts every group key of an instance in one model with selection booleans."""
    model = tiny_model((1, 1, 0, 1))
    cluster = tiny_cluster(catalog, [("h800", 2, 3.0), ("910b", 2, None)])
    st_ = _settings()
    ref = solve_dp(model, cluster, st_, pruning=OFF)
    sol = exact.solve(model, cluster, st_, solver=solver, pruning=OFF, split="instance", threads=2)
    assert sol.status == "optimal"
    n_inst = sum(1 for fam in ("megatron", "hetero") for _ in build_instances(model, cluster, st_, fam, OFF))
    assert sol.stats["subproblems"] <= n_inst
    assert sol.objective_s == pytest.approx(ref.objective_s, rel=1e-5)
    _check_plan_objective(sol, model, cluster, st_)
