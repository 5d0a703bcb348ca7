"""A search for a runtime visits only plans it runs: the DP and both exact backends against brute force
over FlagScale's space, with its rules between stages (mesh runs, edge TP/DP) checked by the same
functions ``validate`` uses."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hapmoe_milp.config import Settings
from hapmoe_milp.instance import build_instances
from hapmoe_milp.plan import Plan, Stage
from hapmoe_milp.runtimes import FLAGSCALE, MEGATRON, MINDSPEED
from hapmoe_milp.search.dp import solve_dp
from hapmoe_milp.space import Pruning, StageRules, mesh_runs, stage_rule_problems, stage_rules
from tests.helpers import tiny_cluster, tiny_model
from tests.oracles.brute_force import plan_optimum

ST = Settings(seq_length=1024, global_batch_size=4, micro_batch_size=1, dispatcher="alltoall")


def brute_force(model, cluster, runtime, family: str = "hetero") -> tuple[float, Plan | None]:
    """Every plan of the runtime's instances of ``family`` that meets its rules between stages and its
    last-stage layer minimum, scored by ``estimate``: the shared whole-plan oracle."""
    return plan_optimum(model, cluster, ST, family, runtimes={family: runtime})  # type: ignore[return-value]


CASES = [
    # (layer pattern, mtp, tied embeddings, cluster spec)
    ((1, 1, 1, 1), 0, False, [("h800", 2, None), ("910b", 2, None)]),
    ((0, 1, 1, 1), 1, False, [("h800", 2, 3.0), ("910b", 2, 3.0)]),
    ((1, 1, 1, 1), 0, True, [("a100", 2, None), ("v100", 2, None)]),
    # uneven inventory: the free optimum leaves one-stage meshes after the first (FlagScale's offset rule binds)
    ((0, 1, 1, 1), 1, False, [("h800", 1, None), ("910b", 3, None)]),
]


@pytest.mark.parametrize(("pattern", "mtp", "tied", "spec"), CASES)
def test_flagscale_search_equals_brute_force(catalog, pattern, mtp, tied, spec):
    model = tiny_model(pattern, mtp=mtp)
    if tied:
        model = replace(model, untie_embeddings_and_output_weights=False)
    cluster = tiny_cluster(catalog, spec)
    expected, plan = brute_force(model, cluster, FLAGSCALE)
    assert plan is not None
    dp = solve_dp(model, cluster, ST, family="hetero", pruning=Pruning.off(), runtimes={"hetero": FLAGSCALE})
    assert dp.plan is not None and dp.plan.runtime == "flagscale"
    assert dp.objective_s == pytest.approx(expected, rel=1e-9)
    assert stage_rule_problems(stage_rules(FLAGSCALE, model, ST), dp.plan.stages) == []
    from hapmoe_milp.search import exact

    for solver in ("cpsat", "milp"):
        ex = exact.solve(
            model, cluster, ST, solver=solver, family="hetero", pruning=Pruning.off(), runtimes={"hetero": FLAGSCALE}
        )
        assert ex.plan is not None
        assert ex.objective_s == pytest.approx(expected, rel=1e-6), solver
        assert stage_rule_problems(stage_rules(FLAGSCALE, model, ST), ex.plan.stages) == []


def test_flagscale_one_mesh_plans_equal_brute_force(catalog):
    """A FlagScale search covers one-mesh (megatron-family) plans under its rules: device types grouped,
    two stages per later mesh, no VPP."""
    model = tiny_model((1, 1, 1, 1))
    cluster = tiny_cluster(catalog, [("h800", 2, None), ("910b", 2, None)])
    expected, plan = brute_force(model, cluster, FLAGSCALE, family="megatron")
    assert plan is not None
    dp = solve_dp(model, cluster, ST, family="megatron", pruning=Pruning.off(), runtimes={"megatron": FLAGSCALE})
    assert dp.objective_s == pytest.approx(expected, rel=1e-9)
    assert dp.plan.vpp == 1 and stage_rule_problems(stage_rules(FLAGSCALE, model, ST), dp.plan.stages) == []
    from hapmoe_milp.search import exact

    ex = exact.solve(
        model, cluster, ST, solver="cpsat", family="megatron", pruning=Pruning.off(), runtimes={"megatron": FLAGSCALE}
    )
    assert ex.objective_s == pytest.approx(expected, rel=1e-6)


def test_the_rules_bind_on_some_case(catalog):
    """The cases are not vacuous: without FlagScale's rules between stages a faster plan breaks one."""
    bound = 0
    for pattern, mtp, tied, spec in CASES:
        model = tiny_model(pattern, mtp=mtp)
        if tied:
            model = replace(model, untie_embeddings_and_output_weights=False)
        cluster = tiny_cluster(catalog, spec)
        free = solve_dp(model, cluster, ST, family="hetero", pruning=Pruning.off())
        rules = stage_rules(FLAGSCALE, model, ST)
        if free.plan is not None and stage_rule_problems(rules, free.plan.stages):
            bound += 1
    assert bound >= 1


def test_mesh_runs_group_identical_neighbours():
    from hapmoe_milp.config import ParallelConfig

    a, b = ParallelConfig(tp=2, dp=2), ParallelConfig(tp=1, dp=4)
    stages = [Stage("h800", a, 0, 2), Stage("h800", a, 2, 4), Stage("910b", b, 4, 6), Stage("h800", a, 6, 8)]
    assert mesh_runs(stages) == [(0, 2), (2, 1), (3, 1)]
    rules = StageRules(mesh_min_stages=2)
    assert [p[0] for p in stage_rule_problems(rules, stages)] == ["mesh_min_stages", "mesh_min_stages"]
    assert stage_rule_problems(rules, stages[:2]) == []  # one mesh: the first may hold any number


def test_stage_rules_follow_the_runtime(catalog):
    dsv3 = catalog.model("deepseek-v3")  # MTP shares the embedding
    mix = catalog.model("mixtral-s")  # untied, no MTP
    assert stage_rules(FLAGSCALE, dsv3) == StageRules(edge_tp=True, edge_dp=True, mesh_min_stages=2, types_grouped=True)
    assert stage_rules(FLAGSCALE, mix) == StageRules(mesh_min_stages=2, types_grouped=True)
    assert stage_rules(FLAGSCALE, dsv3, Settings(distributed_optimizer=False)).edge_dp is False
    assert not stage_rules(MEGATRON, dsv3).active  # one mesh: nothing left between stages
    assert not stage_rules(None, dsv3).active


def test_mindspeed_instances_have_no_vpp_and_a_decoder_layer_beside_mtp(catalog):
    model = tiny_model((0, 1, 1, 1), mtp=1)
    cluster = tiny_cluster(catalog, [("910b", 4, None)])
    insts = list(build_instances(model, cluster, ST, "megatron", Pruning(), max_vpp=4, runtime=MINDSPEED))
    assert insts and all(i.vpp == 1 for i in insts)
    assert all(i.stage_min_layers[1] == 2 for i in insts)
    free = list(build_instances(model, cluster, ST, "megatron", Pruning(), max_vpp=4))
    assert any(i.vpp > 1 for i in free) and all(i.stage_min_layers[1] == 1 for i in free if i.vpp == 1)
