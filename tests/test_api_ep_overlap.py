"""EP-communication overlap is a searched choice of ``solve``: unless the caller sets it, MoE plans are
searched without and with ``--overlap-moe-expert-parallel-comm`` and the faster is kept; with it on, only
plans Megatron can overlap are searched (EP > 1, no full recompute, virtual stages when PP > 1: the export
rule ``rule_ep_overlap_requirements``, restated in ``instance._ep_overlap_options``)."""

from __future__ import annotations

import pytest

from hapmoe_milp import api
from hapmoe_milp.export.validate import validate
from hapmoe_milp.specs import Catalog

CAT = Catalog()


def _solve(model: str, cluster: str, **kw):
    # Mixtral-S defaults to the all-gather dispatcher, which Megatron does not overlap: use all-to-all
    kw.setdefault("dispatcher", "alltoall")
    return api.solve(model, cluster, time_limit=60, catalog=CAT, **kw)


@pytest.mark.parametrize(("model", "cluster"), [("qwen3-30b-a3b", "16xh100"), ("mixtral-s", "16-1-h")])
def test_unset_overlap_keeps_the_faster_of_both_searches(model, cluster):
    auto = _solve(model, cluster)
    off = _solve(model, cluster, overlap_ep_comm=False)
    on = _solve(model, cluster, overlap_ep_comm=True)
    best = min(off.objective_s, on.objective_s)
    assert auto.objective_s == pytest.approx(best, rel=1e-12)
    want = on.objective_s < off.objective_s
    assert auto.plan is not None and auto.plan.settings().overlap_ep_comm is want


@pytest.mark.parametrize(
    ("model", "cluster"), [("qwen3-30b-a3b", "16xh100"), ("mixtral-s", "16-1-h"), ("mixtral-s", "32-1")]
)
def test_overlap_plans_are_ones_megatron_can_overlap(model, cluster):
    sol = _solve(model, cluster, overlap_ep_comm=True, family="megatron")
    plan = sol.plan
    assert plan is not None and plan.settings().overlap_ep_comm
    assert all(s.cfg.ep > 1 and s.recompute != "full" for s in plan.stages)
    assert plan.pp == 1 or plan.vpp > 1
    rules = {v.rule for v in validate(plan, CAT.model(model), CAT.cluster(cluster), "megatron")}
    assert "rule_ep_overlap_requirements" not in rules


def test_dense_models_and_explicit_choices_are_not_searched_both_ways():
    dense = _solve("llama-2-7b", "8xh100")
    gather = _solve("mixtral-s", "16-1-h", dispatcher="allgather")
    assert gather.plan is not None and gather.plan.settings().overlap_ep_comm is False
    assert dense.plan is not None and dense.plan.settings().overlap_ep_comm is False
    off = _solve("qwen3-30b-a3b", "16xh100", overlap_ep_comm=False)
    assert off.plan is not None and off.plan.settings().overlap_ep_comm is False
