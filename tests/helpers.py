"""Helpers several test modules share: synthetic devices and clusters with round numbers (the cost
model's closed forms can be checked by hand on them), tiny models for fast solver tests, and the rule of
which plans the DP interleaves. Test modules import from here, never from each other.
"""

from __future__ import annotations

from dataclasses import replace

from hapmoe_milp.specs import Catalog, ClusterSpec, ModelSpec, NodeGroup
from hapmoe_milp.specs.device import PRIMITIVES, DeviceSpec, IntraNode
from hapmoe_milp.specs.memory_terms import MemoryTerms
from hapmoe_milp.specs.model import TrainingDefaults
from hapmoe_milp.specs.runtime import RuntimeParams
from hapmoe_milp.specs.tables import constant_table

# ---------------------------------------------------------------------- a synthetic device with round numbers
PEAK = 100e12  # bf16 FLOP/s
FP8_PEAK = 200e12
EFF = 0.5  # GEMM efficiency
AEFF_F, AEFF_B = 0.4, 0.25  # attention core forward / backward efficiency
HUGE_BW = 1e12  # GB/s: element-wise work vanishes (relative 1e-9)
INTRA = {"all_reduce": 100.0, "all_gather": 200.0, "reduce_scatter": 250.0, "all_to_all": 50.0, "p2p": 400.0}
INTER = {"all_reduce": 10.0, "all_gather": 20.0, "reduce_scatter": 25.0, "all_to_all": 5.0, "p2p": 40.0}


def synthetic_device(
    *,
    mem_GBps: float = HUGE_BW,
    mbe: float = 1.0,
    intra: dict[str, float] | None = None,
    inter: dict[str, float] | None = None,
    fabric: str = "switch",
    memory_gib: float = 1e6,
    gemm_eff: float = EFF,
    attn_eff: tuple[float, float] = (AEFF_F, AEFF_B),
) -> DeviceSpec:
    ib, xb = intra or INTRA, inter or INTER
    return DeviceSpec(
        id="syn",
        name="synthetic",
        vendor="test",
        provenance="datasheet+public-benchmarks",
        memory_gib=memory_gib,
        memory_bandwidth_GBps=mem_GBps,
        peak_tflops={"bf16": PEAK / 1e12, "fp8": FP8_PEAK / 1e12},
        devices_per_node=8,
        intra=IntraNode(fabric, 350.0, 50.0 if fabric == "mesh" else 350.0),
        nic_Gbps=400.0,
        gemm_efficiency=constant_table(gemm_eff),
        attention_efficiency=constant_table(attn_eff[0]),
        attention_bwd_efficiency=constant_table(attn_eff[1]),
        runtime=replace(
            RuntimeParams.roofline(memory_efficiency=mbe),
            a2a_intra_GBps=ib["all_to_all"],
            a2a_inter_GBps=xb["all_to_all"],
            flex_intra_GBps=2 * ib["all_to_all"],
            flex_inter_GBps=2 * xb["all_to_all"],
        ),
        collectives={
            "intra": {p: constant_table(ib[p]) for p in PRIMITIVES},
            "inter": {p: constant_table(xb[p]) for p in PRIMITIVES},
        },
    )


def synthetic_cluster(dev: DeviceSpec | None = None, nodes: int = 2) -> ClusterSpec:
    return ClusterSpec(name="syn", groups=(NodeGroup(dev or synthetic_device(), nodes, 8),))


def dense_mha(**kw) -> ModelSpec:
    """h 1024, 8 heads of 128 (MHA), F 4096, non-gated: Korthikanti's / Megatron's textbook layer."""
    base = dict(
        name="dense-mha",
        num_layers=8,
        hidden_size=1024,
        num_attention_heads=8,
        vocab_size=32000,
        ffn_hidden_size=4096,
        swiglu=False,
    )
    return ModelSpec(**(base | kw))


