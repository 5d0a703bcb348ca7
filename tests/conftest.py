"""Shared fixtures: the shipped catalog and tiny models/clusters for fast solver tests."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hapmoe_milp.specs import Catalog, ClusterSpec, ModelSpec, NodeGroup
from hapmoe_milp.specs.memory_terms import MemoryTerms
from hapmoe_milp.specs.model import TrainingDefaults


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return Catalog()


def tiny_model(
    pattern: tuple[int, ...], *, experts: int = 4, hidden: int = 512, heads: int = 4, mtp: int = 0
) -> ModelSpec:
    """A small MoE (or dense, if the pattern is all zeros) model so cost evaluation is quick."""
    moe = any(pattern)
    return ModelSpec(
        name="tiny",
        num_layers=len(pattern),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=heads // 2,
        vocab_size=4096,
        ffn_hidden_size=4 * hidden,
        num_experts=experts if moe else None,
        moe_router_topk=2,
        moe_ffn_hidden_size=2 * hidden,
        moe_layer_freq=pattern if moe else 1,
        mtp_num_layers=mtp,
        defaults=TrainingDefaults(seq_length=1024, global_batch_size=8, micro_batch_size=1),
    )


def tiny_cluster(catalog: Catalog, spec: list[tuple[str, int, float | None]]) -> ClusterSpec:
    """Partial nodes of catalog devices, optionally with memory shrunk so the memory constraint binds."""
    groups = []
    for did, n, mem in spec:
        dev = catalog.device(did)
        if mem is not None:
            # the capacity these tests were sized for: `mem` less 5 % and a 2 GiB framework overhead, with no
            # allocator slack or DeepEP buffers (cost/memory.py's device terms), so the constraint binds as set
            dev = replace(
                dev, memory_gib=mem * 0.95, memory=MemoryTerms(fragmentation=0.0, context_gib=2.0, flex_buffer_gib=0.0)
            )
        groups.append(NodeGroup(dev, 1, n))
    return ClusterSpec(name="+".join(f"{n}x{d}" for d, n, _ in spec), groups=tuple(groups))
