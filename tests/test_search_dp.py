"""The DP against brute force, and what each pruning switch cuts.

Brute force enumerates every plan of the instance space (stage count, stage options, layer split)
and scores each with `estimate`, an evaluation path independent of the DP's prefix-sum labels.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hapmoe_milp.config import Settings
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.export.common import plan_chunks
from hapmoe_milp.instance import build_instances
from hapmoe_milp.plan import Stage, check_plan
from hapmoe_milp.search.dp import solve_dp
from hapmoe_milp.space import Pruning
from hapmoe_milp.specs import Catalog
from tests.helpers import tiny_cluster, tiny_model
from tests.oracles.brute_force import plan_optimum
from tests.oracles.dp_reference import solve_dp_reference


def brute_force(model, cluster, st: Settings, family: str, max_vpp: int = 8) -> float:
    """The best plan's iteration time over the what-if space (no runtime rules): the shared oracle."""
    return plan_optimum(model, cluster, st, family, max_vpp=max_vpp)[0]


CASES = [
    # (layer pattern, cluster spec, family)
    ((1, 0, 1), [("h800", 2, None), ("910b", 2, None)], "both"),
    ((0, 1, 1, 1), [("h800", 2, 3.0), ("mi300x", 1, 3.0)], "hetero"),
    ((1, 1, 0, 1, 1), [("a100", 2, 2.6), ("v100", 1, None)], "both"),
]


@pytest.mark.parametrize(("pattern", "spec", "family"), CASES)
def test_dp_unpruned_equals_brute_force(catalog, pattern, spec, family):
    model = tiny_model(pattern)
    cluster = tiny_cluster(catalog, spec)
    st = Settings(seq_length=1024, global_batch_size=4, micro_batch_size=1, dispatcher="alltoall")
    expected = brute_force(model, cluster, st, family)
    sol = solve_dp(model, cluster, st, family=family, pruning=Pruning.off())
    if math.isinf(expected):
        assert sol.plan is None and sol.status == "infeasible"
        return
    assert sol.status == "optimal"
    assert sol.objective_s == pytest.approx(expected, rel=1e-9)
    assert sol.bound_s == pytest.approx(expected, rel=1e-9)
    check_plan(sol.plan, model, cluster)
    assert estimate(model, cluster, sol.plan, st).iteration_time_s == pytest.approx(sol.objective_s, rel=1e-9)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    pattern=st.lists(st.integers(0, 1), min_size=2, max_size=4).filter(any),
    n_a=st.sampled_from([1, 2]),
    n_b=st.sampled_from([1, 2]),
    mem=st.sampled_from([None, 2.5, 4.0]),
    pair=st.sampled_from([("h800", "910b"), ("a100", "mi300x"), ("h100", "a40")]),
)
def test_dp_unpruned_equals_brute_force_random(catalog, pattern, n_a, n_b, mem, pair):
    model = tiny_model(tuple(pattern))
    cluster = tiny_cluster(catalog, [(pair[0], n_a, mem), (pair[1], n_b, None)])
    st = Settings(seq_length=1024, global_batch_size=2, micro_batch_size=1, dispatcher="alltoall")
    expected = brute_force(model, cluster, st, "both")
    sol = solve_dp(model, cluster, st, family="both", pruning=Pruning.off())
    if math.isinf(expected):
        assert sol.plan is None
    else:
        assert sol.objective_s == pytest.approx(expected, rel=1e-9)


# ------------------------------------------------------------------------------------------ interleaved (VPP)
VPP_CASES = [
    # (layer pattern, MTP layers, cluster, global batch): a leading dense layer, MTP, tight memory
    ((0, 1, 1, 1, 1), 0, [("a100", 2, 2.4), ("v100", 2, None)], 8),
    ((0, 1, 1, 1, 1, 1), 0, [("h800", 2, 2.2), ("910b", 2, 2.5)], 8),
    ((1, 1, 1, 1, 1), 1, [("h800", 2, None), ("910b", 2, None)], 4),
    ((1, 1, 1, 1), 0, [("h800", 2, None), ("910b", 2, None)], 8),
]


