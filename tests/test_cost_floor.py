"""The memory floor (cost/floor.py) is below what the cost model prices for every stage option of small
spaces -- every mesh, micro-batch step, recompute level and family -- under settings that change how
model state shards, and the whole-cluster floor is the published parameter count times Megatron's bytes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hapmoe_milp.config import make_settings
from hapmoe_milp.cost.floor import (
    device_budget,
    edge_floor_params,
    layer_floor_params,
    memory_floor,
    stage_floor_bytes,
    state_split,
)
from hapmoe_milp.cost.memory import bytes_per_param
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.instance import build_options, micro_batch_steps
from hapmoe_milp.space import PruneCounter, Pruning
from hapmoe_milp.specs import Catalog
from tests.helpers import tiny_cluster, tiny_model

CAT = Catalog()
REL = 1e-9

SETTINGS = {
    "default": {},
    "offload": {"optimizer_offload": True},
    "no-distributed-optimizer": {"distributed_optimizer": False},
    "fsdp": {"fsdp": "optim_grads_params"},
    "bf16-grads": {"grad_reduce_in_bf16": True, "optimizer_state_dtype": "bf16"},
}
CASES = [
    ("moe-mtp", tiny_model((0, 1, 1, 1), mtp=1), [("h800", 4, None), ("910b", 2, None)]),
    ("tied", replace(tiny_model((0, 1, 1)), untie_embeddings_and_output_weights=False), [("h100", 4, None)]),
    ("moe-8-experts", tiny_model((1, 1, 1), experts=8), [("h100", 8, None)]),
    ("dense", tiny_model((0, 0, 0)), [("a100", 4, None), ("h100", 2, None)]),
]
# catalog layer kinds the tiny models lack: MLA, Mamba and MoE-MLP sub-layers, gated DeltaNet
CATALOG = ["deepseek-v2-lite", "jamba-v0.1", "qwen3-next-80b-a3b"]


def _options(model, cluster, st):
    cm = CostModel(model, cluster, st)
    for fam in ("megatron", "hetero"):
        for step in micro_batch_steps(model, cluster, st, fam):
            yield from build_options(model, cluster, cm, fam, step, Pruning.off(), PruneCounter())


@pytest.mark.parametrize("settings_name", list(SETTINGS))
@pytest.mark.parametrize(("name", "model", "spec"), CASES, ids=[c[0] for c in CASES])
def test_stage_floor_is_below_every_priced_option(name, model, spec, settings_name):
    """Per device: each layer kind's state, the embedding's, the output layer's with its logits, the
    working set, and the capacity; per stage: a layer's state summed over the devices is at least its
    parameters at the unsharded bytes per parameter. The least-state option of each size comes within 10%
    of the floor (the floor is close to the widest sharding a real mesh has, not a loose number; what is
    left: the replicated norms and router, whose sharded state the floor counts once instead of once per TP
    rank, and TP dividing the 4 heads, which the floor's TP <= min(g, node) does not use)."""
    cluster = tiny_cluster(CAT, spec)
    st = make_settings(model, **SETTINGS[settings_name])
    per_param = bytes_per_param(st, 1).total
    least: dict[tuple[str, int, str], float] = {}
    seen = 0
    for o in _options(model, cluster, st):
        sf = stage_floor_bytes(model, st, o.devices, cluster.node_size(o.device))
        for k, floor in sf.per_kind.items():
            w = o.per_kind[k].weights
            assert w >= floor * (1 - REL), (o.cfg.label(), k)
            assert o.devices * w >= layer_floor_params(model, k) * per_param * (1 - REL)
            key = (o.device, o.devices, k)
            least[key] = min(least.get(key, float("inf")), w / floor)
        assert o.first.weights >= sf.first * (1 - REL)
        assert o.last.weights + o.last.work >= sf.last * (1 - REL)
        assert o.single.weights + o.single.work >= sf.single * (1 - REL)
        edges = sum(edge_floor_params(model)) * per_param  # one stage, or a first and a last one
        assert o.devices * o.single.weights >= edges * (1 - REL)
        assert o.devices * (o.first.weights + o.last.weights) >= edges * (1 - REL)
        assert o.fixed >= sf.fixed * (1 - REL)
        assert o.capacity <= device_budget(cluster, st, o.device) * (1 + REL)
        seen += 1
    assert seen > 50
    assert max(least.values()) < 1.10, max(least.items(), key=lambda kv: kv[1])


@pytest.mark.parametrize("settings_name", ["default", "fsdp"])
@pytest.mark.parametrize("name", CATALOG)
def test_stage_floor_is_below_every_priced_option_of_catalog_kinds(name, settings_name):
    """The same per-device inequalities for the catalog's other layer kinds, on 4 H100."""
    model = CAT.model(name)
    cluster = tiny_cluster(CAT, [("h100", 4, None)])
    st = make_settings(model, **SETTINGS[settings_name])
    seen = 0
    for o in _options(model, cluster, st):
        sf = stage_floor_bytes(model, st, o.devices, cluster.node_size(o.device))
        for k, floor in sf.per_kind.items():
            assert o.per_kind[k].weights >= floor * (1 - REL), (o.cfg.label(), k)
        assert o.last.weights + o.last.work >= sf.last * (1 - REL)
        assert o.single.weights + o.single.work >= sf.single * (1 - REL)
        assert o.fixed >= sf.fixed * (1 - REL) and sf.fixed > 0
        seen += 1
    assert seen > 10


def test_state_split_is_megatrons_bytes():
    """Megatron's defaults (theoretical_memory_usage.py): 6 bytes per parameter on every copy (BF16 model,
    FP32 gradient) and 12 sharded by the distributed optimizer; all 18 unsharded without it; offload
    keeps only the 6."""
    m = tiny_model((1,))
    assert state_split(make_settings(m)) == (6.0, 12.0)
    assert state_split(make_settings(m, distributed_optimizer=False)) == (18.0, 0.0)
    assert state_split(make_settings(m, optimizer_offload=True)) == (6.0, 0.0)


def test_cluster_floor_of_kimi_k2_is_its_published_size():
    """Kimi-K2 has 1.04T total parameters (moonshotai/Kimi-K2-Instruct model card, "1 trillion total
    parameters"); with the optimizer offloaded each still needs a BF16 weight and an FP32 gradient
    (6 bytes), about 5.6 TiB, while 24 devices of cluster 24-1 hold well under 3 TiB."""
    m, c = CAT.model("kimi-k2"), CAT.cluster("24-1")
    floor = memory_floor(m, c, replace(make_settings(m), optimizer_offload=True))
    assert floor.per_param == 6.0
    assert 1.0e12 <= floor.params <= 1.06e12
    assert floor.usable < 3 * 2**40 < floor.need
    assert not floor.fits
