"""The memory floor's proofs (search/floor.py) against the full search: it never rules out a space where
the DP finds a plan, it proves most of the infeasible ones on small instances, and ``solve`` answers the
catalog pairs nothing fits before pricing a single option (issue 19: every pair answered within 1 s)."""

from __future__ import annotations

import numpy as np
import pytest

from hapmoe_milp import api
from hapmoe_milp.config import make_settings
from hapmoe_milp.errors import InfeasibleError
from hapmoe_milp.search.dp import solve_dp
from hapmoe_milp.search.floor import most_layers_placed, prove_no_fit
from hapmoe_milp.specs import Catalog
from tests.helpers import tiny_cluster, tiny_model

CAT = Catalog()
MODEL = tiny_model((0, 1, 1, 1), mtp=1)  # a dense prefix, MoE layers and an MTP layer


def _cluster(mem: float):
    return tiny_cluster(CAT, [("h800", 2, mem), ("910b", 2, mem)])


def _full_search(model, cluster, st, runtime: str):
    spaces = api.search_spaces(runtime, cluster, st, "both", None, model)
    fams = tuple(spaces)
    sol = solve_dp(model, cluster, st, family="both" if len(fams) > 1 else fams[0], runtimes=spaces, time_limit=60)
    return sol, prove_no_fit(model, cluster, st, fams)


@pytest.mark.parametrize("runtime", ["any", "auto"])
def test_floor_never_rules_out_a_space_the_search_fits(runtime):
    """Device memory swept across the edge where plans start to fit, optimizer states on the device and
    offloaded: wherever the floor has a proof the finished DP finds no plan, and the floor proves at least
    half of the points the DP finds infeasible (it is not vacuous; under ``auto`` FlagScale's rules between
    stages, which the floor leaves out, rule out more), including the no-offload side of points that fit
    only with offload."""
    counts = {"proof": 0, "plan": 0, "infeasible": 0, "offload only": 0}
    for mem in np.arange(2.10, 2.50, 0.04):
        cluster = _cluster(float(mem))
        found = {}
        for off in (False, True):
            sol, proof = _full_search(MODEL, cluster, make_settings(MODEL, optimizer_offload=off), runtime)
            assert sol.status in ("optimal", "feasible", "infeasible"), sol.status
            if proof is not None:
                assert sol.plan is None, (mem, off, proof)
                counts["proof"] += 1
            counts["plan" if sol.plan is not None else "infeasible"] += 1
            found[off] = sol.plan is not None
        counts["offload only"] += found[True] and not found[False]
    assert counts["plan"] > 0 and counts["offload only"] > 0
    assert counts["proof"] >= 0.5 * counts["infeasible"], counts


def test_offload_only_pair_is_searched_with_offload_alone(monkeypatch):
    """A cluster where plans fit only with the optimizer offloaded: the floor proves the on-device try
    empty, so ``solve`` searches only the offload try, with the whole limit, and its plan is proven."""
    cluster = _cluster(2.26)
    st = make_settings(MODEL)
    assert _full_search(MODEL, cluster, st, "any")[0].plan is None
    assert prove_no_fit(MODEL, cluster, st) is not None
    assert prove_no_fit(MODEL, cluster, make_settings(MODEL, optimizer_offload=True)) is None
    calls = []
    real = api._run_solver

    def spy(m, c, s, *a, **kw):
        calls.append(s.optimizer_offload)
        return real(m, c, s, *a, **kw)

    monkeypatch.setattr(api, "_run_solver", spy)
    sol = api.solve(MODEL, cluster, time_limit=60, runtime="any")
    assert sol.plan is not None and sol.plan.settings().optimizer_offload is True
    assert sol.status in ("optimal", "feasible")
    assert set(calls) == {True}
    assert sol.stats["ruled_out_by_floor"] == "optimizer states on the device"


@pytest.mark.parametrize(
    ("model", "cluster", "says"),
    [
        ("kimi-k2", "24-1", "parameters need at least 6 bytes"),  # the whole cluster's memory
        ("deepseek-v3", "32-2", "hetero-family stages"),  # the stages' (H800 + MI300X)
    ],
)
def test_catalog_pairs_are_proven_before_any_option_is_priced(monkeypatch, model, cluster, says):
    """Two of the 15 catalog pairs that got no answer within 1 s: the proof comes from the floor, with
    no search run, and says so."""
    monkeypatch.setattr(api, "_run_solver", lambda *a, **kw: pytest.fail("searched"))
    with pytest.raises(InfeasibleError) as err:
        api.solve(model, cluster, time_limit=1)
    assert err.value.constraint == "memory"
    text = str(err.value)
    assert "memory floor" in text and "even with the optimizer states offloaded" in text and says in text


def test_every_solver_gets_the_floors_proof():
    """The floor runs before any solver, so DP, CP-SAT and MILP answer a tiny infeasible instance alike."""
    cluster = tiny_cluster(CAT, [("h800", 1, 1.0), ("910b", 1, 1.0)])
    model = tiny_model((1, 1, 1, 1))
    msgs = set()
    for solver in ("dp", "cpsat", "milp"):
        with pytest.raises(InfeasibleError) as err:
            api.solve(model, cluster, solver, optimizer_offload=False, runtime="any")
        assert err.value.constraint == "memory" and "memory floor" in str(err.value)
        msgs.add(str(err.value))
    assert len(msgs) == 1


@pytest.mark.slow
def test_stage_proof_agrees_with_the_full_search():
    """DeepSeek-V3 on 16 H800 + 16 MI300X: its state fits the whole cluster (the cluster condition has no
    proof), the type-grouped stages cannot hold the last layer, and the DP searched to the end with the
    optimizer offloaded finds no plan either."""
    m, c = CAT.model("deepseek-v3"), CAT.cluster("32-2")
    st = make_settings(m, optimizer_offload=True)
    assert most_layers_placed(m, c, st, "hetero") == len(m.layer_kinds) - 1
    sol, proof = _full_search(m, c, st, "auto")
    assert proof is not None and sol.status == "infeasible" and sol.plan is None


def test_stage_search_gives_up_without_a_proof():
    """Past its move budget the stage search has no proof (the solver's own search decides)."""
    m, c = CAT.model("deepseek-v3"), CAT.cluster("32-2")
    st = make_settings(m, optimizer_offload=True)
    assert prove_no_fit(m, c, st, ("hetero",)) is not None
    assert most_layers_placed(m, c, st, "hetero", max_moves=3) is None
    assert prove_no_fit(m, c, st, ("hetero",), max_moves=3) is None