@pytest.fixture(scope="module")
def vpp_results():
    """On the uncalibrated tables: which schedule wins in these tiny cases depends on fitted host and p2p
    terms, which every refit of the calibrated tables moves; the search is what these tests check."""
    catalog = Catalog(use_calibrated=False)
    out = []
    for pattern, mtp, spec, gbs in VPP_CASES:
        model = tiny_model(pattern, mtp=mtp)
        cluster = tiny_cluster(catalog, spec)
        st = Settings(seq_length=1024, global_batch_size=gbs, micro_batch_size=1, dispatcher="alltoall")
        sol = solve_dp(model, cluster, st, family="megatron", pruning=Pruning.off())
        out.append((model, cluster, st, sol))
    return out


@pytest.mark.parametrize("i", range(len(VPP_CASES)))
def test_dp_with_vpp_equals_brute_force(vpp_results, i):
    model, cluster, st, sol = vpp_results[i]
    expected = brute_force(model, cluster, st, "megatron")
    assert sol.status == "optimal"
    assert sol.objective_s == pytest.approx(expected, rel=1e-9)
    check_plan(sol.plan, model, cluster)
    assert estimate(model, cluster, sol.plan, st).iteration_time_s == pytest.approx(sol.objective_s, rel=1e-9)


def test_interleaved_plans_win_where_memory_allows(vpp_results):
    """Interleaving divides the bubble, so with memory to spare the optimum uses it (this is what makes
    the cases above exercise the VPP path, not just the plain one)."""
    vpps = [sol.plan.vpp for *_, sol in vpp_results]
    assert max(vpps) > 1
    for *_, sol in vpp_results:
        p = sol.plan
        if p.vpp > 1:
            assert p.pp > 1 and p.num_microbatches % p.pp == 0
            counts = p.layer_counts()
            assert min(counts[1:-1], default=p.vpp) >= p.vpp and min(counts[0], counts[-1]) >= p.vpp - 1
    # one of these optima puts the embedding and the loss in chunks of their own (E|t|t / t|t|L)
    thin = [sol.plan for *_, sol in vpp_results if min(sol.plan.layer_counts()) < sol.plan.vpp]
    assert thin
    for p in thin:
        model = next(m for m, _c, _s, sol in vpp_results if sol.plan is p)
        rows = plan_chunks(p, model)
        assert rows[0][0].total == 0 or rows[-1][-1].total == 0


def test_interleaved_chunks_price_like_contiguous_stages(vpp_results, catalog):
    """A VPP plan is priced from each stage's contiguous layer range; Megatron runs the canonical chunks
    of the exported layout instead. On the plans the DP emits, both hold the same layer kinds per rank
    (counted here from ``plan_chunks``, the exporter's chunking)."""
    model = tiny_model((0, 0, 1, 1, 1, 1, 1, 1), mtp=1)
    cluster = tiny_cluster(catalog, [("h800", 2, None), ("910b", 2, None)])
    st = Settings(seq_length=1024, global_batch_size=8, micro_batch_size=1, dispatcher="alltoall")
    sol = solve_dp(model, cluster, st, family="megatron")
    plans = [sol.plan] + [r[3].plan for r in vpp_results]
    models = [model] + [r[0] for r in vpp_results]
    checked = 0
    for m, p in zip(models, plans, strict=True):
        if p.vpp <= 1:
            continue
        checked += 1
        chunks = plan_chunks(p, m)
        dec = [k for k in m.layer_kinds if k != "mtp"]
        real = [Counter() for _ in range(p.pp)]
        pos = 0
        for v in range(p.vpp):
            for r in range(p.pp):
                c = chunks[r][v]
                real[r].update(dec[pos : pos + c.decoder])
                real[r]["mtp"] += c.mtp
                pos += c.decoder
        for r, stage in enumerate(p.stages):
            want = Counter(m.layer_kinds[stage.layer_start : stage.layer_end])
            assert +real[r] == want, (r, real[r], want)
    assert checked >= 2


