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


def test_search_picks_megatron_fsdp_where_it_is_the_fastest_way_to_fit():
    """Qwen3-30B-A3B on one H100 node: with the distributed optimizer the best plan needs two pipeline
    stages and MoE-block recompute; sharding parameters and gradients too (Megatron-FSDP
    optim_grads_params) fits one stage and is faster. Checked against the best plan searched without FSDP,
    and the FSDP plan's own layout re-priced without FSDP must not fit."""
    cat = Catalog()
    m, c = cat.model("qwen3-30b-a3b"), cat.cluster("8xh100")
    kw = dict(family="megatron", optimizer_offload=False, seq_length=4096, global_batch_size=64)
    plain = api.solve(m, c, **kw)
    both = api.solve(m, c, fsdp_search=True, **kw)
    assert both.plan is not None and both.plan.settings().fsdp == "optim_grads_params"
    assert both.objective_s < plain.objective_s
    est = estimate(m, c, both.plan)
    assert est.fits and est.iteration_time_s == pytest.approx(both.objective_s, rel=1e-9)
    unsharded = both.plan.with_settings(both.plan.settings().with_(fsdp="none"))
    assert not estimate(m, c, unsharded).fits
