"""``solve`` under a short limit: the optimizer-offload retry gets the time the first try could not use
to find a plan, and what comes back says how far it is proven (``api.NO_PLAN_SHARE``)."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest

from hapmoe_milp import api
from hapmoe_milp.errors import InfeasibleError
from hapmoe_milp.search import floor
from hapmoe_milp.specs import Catalog

CAT = Catalog()


def test_offload_plan_after_an_unfinished_first_try_is_a_timeout(monkeypatch):
    """With no share of the limit for the first try (no plan by 0 s), the offload retry gets the rest:
    its plan comes back with status timeout and no proof, since the first try's space -- where the
    finished search finds a plan without offload -- was not searched to the end."""
    finished = api.solve("mixtral-s", "16-1-h", time_limit=60, catalog=CAT)
    assert finished.plan is not None and finished.plan.settings().optimizer_offload is False
    assert finished.status in ("optimal", "feasible")
    monkeypatch.setattr(api, "NO_PLAN_SHARE", 0.0)
    sol = api.solve("mixtral-s", "16-1-h", time_limit=60, catalog=CAT)
    assert sol.plan is not None and sol.plan.settings().optimizer_offload is True
    assert sol.status == "timeout" and math.isnan(sol.bound_s)
    assert sol.stats["stopped_by"] == "time" and "unfinished_try" in sol.stats and "proof" not in sol.stats
    assert sol.plan.solver is not None and sol.plan.solver["status"] == "timeout"  # what the plan file records


def _no_floor(monkeypatch):
    """DeepSeek-V3 on 16 devices is proven infeasible by the memory floor before any search
    (tests/test_search_floor.py); these tests are about the searched tries, so the floor has no proof."""
    monkeypatch.setattr(floor, "prove_no_fit", lambda *a, **kw: None)


def _spy(monkeypatch, stop_call: int | None = None):
    """Record (offload, status, plan_by) of every search; the ``stop_call``-th comes back as a timeout
    without a plan (a search the limit stopped)."""
    calls = []
    real = api._run_solver

    def spy(m, c, st, solver, spaces, pruning, left, opts, *a, **kw):
        sol = real(m, c, st, solver, spaces, pruning, left, opts, *a, **kw)
        if len(calls) + 1 == stop_call:
            sol = replace(sol, status="timeout", plan=None, stats={**sol.stats, "stopped_by": "time"})
        calls.append((st.optimizer_offload, sol.status, opts.get("plan_by")))
        return sol

    monkeypatch.setattr(api, "_run_solver", spy)
    return calls


def test_offload_proof_covers_the_unfinished_first_try(monkeypatch):
    """DeepSeek-V3 fits 16 devices neither way. With the first try (states on the device) stopped at once,
    the offload retry proves its space empty, which covers the first try (offload only removes device
    memory): the answer is the proof, the same diagnosis as the finished solve, without searching again."""
    _no_floor(monkeypatch)
    with pytest.raises(InfeasibleError) as proven:
        api.solve("deepseek-v3", "16-1-h", time_limit=60, catalog=CAT)
    assert proven.value.constraint == "memory"
    monkeypatch.setattr(api, "NO_PLAN_SHARE", 0.0)
    calls = _spy(monkeypatch)
    with pytest.raises(InfeasibleError) as again:
        api.solve("deepseek-v3", "16-1-h", time_limit=60, catalog=CAT)
    assert str(again.value) == str(proven.value)
    assert [(off, status) for off, status, _ in calls] == [(False, "timeout"), (True, "infeasible")]
    assert calls[0][2] == 0.0


def test_unfinished_try_not_covered_is_resumed_and_only_a_finished_one_proves(monkeypatch):
    """Where the retry's proof does not cover the unfinished try (here: pretend it does not), that try
    gets the rest of the limit; solve proves infeasibility only once it has finished too, and says it ran
    out of time when it has not."""
    _no_floor(monkeypatch)
    monkeypatch.setattr(api, "NO_PLAN_SHARE", 0.0)
    monkeypatch.setattr(api, "_covers", lambda proven, other: False)
    calls = _spy(monkeypatch)
    with pytest.raises(InfeasibleError) as resumed:
        api.solve("deepseek-v3", "16-1-h", time_limit=60, catalog=CAT)
    assert resumed.value.constraint == "memory"
    assert [(off, status) for off, status, _ in calls] == [
        (False, "timeout"),
        (True, "infeasible"),
        (False, "infeasible"),
    ]
    assert calls[2][2] is None  # the resumed try has no early stop
    _spy(monkeypatch, stop_call=3)
    with pytest.raises(InfeasibleError) as unproven:
        api.solve("deepseek-v3", "16-1-h", time_limit=60, catalog=CAT)
    assert unproven.value.constraint == "time"


def test_no_share_without_a_retry(monkeypatch):
    """A solve with offload chosen has no later try: its one search gets the whole limit."""
    calls = _spy(monkeypatch)
    sol = api.solve("mixtral-s", "16-1-h", time_limit=60, catalog=CAT, optimizer_offload=False)
    assert sol.plan is not None and calls and all(p is None for *_, p in calls)


def test_the_limit_covers_the_work_before_the_search(monkeypatch):
    """The limit is the whole call's: time spent before the search starts (specs, the runtimes' spaces,
    the memory floor) counts against it. Here that step is made to take longer than the limit, so no try
    is left any time: no plan, and the error says the limit, not a proof, ended it."""
    import time

    real = api.search_spaces

    def slow(*a, **kw):
        time.sleep(0.3)
        return real(*a, **kw)

    monkeypatch.setattr(api, "search_spaces", slow)
    with pytest.raises(InfeasibleError) as ei:
        api.solve("mixtral-s", "16-1-h", time_limit=0.2, catalog=CAT)
    assert ei.value.constraint == "time"
    monkeypatch.setattr(api, "search_spaces", real)
    assert api.solve("mixtral-s", "16-1-h", time_limit=60, catalog=CAT).plan is not None


@pytest.mark.parametrize(("limit", "reserve"), [(1.0, 0.05), (60.0, 0.05), (0.4, 0.02)])
def test_the_searches_stop_before_the_limit_to_leave_the_finish_inside_it(monkeypatch, limit, reserve):
    """What runs after a search stops (its last unit of work, building the plan) must end inside the
    limit, so every search is handed at most the limit less the reserve: 0.05 s, or 5% of a short limit
    (0.4 s -> 0.02 s). Worked by hand from api.FINISH_RESERVE_S / FINISH_SHARE's documented values."""
    handed = []
    real = api._run_solver

    def spy(m, c, st, solver, spaces, pruning, left, opts, *a, **kw):
        handed.append(left)
        return real(m, c, st, solver, spaces, pruning, left, opts, *a, **kw)

    monkeypatch.setattr(api, "_run_solver", spy)
    # solve's own clock stands still, so what it hands the first search is exactly limit - reserve
    monkeypatch.setattr(api, "time", SimpleNamespace(perf_counter=lambda: 100.0))
    try:
        api.solve("mixtral-s", "16-1", solver="dp", time_limit=limit, catalog=CAT, optimizer_offload=False)
    except InfeasibleError as e:
        # what is handed does not depend on whether the search then finds a plan in time: on a loaded machine
        # (CI's workers share two cores) 0.38 s of wall time may not be enough, which is a timeout, not a bug
        assert "time limit" in str(e)
    assert handed and handed[0] == pytest.approx(limit - reserve)
