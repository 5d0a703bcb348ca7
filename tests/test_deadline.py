"""The time limit covers model building: a deadline checked while the exact solvers build their sub-problems
and while compare sizes the unpruned DP. (How long commands take is measured in bench/time_limit.py, not
asserted here; these tests pin that the checks are made and what a stop returns.)"""

from __future__ import annotations

import math
import time

import pytest

from hapmoe_milp.api import make_settings
from hapmoe_milp.compare import compare_solvers, dp_exact_work, format_markdown, nothing_found
from hapmoe_milp.deadline import NO_DEADLINE, Deadline, TimeLimitReached
from hapmoe_milp.instance import build_instances, group_keys
from hapmoe_milp.search import exact
from hapmoe_milp.search.formulation import subproblems
from hapmoe_milp.specs import Catalog
from tests.helpers import StopAfter, count_pricing

CAT = Catalog()
MIX = CAT.model("mixtral-s")


def test_deadline_basics() -> None:
    assert NO_DEADLINE.left() == math.inf and not NO_DEADLINE.passed()
    NO_DEADLINE.check("anything")
    d = Deadline.after(3600.0)
    assert 3590 < d.left() <= 3600 and not d.passed()
    gone = Deadline.after(1.0, start=time.perf_counter() - 2.0)
    assert gone.passed()
    with pytest.raises(TimeLimitReached, match=r"time limit \(1 s\) ran out while building") as ei:
        gone.check("building")
    assert ei.value.field == "time_limit" and ei.value.what == "building"
    assert list(Deadline.after(None).each(range(3), "x")) == [0, 1, 2]
    with pytest.raises(TimeLimitReached):
        list(gone.each(range(3), "x"))


def test_subproblems_stop_at_the_deadline() -> None:
    c = CAT.cluster("16-1")
    inst = next(build_instances(MIX, c, make_settings(MIX), "megatron"))
    parts = [[k] for k in group_keys(inst)]
    assert subproblems(inst, parts)  # no deadline: built
    with pytest.raises(TimeLimitReached, match="sub-problems"):
        subproblems(inst, parts, deadline=Deadline(at=0.0))


@pytest.mark.parametrize("solver", ["cpsat", "milp"])
def test_exact_solver_that_runs_out_while_building_returns_a_timeout(solver: str) -> None:
    """On 2,048 devices building takes seconds; with a limit far below that the solve stops in the build
    and says so (before, the build ignored the limit and took minutes)."""
    c = CAT.cluster("2048-h800")
    sol = exact.solve(MIX, c, make_settings(MIX), solver=solver, time_limit=1e-6)
    assert sol.status == "timeout" and sol.plan is None
    assert sol.stats["stopped_while"].startswith("building")
    assert "time limit" in sol.message


def test_dp_exact_sizing_stops_at_the_deadline() -> None:
    c = CAT.cluster("2048-h800")
    with pytest.raises(TimeLimitReached):
        dp_exact_work(MIX, c, make_settings(MIX), "both", Deadline(at=0.0))


def test_compare_shares_its_budget_and_says_which_solver_found_nothing() -> None:
    c = CAT.cluster("16-1")
    rep = compare_solvers(MIX, c, make_settings(MIX), solvers=("dp", "cpsat"), time_limit=None, budget_s=1e-3)
    assert all(r["time_limit_s"] <= 0.05 + 1e-9 for r in rep["results"])
    assert all(not r["plan"] for r in rep["results"])
    msg = nothing_found(rep)
    assert msg is not None and "dp: timeout" in msg and "cpsat: timeout" in msg
    text = format_markdown(rep)
    assert "nan" not in text and "inf" not in text and "no plan from dp" in text


@pytest.mark.parametrize("family", ["megatron", "hetero"])
def test_option_pricing_stops_at_the_deadline(monkeypatch, family: str) -> None:
    """``build_options`` prices options for the layer band and (hetero) dominance, up to a second on a large
    cluster: past the deadline it prices nothing, a deadline falling part-way stops it part-way, and a
    deadline that never passes builds exactly the options built without one."""
    from hapmoe_milp.cost.model import CostModel
    from hapmoe_milp.instance import build_options, micro_batch_steps
    from hapmoe_milp.space import PruneCounter, Pruning

    c = CAT.cluster("16-1")  # A100 + V100: both families, dominance among hetero options
    st = make_settings(MIX)
    step = micro_batch_steps(MIX, c, st, family)[-1]

    def build(deadline=NO_DEADLINE):
        cm = CostModel(MIX, c, st)  # a fresh cost model: nothing priced yet
        return build_options(MIX, c, cm, family, step, Pruning(), PruneCounter(), deadline=deadline)

    calls = count_pricing(monkeypatch)
    counter = StopAfter(10**9)
    plain = build(counter)
    full, checks = calls["layer"], counter.checks
    assert plain and full > 0
    calls["layer"] = 0
    with pytest.raises(TimeLimitReached, match="pricing"):
        build(Deadline(at=0.0))
    assert calls["layer"] == 0
    with pytest.raises(TimeLimitReached):
        build(StopAfter(checks - 2))  # stops among the last checks: after some pricing, before the rest
    assert 0 < calls["layer"] < full
    again = build(Deadline.after(3600.0))
    assert [(o.device, o.cfg, o.recompute, o.band) for o in again] == [
        (o.device, o.cfg, o.recompute, o.band) for o in plain
    ]
