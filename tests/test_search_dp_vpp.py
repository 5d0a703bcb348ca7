"""Interleaved (VPP) plans from the search: never worse than the grid-searched Megatron-uniform baseline on
homogeneous H100 clusters, and launchable -- our export validators and megatron-core accept them.

The H100 cases are model/cluster configurations priced by our own cost model (no measurements of the
held-out models are used or stored): Mixtral-8x22B on 128 H100 and Qwen3-235B on 256 H100, where
practitioners interleave. The baseline (:func:`hapmoe_milp.baselines.megatron_uniform`) grid-searches
TP/CP/EP/ETP/PP/VPP/recompute with even layer splits; the planner's space contains every plan of that grid
whose stages fit its stage shapes, so it must match or beat it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from hapmoe_milp.api import make_settings, solve
from hapmoe_milp.baselines import megatron_uniform
from hapmoe_milp.export.validate import validate

HOMOGENEOUS = [("mixtral-8x22b", "128xh100"), ("qwen3-235b-a22b", "256xh100")]
# interleaved plans of other shapes: a Table 1 scenario, and DeepSeek-V3 (dense first layers, MTP)
MORE_VPP = [("mixtral-s", "16-1-h", None), ("deepseek-v3", "2048-h800", 4096)]


@pytest.fixture(scope="module")
def homogeneous(catalog):
    out = []
    for model, cluster in HOMOGENEOUS:
        m, c = catalog.model(model), catalog.cluster(cluster)
        st = make_settings(m)
        sol = solve(m, c, catalog=catalog)
        base = megatron_uniform(m, c, st)
        if base.plan is None:
            base = megatron_uniform(m, c, replace(st, optimizer_offload=True))
        out.append((m, c, sol, base))
    return out


@pytest.fixture(scope="module")
def vpp_plans(catalog, homogeneous):
    plans = [(m, c, sol.plan) for m, c, sol, _ in homogeneous]
    for model, cluster, gbs in MORE_VPP:
        m, c = catalog.model(model), catalog.cluster(cluster)
        sol = solve(m, c, catalog=catalog, **({"global_batch_size": gbs} if gbs else {}))
        plans.append((m, c, sol.plan))
    return [(m, c, p) for m, c, p in plans if p.vpp > 1]


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(HOMOGENEOUS)), ids=[f"{m}-{c}" for m, c in HOMOGENEOUS])
def test_planner_never_worse_than_megatron_uniform_with_vpp(homogeneous, i):
    _m, _c, sol, base = homogeneous[i]
    assert base.plan is not None
    assert sol.objective_s <= base.objective_s * (1 + 1e-9)


@pytest.mark.slow
def test_interleaved_plans_are_found_and_pass_the_validators(vpp_plans):
    """The search does emit VPP plans here (uniform and layout-split, with and without MTP), and every
    Megatron rule our validator knows holds: M % PP, a layer per virtual stage, layout grammar."""
    assert len(vpp_plans) >= 3
    assert any(m.mtp_num_layers for m, _c, _p in vpp_plans)
    for m, c, p in vpp_plans:
        assert p.family == "megatron"
        assert validate(p, m, c, "megatron") == []
        assert p.num_microbatches % p.pp == 0
        # a layer per chunk, except an embedding-only first chunk and a loss-only last chunk (E|...|L)
        c = p.layer_counts()
        assert min(c[1:-1], default=p.vpp) >= p.vpp and min(c[0], c[-1]) >= p.vpp - 1


@pytest.mark.slow
@pytest.mark.megatron
def test_interleaved_plans_pass_the_megatron_core_oracle(vpp_plans):
    """The exported arguments of each VPP plan parse and build in megatron-core: the layout (or VPP flag)
    gives the plan's layers per rank and per virtual chunk, TransformerConfig builds, the fake-process-group
    mesh has the plan's DP/EDP with VPP set, and the micro-batch calculator agrees (the oracle of
    tests/test_export_oracle.py, applied to plans the search produced)."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from tests.megatron_oracle import check_megatron_export

    for m, c, p in vpp_plans:
        check_megatron_export(p, m, c)