def tiny_moe(**kw) -> ModelSpec:
    """h 1024, 8 heads, GQA with 2 groups of 128, 8 experts top-2 of width 2048, SwiGLU."""
    base = dict(
        name="tiny-moe",
        num_layers=8,
        hidden_size=1024,
        num_attention_heads=8,
        num_query_groups=2,
        kv_channels=128,
        vocab_size=32000,
        ffn_hidden_size=4096,
        num_experts=8,
        moe_router_topk=2,
        moe_ffn_hidden_size=2048,
    )
    return ModelSpec(**(base | kw))


# ---------------------------------------------------------------------- tiny models and clusters for solver tests
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
    """Partial nodes of catalog devices, optionally with memory shrunk so the memory constraint binds.

    The host-CPU bound is switched off (``call_us`` 0): a tiny model's calls do not shrink with its shapes, so
    every span would be host-bound and the cost landscape these search tests were sized for would flatten
    (tests/test_cost_host_bound.py prices the bound itself)."""
    groups = []
    for did, n, mem in spec:
        dev = catalog.device(did)
        dev = replace(dev, runtime=replace(dev.runtime, call_us=0.0))
        if mem is not None:
            # the capacity these tests were sized for: `mem` less 5 % and a 2 GiB framework overhead, with no
            # allocator slack or DeepEP buffers (cost/memory.py's device terms), so the constraint binds as set
            dev = replace(
                dev, memory_gib=mem * 0.95, memory=MemoryTerms(fragmentation=0.0, context_gib=2.0, flex_buffer_gib=0.0)
            )
        groups.append(NodeGroup(dev, 1, n))
    return ClusterSpec(name="+".join(f"{n}x{d}" for d, n, _ in spec), groups=tuple(groups))


# ---------------------------------------------------------------------- which plans the DP interleaves
def lead_block(model) -> int | None:
    """Leading decoder layers of another kind than the rest (None: more mixed than one leading block)."""
    dec = [k for k in model.layer_kinds if k != "mtp"]
    rest = len(dec)
    while rest and dec[rest - 1] == dec[-1]:
        rest -= 1
    return rest if len(set(dec[:rest])) <= 1 else None


def interleavable(model, counts: list[int], v: int, m: int) -> bool:
    """The interleaved plans the DP searches (its docstrings state the rule): Megatron's ``P > 1`` and
    ``M % P == 0``, a layer in every virtual chunk except that the first rank's first chunk may hold the
    embedding alone and, without MTP, the last rank's last chunk the loss alone (Megatron's ``E|...|L``
    layouts; with MTP the last rank fits its MTP layers after ``v - 1`` decoder layers), and a layer
    sequence whose chunks price like the stage's contiguous range (a leading block in the first chunk)."""
    p = len(counts)
    lead = lead_block(model)
    mtp = sum(1 for k in model.layer_kinds if k == "mtp")
    if p < 2 or m % p or lead is None:
        return False
    if any(c < v for c in counts[1:-1]) or counts[-1] < (v + mtp - 1 if mtp else v - 1):
        return False
    if lead:
        return counts[0] >= v and -(-counts[0] // v) >= lead
    return counts[0] >= v - 1


class StopAfter:
    """A deadline checkpoint (``hapmoe_milp.deadline.Checkpoint``) that lets ``n`` checks pass and stops at
    the next one: a deadline falling part-way through some work, whatever the machine's speed. ``checks``
    counts the checks made."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.checks = 0

    def check(self, what: str) -> None:
        from hapmoe_milp.deadline import TimeLimitReached

        self.checks += 1
        if self.checks > self.n:
            raise TimeLimitReached(what)


def count_pricing(monkeypatch) -> dict[str, int]:
    """Count the layers asked of any cost model (``CostModel.layer``, memoised or not) from now on."""
    from hapmoe_milp.cost.model import CostModel

    calls = {"layer": 0}
    real = CostModel.layer

    def layer(self, *a, **kw):
        calls["layer"] += 1
        return real(self, *a, **kw)

    monkeypatch.setattr(CostModel, "layer", layer)
    return calls
