"""Every HAPMoE Table 1 scenario's best plan exports cleanly for the runtime that runs it.

megatron-family plans are searched for the runtime that runs them on the cluster: the one-mesh runtime
of its vendor (Megatron-LM on H800, MindSpeed-LLM on 910B, the ROCm fork on MI300X), whose validators
they pass (and, for Megatron-LM's command line when megatron-core is installed, the Megatron-Core oracle:
layout parser, TransformerConfig, model-parallel init on a fake process group); across vendors FlagScale,
whose meshes run one-mesh plans too (no VPP there), while the what-if plan fails Megatron-LM's vendor
rule. hetero-family plans pass the FlagScale validators.
"""

from __future__ import annotations

import pytest

from hapmoe_milp.api import solve
from hapmoe_milp.export.megatron import megatron_args
from hapmoe_milp.export.validate import validate
from hapmoe_milp.runtimes import runtimes_for

TABLE1 = ["16-1-h", "16-2-h", "16-3-h", "16-1", "16-2", "16-3", "24-1", "24-2", "24-3", "32-1", "32-2", "32-3"]


def _oracle():
    try:
        import megatron.core  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        return None
    from tests.megatron_oracle import check_megatron_export

    return check_megatron_export


def _one_mesh_plan(catalog, model_name: str, cluster: str):
    """The megatron-family plan of the cluster's one-mesh runtime, or None (checked) when it has none."""
    cl = catalog.cluster(cluster)
    one_mesh = [r.name for r in runtimes_for(cl) if r.family == "megatron"]
    if not one_mesh:
        plan = solve(model_name, cluster, family="megatron", catalog=catalog).plan
        assert plan.runtime == "flagscale" and plan.vpp == 1
        assert validate(plan, catalog.model(model_name), cl, "flagscale") == []
        what_if = solve(model_name, cluster, family="megatron", runtime="any", catalog=catalog, time_limit=20).plan
        assert "rule_runtime_vendors" in {v.rule for v in validate(what_if, catalog.model(model_name), cl, "megatron")}
        return None, None
    (rt,) = one_mesh
    return solve(model_name, cluster, family="megatron", catalog=catalog).plan, rt


@pytest.mark.parametrize("cluster", TABLE1)
def test_mixtral_s_megatron_plan_exports(catalog, cluster):
    plan, rt = _one_mesh_plan(catalog, "mixtral-s", cluster)
    if plan is None:
        return
    model, cl = catalog.model("mixtral-s"), catalog.cluster(cluster)
    assert plan.runtime == rt
    assert validate(plan, model, cl, rt) == []
    assert any(a.startswith("--pipeline-model-parallel-size") for a in megatron_args(plan, model, cl))
    oracle = _oracle()
    if oracle is not None and rt == "megatron":  # the oracle validates Megatron-LM's own target
        oracle(plan, model, cl)


@pytest.mark.parametrize("cluster", TABLE1)
def test_mixtral_s_hetero_plan_passes_flagscale_rules(catalog, cluster):
    sol = solve("mixtral-s", cluster, family="hetero", catalog=catalog)
    assert validate(sol.plan, catalog.model("mixtral-s"), catalog.cluster(cluster), "flagscale") == []


@pytest.mark.slow
@pytest.mark.parametrize("cluster", TABLE1)
def test_mixtral_l_megatron_plan_exports(catalog, cluster):
    plan, rt = _one_mesh_plan(catalog, "mixtral-l", cluster)
    if plan is None:
        return
    model, cl = catalog.model("mixtral-l"), catalog.cluster(cluster)
    assert validate(plan, model, cl, rt) == []
    oracle = _oracle()
    if oracle is not None and rt == "megatron":  # the oracle validates Megatron-LM's own target
        oracle(plan, model, cl)
