"""The search picks a module-level recompute bundle when that is the fastest way to fit.

Moonlight-16B-A3B (MLA, shared experts) at 16K tokens on one H100 node: nothing fits without recompute, and
recomputing the GEMM-only modules (``sel-mlp``: layernorm, moe_act, mla_up_proj, mlp, shared_experts) fits
faster than full recompute. The check is independent of the search: the same layout is re-priced by
``estimate`` at every rung of the ladder.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from hapmoe_milp import api
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.specs import Catalog


def test_search_picks_module_level_recompute_where_it_is_fastest_to_fit():
    cat = Catalog()
    m, c = cat.model("moonlight-16b-a3b"), cat.cluster("8xh100")
    sol = api.solve(m, c, family="megatron", optimizer_offload=False, seq_length=16384, global_batch_size=64)
    plan = sol.plan
    assert plan is not None
    levels = {s.recompute for s in plan.stages}
    assert levels == {"sel-mlp"}
    at = {}
    for lv in ("none", "selective", "sel-mlp", "sel-moe", "full"):
        p = replace(plan, stages=tuple(replace(s, recompute=lv) for s in plan.stages))
        at[lv] = estimate(m, c, p)
    assert not at["none"].fits and not at["selective"].fits  # the cheaper rungs do not fit this layout
    assert at["sel-mlp"].fits and at["full"].fits
    assert at["sel-mlp"].iteration_time_s < at["full"].iteration_time_s
    assert sol.objective_s == pytest.approx(at["sel-mlp"].iteration_time_s, rel=1e-9)