# ------------------------------------------------------------------------------------------ the reference DP
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    pattern=st.lists(st.integers(0, 1), min_size=3, max_size=8).filter(any),
    n_a=st.sampled_from([2, 4]),
    n_b=st.sampled_from([2, 4]),
    mem=st.sampled_from([None, 3.0, 6.0]),
    pair=st.sampled_from([("h800", "910b"), ("a100", "mi300x"), ("h100", "a40")]),
    off=st.booleans(),
)
def test_fast_dp_matches_the_reference_dp(catalog, pattern, n_a, n_b, mem, pair, off):
    """Same space, same switches: the vectorised core finds the reference's objective (or, where the
    reference's approximations cut a plan the core keeps, a better one; with every switch off, equal)."""
    model = tiny_model(tuple(pattern), hidden=1024, heads=8)
    cluster = tiny_cluster(catalog, [(pair[0], n_a, mem), (pair[1], n_b, None)])
    st = Settings(seq_length=2048, global_batch_size=16, micro_batch_size=1, dispatcher="alltoall")
    pr = replace(Pruning.off() if off else Pruning(), max_vpp=1)
    ref = solve_dp_reference(model, cluster, st, pruning=pr)
    new = solve_dp(model, cluster, st, pruning=pr)
    if ref.plan is None:
        if off or new.plan is None:
            assert new.plan is None and new.status == ref.status
            return
        # the reference's approximations cut every plan (e.g. its layer band, which the core re-searches
        # without): what the core found must then be a valid plan that fits, priced as it says
        check_plan(new.plan, model, cluster)
        est = estimate(model, cluster, new.plan, st)
        assert est.fits and est.iteration_time_s == pytest.approx(new.objective_s, rel=1e-9)
        return
    if off:
        assert new.objective_s == pytest.approx(ref.objective_s, rel=1e-9)
        assert new.status == ref.status == "optimal"
    else:
        assert new.objective_s <= ref.objective_s * (1 + 1e-9)
    assert estimate(model, cluster, new.plan, st).iteration_time_s == pytest.approx(new.objective_s, rel=1e-9)


# ------------------------------------------------------------------------------------------ pruning rules
@pytest.fixture(scope="module")
def hetero_case(catalog):
    model = tiny_model((0, 1, 1, 1, 1, 1, 1, 1), hidden=1024, heads=8)
    cluster = tiny_cluster(catalog, [("h800", 4, None), ("910b", 4, None)])
    st = Settings(seq_length=2048, global_batch_size=16, micro_batch_size=1, dispatcher="alltoall")
    exact = solve_dp(model, cluster, st, family="hetero", pruning=Pruning.off())
    return model, cluster, st, exact


def test_layer_band_keeps_stages_near_their_compute_share(hetero_case, catalog):
    model, cluster, st, exact = hetero_case
    pr = Pruning(**{**Pruning.off().to_dict(), "layer_band": True, "delta": 0.2})
    sol = solve_dp(model, cluster, st, family="hetero", pruning=pr)
    assert sol.pruned.get("layer_band", 0) > 0
    assert sol.objective_s >= exact.objective_s * (1 - 1e-12)
    # closed form on a homogeneous cluster: a stage holding half the devices at the fastest per-device
    # option gets half the layers, band [floor(0.8 N/2), ceil(1.2 N/2)]
    homo = tiny_cluster(catalog, [("h800", 4, None)])
    n = len(model.layer_kinds)
    inst = next(iter(build_instances(model, homo, st, "hetero", pr)))
    main = "moe"
    w = min((o.per_kind[main].fwd + o.per_kind[main].bwd) * o.devices for o in inst.options)
    best = [o for o in inst.options if o.devices == 2 and (o.per_kind[main].fwd + o.per_kind[main].bwd) * 2 == w]
    for o in best:
        assert o.band == (math.floor(0.8 * n / 2), math.ceil(1.2 * n / 2))


def test_min_recompute_picks_the_cheapest_level_that_fits(catalog):
    model = tiny_model((1, 1, 1, 1), hidden=1024, heads=8)
    cluster = tiny_cluster(catalog, [("h800", 2, 3.5)])
    st = Settings(seq_length=2048, global_batch_size=8, micro_batch_size=1, dispatcher="alltoall")
    base = Pruning.off().to_dict()
    sol = solve_dp(model, cluster, st, family="hetero", pruning=Pruning(**{**base, "min_recompute": True}))
    assert sol.pruned.get("min_recompute", 0) > 0
    order = ["none", "full"]  # the hetero family offers what FlagScale can express per stage
    assert any(s.recompute != "none" for s in sol.plan.stages)
    for i, s in enumerate(sol.plan.stages):
        e = estimate(model, cluster, sol.plan, st)
        for cheaper in order[: order.index(s.recompute)]:
            stages = list(sol.plan.stages)
            stages[i] = Stage(s.device, s.cfg, s.layer_start, s.layer_end, cheaper)  # type: ignore[arg-type]
            alt = estimate(model, cluster, sol.plan.__class__(**{**sol.plan.__dict__, "stages": tuple(stages)}), st)
            assert not alt.stages[i]["memory_gib"] <= alt.stages[i]["capacity_gib"], "a cheaper level fits"
        assert e.fits


