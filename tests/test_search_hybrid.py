"""The solvers on a hybrid (Mamba) model: four layer kinds (M, *, -, E) placed by position.

The unpruned DP is exact (tests/test_search_dp.py checks it against brute force); CP-SAT and the MILP must
reach its optimum on a hybrid instance too, and every plan must re-price through ``estimate`` to the
objective its solver reports.
"""

from __future__ import annotations

import pytest

from hapmoe_milp.config import Settings
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.search import exact
from hapmoe_milp.search.dp import solve_dp
from hapmoe_milp.space import Pruning
from hapmoe_milp.specs.model import ModelSpec, TrainingDefaults
from tests.helpers import tiny_cluster

HYBRID = ModelSpec(
    name="tiny-hybrid",
    num_layers=6,
    hidden_size=512,
    num_attention_heads=4,
    num_query_groups=2,
    vocab_size=4096,
    ffn_hidden_size=1024,
    num_experts=4,
    moe_router_topk=2,
    moe_ffn_hidden_size=1024,
    hybrid_override_pattern="ME*-ME",
    mamba_head_dim=64,
    mamba_num_groups=2,
    mamba_state_dim=64,
    swiglu=False,
    squared_relu=True,
    defaults=TrainingDefaults(seq_length=1024, global_batch_size=4, micro_batch_size=1),
)


@pytest.mark.parametrize(
    "spec", [[("h800", 2, None), ("910b", 2, None)], [("h800", 2, 2.0), ("a100", 2, None)]], ids=["fits", "tight"]
)
def test_exact_solvers_match_unpruned_dp_on_a_hybrid_model(catalog, spec) -> None:
    cluster = tiny_cluster(catalog, spec)
    st = Settings(seq_length=1024, global_batch_size=4, micro_batch_size=1)
    off = Pruning.off()
    ref = solve_dp(HYBRID, cluster, st, family="hetero", pruning=off)
    assert ref.status == "optimal" and ref.plan is not None
    for solver in ("cpsat", "milp"):
        sol = exact.solve(HYBRID, cluster, st, solver=solver, family="hetero", pruning=off, time_limit=60, threads=2)
        assert sol.status == "optimal" and sol.plan is not None
        assert sol.objective_s == pytest.approx(ref.objective_s, rel=1e-4)
        assert estimate(HYBRID, cluster, sol.plan, st).iteration_time_s == pytest.approx(sol.objective_s, rel=1e-9)
    assert estimate(HYBRID, cluster, ref.plan, st).iteration_time_s == pytest.approx(ref.objective_s, rel=1e-9)
