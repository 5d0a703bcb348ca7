"""EP-communication overlap is a searched choice of ``solve``: unless the caller sets it, MoE plans are
searched without and with ``--overlap-moe-expert-parallel-comm`` and the faster is kept; with it on, only
plans Megatron can overlap are searched (EP > 1, no full recompute, virtual stages when PP > 1: the export
rule ``rule_ep_overlap_requirements``, restated in ``instance._ep_overlap_options``)."""

from __future__ import annotations

import pytest

from hapmoe_milp import api
from hapmoe_milp.export.validate import validate
from hapmoe_milp.search import floor
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
    ("model", "cluster", "runtime"),
    [("qwen3-30b-a3b", "16xh100", "auto"), ("mixtral-s", "16-1-h", "auto"), ("mixtral-s", "32-1", "any")],
)
def test_overlap_plans_are_ones_megatron_can_overlap(model, cluster, runtime):
    # 32-1 mixes H800 and 910B: only the what-if space puts one-mesh plans with VPP on it
    sol = _solve(model, cluster, overlap_ep_comm=True, family="megatron", runtime=runtime)
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


@pytest.mark.parametrize("cluster", ["16x910b", "32-1"])
def test_overlap_is_not_searched_where_upstream_megatron_does_not_run_the_plan(cluster):
    """MindSpeed-LLM's Megatron core_v0.12.1 has no --overlap-moe-expert-parallel-comm, and the cross-vendor
    runtime (FlagScale) is not upstream Megatron-LM: left unset, the setting stays off there."""
    sol = _solve("mixtral-s", cluster)
    assert sol.plan is not None and sol.plan.runtime in ("mindspeed", "flagscale")
    assert sol.plan.settings().overlap_ep_comm is False
    # in the what-if space (Megatron's rules on every stage) the same search does pick it
    what_if = _solve("mixtral-s", cluster, runtime="any")
    assert what_if.plan is not None and what_if.plan.settings().overlap_ep_comm is True


def test_no_overlap_search_after_the_plain_search_proved_nothing_fits(monkeypatch):
    """Overlap plans are a subset of the options at no less memory: once the plain search proves that
    nothing fits, the overlap search is skipped (the offload retry still runs). The memory floor would
    prove this pair before any search (tests/test_search_floor.py), so it is left out here."""
    monkeypatch.setattr(floor, "prove_no_fit", lambda *a, **kw: None)
    calls = []
    real = api._run_solver

    def counting(m, c, st, *args, **kw):
        sol = real(m, c, st, *args, **kw)
        calls.append((st.optimizer_offload, st.overlap_ep_comm, sol.status))
        return sol

    monkeypatch.setattr(api, "_run_solver", counting)
    with pytest.raises(api.InfeasibleError):
        _solve("deepseek-v3", "16-1-h")
    assert calls and all(status == "infeasible" for *_, status in calls)
    assert not any(overlap for _, overlap, _ in calls)
    assert {offload for offload, *_ in calls} == {False, True}