def test_cross_type_bound_forbids_cross_type_boundaries_when_eta_is_zero(hetero_case):
    model, cluster, st, exact = hetero_case
    pr = Pruning(**{**Pruning.off().to_dict(), "cross_type_comm": True, "eta": 0.0})
    sol = solve_dp(model, cluster, st, family="hetero", pruning=pr)
    assert sol.pruned.get("cross_type_comm", 0) > 0
    devs = [s.device for s in sol.plan.stages]
    assert all(a == b for a, b in itertools.pairwise(devs))
    assert {s.device for s in exact.plan.stages} != set(devs) or len(set(devs)) == 1


def test_dominance_cuts_options_without_changing_the_optimum(hetero_case):
    model, cluster, st, exact = hetero_case
    pr = Pruning(**{**Pruning.off().to_dict(), "dominance": True})
    sol = solve_dp(model, cluster, st, family="hetero", pruning=pr)
    assert sol.pruned.get("dominance", 0) > 0
    assert sol.objective_s == pytest.approx(exact.objective_s, rel=1e-12)


def test_max_stages_caps_pipeline_depth(hetero_case):
    model, cluster, st, exact = hetero_case
    pr = Pruning(**{**Pruning.off().to_dict(), "max_stages": 1})
    sol = solve_dp(model, cluster, st, family="hetero", pruning=pr)
    assert sol.plan.pp == 1
    assert exact.plan.pp >= 1 and sol.objective_s >= exact.objective_s * (1 - 1e-12)


def test_ep_within_type_is_structural(hetero_case):
    """Every stage is one device type, so no EP group can span types; the rule never has work."""
    model, cluster, st, _ = hetero_case
    sol = solve_dp(model, cluster, st, family="hetero")
    assert sol.pruned.get("ep_within_type", 0) == 0
    for s in sol.plan.stages:
        assert s.cfg.ep * s.cfg.etp <= s.devices


def test_pruned_dp_is_close_to_exact_on_small_cases(hetero_case):
    model, cluster, st, exact = hetero_case
    sol = solve_dp(model, cluster, st, family="hetero")
    assert sol.status == "feasible"
    assert sol.objective_s <= exact.objective_s * 1.05


def test_random_seeds_are_deterministic(catalog):
    random.seed(0)
    model = tiny_model((1, 0, 1, 1))
    cluster = tiny_cluster(catalog, [("h800", 2, None), ("910b", 2, None)])
    st = Settings(seq_length=1024, global_batch_size=4, micro_batch_size=1)
    a = solve_dp(model, cluster, st)
    b = solve_dp(model, cluster, st)
    assert a.plan == b.plan and a.objective_s == b.objective_s


# ------------------------------------------------------------------------------------------ status and clock
def test_status_says_how_far_the_plan_is_proven(hetero_case):
    """optimal: the search completed and no rule that can cut the optimum fired (the bound is the
    objective); feasible: such a rule fired (named in cut_by); timeout: the clock stopped it."""
    model, cluster, st, exact = hetero_case
    assert exact.status == "optimal" and exact.stats["cut_by"] == []
    assert exact.bound_s == exact.objective_s
    pruned = solve_dp(model, cluster, st, family="hetero", pruning=Pruning(layer_band=False, min_recompute=True))
    assert pruned.stats["cut_by"]
    assert all(pruned.pruned.get(r, 0) > 0 for r in pruned.stats["cut_by"])
    assert pruned.status == "feasible" and math.isnan(pruned.bound_s)
    late = solve_dp(model, cluster, st, family="hetero", time_limit=1e-9)
    assert late.status == "timeout" and late.stats.get("stopped_by", "time") == "time"


def test_switches_that_cut_nothing_keep_the_proof(catalog):
    """Pruning switches that fire on nothing leave the answer proven optimal: e.g. a stage cap above the
    layer count, or the band when the refinement pass completes."""
    model = tiny_model((1, 1, 1))
    cluster = tiny_cluster(catalog, [("h800", 2, None)])
    st = Settings(seq_length=1024, global_batch_size=4, micro_batch_size=1, dispatcher="alltoall")
    pr = replace(Pruning.off(), max_stages=16)
    sol = solve_dp(model, cluster, st, pruning=pr)
    ref = solve_dp(model, cluster, st, pruning=Pruning.off())
    assert sol.status == "optimal" and sol.objective_s == pytest.approx(ref.objective_s, rel=1e-12)


