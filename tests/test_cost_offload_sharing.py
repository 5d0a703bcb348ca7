"""A cost model shared across the optimizer-offload setting (``CostModel.for_settings``) prices every layer
and edge exactly as a fresh cost model of that setting does, whichever setting priced it first."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hapmoe_milp.api import make_settings
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.instance import build_instances
from hapmoe_milp.space import Pruning


@pytest.mark.parametrize(("model_name", "cluster_name"), [("mixtral-l", "16-1"), ("deepseek-v2-lite", "16-2")])
def test_offload_variant_prices_like_a_fresh_model(catalog, model_name, cluster_name):
    model, cluster = catalog.model(model_name), catalog.cluster(cluster_name)
    on_device = make_settings(model)
    offload = replace(on_device, optimizer_offload=True)
    shared = CostModel(model, cluster, on_device)
    opts = [o for inst in build_instances(model, cluster, on_device, "hetero", Pruning.off()) for o in inst.options]
    opts = opts[:: max(1, len(opts) // 40)]
    kinds = sorted(set(model.layer_kinds))
    for o in opts[: len(opts) // 2]:  # priced by the on-device model first, then re-used
        for k in kinds:
            shared.layer(o.device, o.cfg, o.b, k, o.recompute)
        shared.first_edge(o.device, o.cfg, o.b)
    other = shared.for_settings(offload)
    fresh = CostModel(model, cluster, offload)
    for o in opts:
        for k in kinds:
            assert other.layer(o.device, o.cfg, o.b, k, o.recompute) == fresh.layer(
                o.device, o.cfg, o.b, k, o.recompute
            )
        assert other.first_edge(o.device, o.cfg, o.b) == fresh.first_edge(o.device, o.cfg, o.b)
        assert other.last_edge(o.device, o.cfg, o.b) == fresh.last_edge(o.device, o.cfg, o.b)
        assert other.fixed_memory(o.device, o.cfg, o.b) == fresh.fixed_memory(o.device, o.cfg, o.b)
    # and back: the on-device model re-uses what the offload one priced, again exactly
    back = CostModel(model, cluster, on_device)
    for o in opts:
        for k in kinds:
            assert shared.layer(o.device, o.cfg, o.b, k, o.recompute) == back.layer(
                o.device, o.cfg, o.b, k, o.recompute
            )
    assert (
        other.layer(opts[0].device, opts[0].cfg, opts[0].b, kinds[0], "none").weights
        != shared.layer(opts[0].device, opts[0].cfg, opts[0].b, kinds[0], "none").weights
    )  # offload really changes the state terms
    with pytest.raises(ValueError):
        shared.for_settings(replace(on_device, seq_length=2 * on_device.seq_length))


@pytest.mark.parametrize(("model_name", "cluster_name"), [("deepseek-v3", "16-1-h"), ("mixtral-l", "16-1")])
def test_offload_only_removes_device_memory(catalog, model_name, cluster_name):
    """What ``api._covers`` rests on: with the optimizer offloaded every memory term of a layer or an edge
    is at most its on-device value, capacities and fixed memory are the same, and so are the stage times
    the DP's space reads (forward, backward); so whatever fits on the device fits offloaded."""
    model, cluster = catalog.model(model_name), catalog.cluster(cluster_name)
    on_device = make_settings(model)
    dev_cm, off_cm = (
        CostModel(model, cluster, on_device),
        CostModel(model, cluster, replace(on_device, optimizer_offload=True)),
    )
    opts = [o for inst in build_instances(model, cluster, on_device, "hetero", Pruning.off()) for o in inst.options]
    opts = opts[:: max(1, len(opts) // 40)]
    kinds = sorted(set(model.layer_kinds))
    less = 0
    for o in opts:
        a_cfg = (o.device, o.cfg, o.b)
        for k in kinds:
            on, off = dev_cm.layer(*a_cfg, k, o.recompute), off_cm.layer(*a_cfg, k, o.recompute)
            assert off.weights <= on.weights and off.act == on.act and off.work == on.work
            assert (off.fwd, off.bwd) == (on.fwd, on.bwd)
            less += off.weights < on.weights
        for edge in ("first_edge", "last_edge"):
            on, off = getattr(dev_cm, edge)(*a_cfg), getattr(off_cm, edge)(*a_cfg)
            assert off.weights <= on.weights and off.act == on.act and off.work == on.work
            assert (off.fwd, off.bwd) == (on.fwd, on.bwd)
        assert off_cm.fixed_memory(*a_cfg) == dev_cm.fixed_memory(*a_cfg)
        assert off_cm.capacity(o.device, o.cfg) == dev_cm.capacity(o.device, o.cfg)
    assert less > 0  # and it does remove some
