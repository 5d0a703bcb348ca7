"""Dense prefix + MTP + VPP together: CP-SAT = MILP = unpruned DP = brute force (issue 19).

Each case has a leading dense block (it must sit in the first rank's first virtual chunk), MTP layers
(in the last rank's last chunk), memory tight enough that the schedule matters, and a micro-batch
count that admits interleaving; each is solved on the what-if space (no runtime) and under runtimes'
rules where a runtime runs VPP: Megatron-LM for the megatron family (FlagScale has no VPP, so its rules
apply to the hetero family beside it). The reference is ``plan_optimum`` (tests/oracles/brute_force.py):
every plan enumerated and priced by ``estimate``, independent of the DP and of the formulation.
"""

from __future__ import annotations

import pytest

from hapmoe_milp.config import Settings
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.plan import check_plan
from hapmoe_milp.runtimes import FLAGSCALE, MEGATRON
from hapmoe_milp.search import exact
from hapmoe_milp.search.dp import solve_dp
from hapmoe_milp.space import Pruning, stage_rule_problems, stage_rules
from tests.helpers import lead_block, tiny_cluster, tiny_model
from tests.oracles.brute_force import plan_optimum

RULES = {"megatron": MEGATRON, "hetero": FLAGSCALE}

CASES = [
    # (layer pattern, MTP layers, cluster: (device, devices, memory GiB or None), global batch, family, rules)
    ((0, 1, 1, 1, 1), 1, [("h800", 2, 2.6), ("a100", 2, None)], 8, "megatron", False),
    ((0, 1, 1, 1, 1), 1, [("h800", 2, 2.6), ("a100", 2, None)], 8, "both", True),
    ((0, 0, 1, 1, 1, 1), 1, [("a100", 4, 2.5)], 8, "megatron", False),
    ((0, 0, 1, 1, 1, 1), 1, [("a100", 4, 2.5)], 8, "megatron", True),
    ((0, 0, 1, 1, 1, 1), 1, [("a100", 4, 2.4)], 8, "megatron", True),  # memory binds: plain 1F1B wins
    ((0, 0, 1, 1, 1, 1), 1, [("h100", 2, 2.6), ("a100", 2, 2.6)], 8, "megatron", True),
    ((0, 1, 1, 1, 1, 1), 2, [("h800", 2, None), ("a100", 2, 3.0)], 8, "megatron", True),
]


def _settings(gbs: int) -> Settings:
    return Settings(seq_length=1024, global_batch_size=gbs, micro_batch_size=1, dispatcher="alltoall")


@pytest.fixture(scope="module")
def solved(catalog):
    out = []
    for pattern, mtp, spec, gbs, family, rules in CASES:
        model = tiny_model(pattern, mtp=mtp)
        cluster = tiny_cluster(catalog, spec)
        st = _settings(gbs)
        runtimes = RULES if rules else None
        expected, plan = plan_optimum(model, cluster, st, family, runtimes)
        dp = solve_dp(model, cluster, st, family=family, pruning=Pruning.off(), runtimes=runtimes)
        kw = {"family": family, "pruning": exact.EXACT_PRUNING, "runtimes": runtimes, "threads": 2}
        ex = {s: exact.solve(model, cluster, st, solver=s, **kw) for s in ("cpsat", "milp")}
        out.append((model, cluster, st, runtimes, expected, plan, dp, ex))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(CASES)))
def test_exact_and_unpruned_dp_equal_brute_force(solved, i):
    model, cluster, st, runtimes, expected, plan, dp, ex = solved[i]
    assert plan is not None, "every case has a plan"
    assert dp.status == "optimal"
    assert dp.objective_s == pytest.approx(expected, rel=1e-9)
    for name, sol in ex.items():
        assert sol.status == "optimal", (name, sol.message)
        assert sol.objective_s == pytest.approx(expected, rel=1e-6), name
        assert sol.bound_s <= expected * (1 + 1e-6), name
    for sol in (dp, *ex.values()):
        check_plan(sol.plan, model, cluster)
        assert estimate(model, cluster, sol.plan, st).iteration_time_s == pytest.approx(sol.objective_s, rel=1e-9)
        rt = (runtimes or {}).get(sol.plan.family)
        if rt is not None:  # a plan for a runtime meets its rules between stages and its VPP support
            assert stage_rule_problems(stage_rules(rt, model, st), sol.plan.stages) == []
            assert sol.plan.vpp == 1 or rt.vpp


@pytest.mark.slow
def test_cases_combine_prefix_mtp_and_interleaving(solved):
    """Not vacuous: every model has a dense prefix and MTP, the brute-force optimum interleaves on some
    case with the runtimes' rules and on some without (so the VPP path is what is checked), and on one
    the memory leaves plain 1F1B the best."""
    for model, *_ in solved:
        assert lead_block(model) and model.mtp_num_layers
    inter = {runtimes is not None for _m, _c, _s, runtimes, _e, plan, _d, _x in solved if plan.vpp > 1}
    assert inter == {True, False}
    assert any(plan.vpp == 1 for *_, plan, _d, _x in solved)
