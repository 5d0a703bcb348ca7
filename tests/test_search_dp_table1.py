"""The product search on HAPMoE's Table 1 scenarios is never worse than the exact optimum of the DP it
replaced.

Today's DP (the reference, ``tests/oracles/dp_reference.py``) searches plain 1F1B plans with
pruning, so its answer can be no better than the optimum of the unpruned plain-1F1B space. That optimum
is computed here at test time (``Pruning.off()``, ``max_vpp=1``; exact, as tests/test_search_dp.py checks
against brute force), on the same cost model, with the optimizer-offload setting ``solve`` ends up with
(offload only when nothing fits without it). The pruned search with interleaving must reach it or beat it.
Both are over the what-if space (``runtime="any"``: the plan families without a runtime's limits), which is
the space this reference DP covers; tests/test_runtimes_search.py checks the runtime-limited searches
against brute force over their own spaces. No objective value is written down here: the cost model's
numbers may change, the relation may not.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from hapmoe_milp.api import make_settings, solve
from hapmoe_milp.search.dp import solve_dp
from hapmoe_milp.space import Pruning

TABLE1 = ["16-1", "16-2", "16-3", "24-1", "24-2", "24-3", "32-1", "32-2", "32-3", "16-1-h", "16-2-h", "16-3-h"]
SCENARIOS = [(m, c) for m in ("mixtral-s", "mixtral-l") for c in TABLE1]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "cluster"), SCENARIOS, ids=[f"{m}-{c}" for m, c in SCENARIOS])
def test_solve_reaches_the_exact_plain_1f1b_optimum(catalog, model, cluster):
    m, c = catalog.model(model), catalog.cluster(cluster)
    st = make_settings(m)
    exact_space = replace(Pruning.off(), max_vpp=1)
    ref = solve_dp(m, c, st, pruning=exact_space)
    if ref.plan is None:
        st = replace(st, optimizer_offload=True)
        ref = solve_dp(m, c, st, pruning=exact_space)
    assert ref.status == "optimal"
    sol = solve(m, c, catalog=catalog, runtime="any")
    assert sol.objective_s <= ref.objective_s * (1 + 1e-9)
    # `solve` re-evaluated the plan through `estimate` under the settings it was found with
    assert sol.plan.predicted["iteration_time_s"] == pytest.approx(sol.objective_s, rel=1e-9)
