"""The DP under a clock: the soft "plan by" deadline, and the level kernels' shortcuts checked against
their plain restatement on a real search (a cross-vendor cluster, so FlagScale's stage rules apply)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from hapmoe_milp.config import Settings
from hapmoe_milp.search import dp_levels, dp_tables
from hapmoe_milp.search.dp import solve_dp
from hapmoe_milp.search.dp_tables import Clock
from hapmoe_milp.specs import Catalog
from tests.helpers import StopAfter, count_pricing, tiny_cluster, tiny_model


@pytest.fixture(scope="module")
def case():
    catalog = Catalog()
    model = tiny_model((0, 1, 1, 1, 1, 1), hidden=1024, heads=8)
    cluster = tiny_cluster(catalog, [("h800", 4, None), ("910b", 4, None)])
    st = Settings(seq_length=2048, global_batch_size=16, micro_batch_size=1, dispatcher="alltoall")
    return model, cluster, st


def test_soft_deadline_stops_only_a_search_without_a_plan():
    past = time.perf_counter() - 1.0
    assert Clock(soft=past, found=lambda: False).passed()
    assert not Clock(soft=past, found=lambda: True).passed()
    assert not Clock(soft=time.perf_counter() + 60, found=lambda: False).passed()
    assert Clock(wall=past, soft=past, found=lambda: True).passed()  # the hard limit still holds


def test_no_plan_by_the_soft_deadline_is_a_timeout_not_a_proof(case):
    model, cluster, st = case
    full = solve_dp(model, cluster, st)
    assert full.plan is not None
    early = solve_dp(model, cluster, st, plan_by=0.0)
    assert early.plan is None and early.status == "timeout"
    assert early.stats["no_plan_by_s"] == 0.0 and early.stats["stopped_by"] == "time"
    # a deadline the search meets changes nothing
    late = solve_dp(model, cluster, st, plan_by=1e6)
    assert late.plan == full.plan and late.objective_s == full.objective_s and late.status == full.status
    assert "no_plan_by_s" not in late.stats


def _rules_plain(batch, lv, S, row, grp, s):
    """The stage rules written out over every pair (the form before the per-state shortcut)."""
    mm = batch.mesh_min[grp]
    et, ed = batch.edge_tp[grp], batch.edge_dp[grp]
    prev = lv.mesh[S]
    closes = (prev >= 0) & (batch.mesh[row] != prev)
    ok = ~((mm > 1) & closes & (lv.run[S] < mm))
    first = s == 0
    root = lv.nd[S] < 0
    last_tp = np.where(root, batch.tp[row], lv.etp[S])
    ldp = np.maximum(np.where(root, batch.dp[row], lv.edp[S]), 1)
    ok &= ~(first & et & (batch.tp[row] != last_tp))
    ok &= ~(first & ed & (batch.dp[row] % ldp != 0) & (ldp % np.maximum(batch.dp[row], 1) != 0))
    return ok


def test_kernel_shortcuts_equal_their_plain_form(case, monkeypatch):
    """``_rest`` evaluated once per distinct (group, start, devices left, stage size) equals it per pair
    (values and counts), and the stage rules checked on the pairs they constrain equal the rules over all
    pairs; the search they serve keeps its plan."""
    model, cluster, st = case
    calls = {"rest": 0, "rules": 0}
    real_rest, real_rules = dp_levels._rest, dp_levels._stage_rules_ok

    def rest(batch, k, grp, s, rem, gsz, bd, cnt):
        before = cnt.memory_bound
        out = real_rest(batch, k, grp, s, rem, gsz, bd, cnt)
        ok, rsum, rmax, n_mem = dp_tables.rest_unique(batch, k, grp, s, rem, gsz, bd)
        assert np.array_equal(out[0], ok)
        np.testing.assert_array_equal(out[1], rsum)
        np.testing.assert_array_equal(out[2], rmax)
        assert cnt.memory_bound - before == int(n_mem.sum())
        calls["rest"] += 1
        return out

    def rules(batch, lv, S, row, grp, s):
        out = real_rules(batch, lv, S, row, grp, s)
        if out is not None:
            assert np.array_equal(out, _rules_plain(batch, lv, S, row, grp, s))
            calls["rules"] += 1
        return out

    monkeypatch.setattr(dp_levels, "_rest", rest)
    monkeypatch.setattr(dp_levels, "_stage_rules_ok", rules)
    from hapmoe_milp.runtimes import RUNTIMES

    sol = solve_dp(model, cluster, st, family="hetero", runtimes={"hetero": RUNTIMES["flagscale"]})
    assert sol.plan is not None and math.isfinite(sol.objective_s)
    assert calls["rest"] > 0 and calls["rules"] > 0


@pytest.mark.parametrize(
    ("has_plan", "left_s", "price_s", "stops"),
    [
        (True, 0.05, 0.3, True),  # a plan in hand, the next pricing would run past the limit
        (True, 5.0, 0.3, False),  # time enough to price the next step
        (False, 0.05, 0.3, False),  # no plan yet: pricing on is the only way to an answer
        (True, None, 0.3, False),  # no limit
    ],
)
def test_a_step_is_priced_only_with_time_left_for_it(has_plan, left_s, price_s, stops):
    """Pricing a micro-batch step's options cannot be interrupted, so with a plan already found the DP does
    not start one it has seen take longer than the time left (a 1 s limit answered at 1.4 s otherwise)."""
    from types import SimpleNamespace

    from hapmoe_milp.search.dp import _DPSearch

    wall = None if left_s is None else time.perf_counter() + left_s
    stub = SimpleNamespace(
        clock=Clock(wall=wall),
        run=SimpleNamespace(best=SimpleNamespace(chain=("plan",) if has_plan else None)),
        price_s=price_s,
    )
    assert _DPSearch.no_time_to_price(stub) is stops


def test_a_queue_stopped_while_pricing_is_left_as_it_was(case):
    """The megatron queue prices each group of an instance for its bound (0.1-0.4 s a step on 1,024
    devices), checking the clock per group: stopped part-way it keeps nothing of the instance, so the
    next add builds exactly what a fresh queue does."""
    from hapmoe_milp.deadline import TimeLimitReached
    from hapmoe_milp.instance import build_instances
    from hapmoe_milp.search.dp import _MegatronQueue

    model, cluster, st = case
    inst = next(build_instances(model, cluster, st, "megatron"))

    def queue():
        return _MegatronQueue(cluster.world_size, tuple(cluster.inventory), cluster.inventory)

    fresh = queue()
    fresh.add(inst)
    q = queue()
    for stop in (Clock(wall=time.perf_counter() - 1.0), StopAfter(1)):
        with pytest.raises(TimeLimitReached, match="pricing"):
            q.add(inst, stop)
        assert q.groups == [] and q.base_groups == {} and q.parts == [] and q.insts == []
    q.add(inst)
    assert q.groups == fresh.groups
    for a, b in zip(q.arrays(), fresh.arrays(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_pricing_past_the_deadline_returns_the_plan_in_hand(case, monkeypatch):
    """With a megatron plan found, the hetero family's options are priced (bands, dominance) before it is
    searched; with the clock already past, nothing more is priced and the search ends with the plan in
    hand, status timeout -- the same plan the megatron family gave, not proven."""
    from hapmoe_milp.search.dp import _DPSearch, _solution

    model, cluster, st = case
    search = _DPSearch(model, cluster, st, None, None, None, None, True)
    assert search.search_family("megatron", None)
    chain, value = search.run.best.chain, search.run.best.value
    assert chain is not None and math.isfinite(value)
    calls = count_pricing(monkeypatch)
    search.clock = search.run.clock = Clock(wall=time.perf_counter() - 1.0)
    assert not search.search_family("hetero", None)
    assert calls["layer"] == 0 and search.hetero == []
    sol = _solution("dp", search.run, search.pr, False, False, 0.0)
    assert sol.status == "timeout" and sol.stats["stopped_by"] == "time" and math.isnan(sol.bound_s)
    assert sol.objective_s == value and sol.plan is not None and sol.plan.family == "megatron"


def test_clock_check_raises_only_when_the_search_must_stop():
    from hapmoe_milp.deadline import TimeLimitReached

    past = time.perf_counter() - 1.0
    Clock().check("x")
    Clock(soft=past, found=lambda: True).check("x")  # a plan in hand: the soft deadline does not stop it
    for stop in (Clock(wall=past), Clock(soft=past, found=lambda: False), Clock(cpu=time.process_time() - 1)):
        with pytest.raises(TimeLimitReached, match="while x"):
            stop.check("x")


def test_a_level_priced_in_slices_finds_the_same_plan_and_counts(case, monkeypatch):
    """A level's (state, stage) pairs are priced in slices with the clock looked at between them; each
    pair is priced on its own, so slices of 7 pairs give the plan, the objective, the runner-up and every
    pruning count of one pass."""
    whole = solve_dp(*case)
    calls = {"slices": 0}
    real = dp_levels._pair_slice

    def counted(*a, **kw):
        calls["slices"] += 1
        return real(*a, **kw)

    monkeypatch.setattr(dp_levels, "_pair_slice", counted)
    once = solve_dp(*case)
    n_pass = calls["slices"]
    calls["slices"] = 0
    monkeypatch.setattr(dp_levels, "PAIR_SLICE", 7)
    sliced = solve_dp(*case)
    assert calls["slices"] > n_pass  # some level was cut into several slices
    assert once.plan == whole.plan
    assert sliced.plan == whole.plan and sliced.objective_s == whole.objective_s
    assert sliced.runner_up_s == whole.runner_up_s and sliced.status == whole.status
    assert sliced.pruned == whole.pruned


def test_a_level_stopped_between_slices_ends_the_search_as_a_timeout(case, monkeypatch):
    """The clock stopping a level part-way (between two slices of pairs) stops the search: status timeout,
    no proof."""
    from hapmoe_milp.deadline import TimeLimitReached
    from hapmoe_milp.search import dp

    class InLevel(Clock):
        def check(self, what: str) -> None:
            if "level" in what:
                raise TimeLimitReached(what)

    monkeypatch.setattr(dp_levels, "PAIR_SLICE", 7)
    monkeypatch.setattr(dp, "Clock", InLevel)
    sol = solve_dp(*case)
    assert sol.status == "timeout" and sol.stats["stopped_by"] == "time" and math.isnan(sol.bound_s)