def test_progress_is_reported_and_only_improves(hetero_case):
    model, cluster, st, _ = hetero_case
    events = []
    sol = solve_dp(model, cluster, st, progress=events.append)
    assert events and {e.phase for e in events} <= {"build", "dp", "refine"}
    assert "dp" in {e.phase for e in events}
    bests = [e.best_s for e in events]
    assert all(a >= b for a, b in itertools.pairwise(bests))
    assert bests[-1] == pytest.approx(sol.objective_s, rel=1e-12)
    assert all(e.elapsed_s >= 0 for e in events)


def test_interleaved_in_flight_is_the_cost_models_rule(catalog):
    """The instance's in-flight count is cost.pipeline.in_flight, and an interleaved one needs the depth."""
    from hapmoe_milp.cost.pipeline import in_flight

    model = tiny_model((1, 1, 1, 1, 1, 1, 1, 1))
    cluster = tiny_cluster(catalog, [("h800", 4, None)])
    st = Settings(seq_length=1024, global_batch_size=16, micro_batch_size=1, dispatcher="alltoall")
    insts = list(build_instances(model, cluster, st, "megatron", Pruning(), max_vpp=3))
    plain = [i for i in insts if i.vpp == 1]
    inter = [i for i in insts if i.vpp > 1]
    assert plain and inter
    for i in plain:
        assert [i.in_flight(k) for k in (1, 2, 5)] == [min(i.num_microbatches, k) for k in (1, 2, 5)]
    for i in inter:
        assert i.vpp_depths() and all(i.num_microbatches % p == 0 and p * i.vpp <= 8 for p in i.vpp_depths())
        with pytest.raises(ValueError):
            i.in_flight(1)
        for p in i.vpp_depths():
            for k in range(1, p + 1):
                assert i.in_flight(k, p) == in_flight(p - k, p, i.num_microbatches, i.vpp)
        assert i.options is plain[0].options or any(i.options is j.options for j in plain)


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    body=st.integers(4, 8),
    mem=st.sampled_from([3.0, 4.0, 6.0]),
    pair=st.sampled_from([("h800", "910b"), ("a100", "mi300x")]),
    gbs=st.sampled_from([4, 8]),
)
def test_megatron_queue_bounds_are_valid(catalog, body, mem, pair, gbs):
    """Every queued megatron sub-problem's bound (the order of the search and what it skips) is at most
    that sub-problem's optimum, computed independently by CP-SAT over the exact formulation at each of its
    depths -- with recompute groups (whose activations are smaller) and interleaved depths, memory-tight.
    (At this scale the bound rarely binds; tests/test_search_exact.py checks it on Table 1 scenarios.)"""
    import numpy as np

    from hapmoe_milp.instance import group_key
    from hapmoe_milp.search import cpsat
    from hapmoe_milp.search.depth_model import DepthModel
    from hapmoe_milp.search.dp import _MegatronQueue
    from hapmoe_milp.search.formulation import SubProblem, evaluate_assignment

    model = tiny_model((1,) * body)
    cluster = tiny_cluster(catalog, [(pair[0], 2, mem), (pair[1], 2, None)])
    st_ = Settings(seq_length=4096, global_batch_size=gbs, micro_batch_size=1, dispatcher="alltoall")
    checked = 0
    for inst in build_instances(model, cluster, st_, "megatron", Pruning.off(), max_vpp=3):
        q = _MegatronQueue(cluster.world_size, tuple(cluster.inventory), cluster.inventory)
        q.add(inst)
        arrs = q.arrays()
        for j in range(len(arrs[0])):
            sub = q.sub(j, arrs)
            sp = SubProblem(inst, [group_key(sub.options[0], "megatron")])
            best = math.inf
            for p in [sub.pp] if sub.pp else sp.depths:
                if p not in sp.depths:
                    continue
                res = cpsat.solve_model(DepthModel(sp, p, math.inf), threads=1)
                if res.assignment is not None:
                    val, fits = evaluate_assignment(sp, res.assignment)
                    assert fits and res.status == "optimal"
                    best = min(best, val)
            if math.isfinite(best):
                assert sub.lb <= best * (1 + 1e-9), (inst.vpp, sub.pp, sub.options[0].recompute, sub.lb, best)
                assert np.isfinite(arrs[3][j])
                checked += 1
    assert checked > 0
