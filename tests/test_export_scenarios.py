"""Every HAPMoE Table 1 scenario's best plan exports cleanly.

megatron-family plans pass our Megatron validators (and, when megatron-core is installed, the
Megatron-Core oracle: layout parser, TransformerConfig, model-parallel init on a fake process group);
hetero-family plans pass the FlagScale validators.
"""

from __future__ import annotations

import pytest

from hapmoe_milp.api import solve
from hapmoe_milp.export.megatron import megatron_args
from hapmoe_milp.export.validate import validate

TABLE1 = ["16-1-h", "16-2-h", "16-3-h", "16-1", "16-2", "16-3", "24-1", "24-2", "24-3", "32-1", "32-2", "32-3"]


def _oracle():
    try:
        import megatron.core  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        return None
    from tests import test_export_oracle

    return test_export_oracle.test_megatron_core_accepts_export


@pytest.mark.parametrize("cluster", TABLE1)
def test_mixtral_s_megatron_plan_exports(catalog, cluster):
    sol = solve("mixtral-s", cluster, family="megatron", catalog=catalog)
    plan, model, cl = sol.plan, catalog.model("mixtral-s"), catalog.cluster(cluster)
    assert validate(plan, model, cl, "megatron") == []
    assert any(a.startswith("--pipeline-model-parallel-size") for a in megatron_args(plan, model, cl))
    oracle = _oracle()
    if oracle is not None:
        oracle((cluster, plan, model, cl))


@pytest.mark.parametrize("cluster", TABLE1)
def test_mixtral_s_hetero_plan_passes_flagscale_rules(catalog, cluster):
    sol = solve("mixtral-s", cluster, family="hetero", catalog=catalog)
    assert validate(sol.plan, catalog.model("mixtral-s"), catalog.cluster(cluster), "flagscale") == []


@pytest.mark.slow
@pytest.mark.parametrize("cluster", TABLE1)
def test_mixtral_l_megatron_plan_exports(catalog, cluster):
    sol = solve("mixtral-l", cluster, family="megatron", catalog=catalog)
    plan, model, cl = sol.plan, catalog.model("mixtral-l"), catalog.cluster(cluster)
    assert validate(plan, model, cl, "megatron") == []
    oracle = _oracle()
    if oracle is not None:
        oracle((cluster, plan, model, cl))
