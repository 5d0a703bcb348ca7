"""Why nothing fits: the whole-cluster memory bound of ``diagnose``.

Kimi-K2 (1.03T parameters) cannot train on 64 H100s: its BF16 weights alone (2 bytes a parameter, however
they are split) take more than a quarter of the cluster's memory, and Adam's state several times that. The
diagnosis must say so with the cluster-wide numbers, not point at one stage that fits."""

from __future__ import annotations

import re

from hapmoe_milp.config import make_settings
from hapmoe_milp.cost.primitives import GIB
from hapmoe_milp.search.diagnose import diagnose


def test_a_model_larger_than_the_cluster_is_told_in_cluster_numbers(catalog):
    model, cluster = catalog.model("kimi-k2"), catalog.cluster("64-h100")
    err = diagnose(model, cluster, make_settings(model, None), ["megatron"])
    assert err.constraint == "memory"
    found = re.search(r"needs at least ([\d,]+) GiB .* has ([\d,]+) GiB usable on 64 devices", str(err))
    assert found, str(err)
    need, have = (float(g.replace(",", "")) for g in found.groups())
    weights_only = model.total_params * 2 / GIB  # BF16 weights, one copy across the cluster
    assert need > weights_only
    per_device = cluster.device("h100").memory_gib
    assert have <= 64 * per_device  # usable never exceeds the datasheet
    assert need > have
