"""Stage totals from per-layer coefficients: the single assembly used by `estimate` and the search.

A stage's forward/backward time, memory and sync are sums of per-layer-kind coefficients times the
number of layers of that kind, plus edge terms (embedding on the first stage, head on the last). The
instance builder exports exactly these coefficients to the solvers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from hapmoe_milp.config import ParallelConfig, Recompute, parse_recompute
from hapmoe_milp.cost.memory import StateBytes
from hapmoe_milp.cost.model import CostModel, LayerCost
from hapmoe_milp.cost.pipeline import in_flight
from hapmoe_milp.specs.model import LayerKind


@dataclass(frozen=True)
class StageTotals:
    fwd: float
    bwd: float
    p2p_out: float
    compute: float
    tp: float
    cp: float
    ep: float
    memory: float
    capacity: float
    weights: float
    activations: float
    rs: float
    ag: float
    opt: float
    host: float = 0.0  # launch-bound excess and syncs, inside fwd/bwd
    sync: float = 0.0  # exposed DP sync + optimizer after the last micro-batch (CostModel.exposed_sync)
    allocated: float = 0.0  # bytes of live tensors at the peak (torch max_memory_allocated)
    budget: float = 0.0  # the most allocated bytes that fit (MemoryModel.budget): fits iff allocated <= budget
    items: dict[str, float] = field(default_factory=dict, compare=False)  # itemized device memory, bytes

    @property
    def fits(self) -> bool:
        """The planner's feasibility test, exactly as the search applies it."""
        return self.allocated <= self.budget

    @property
    def tau(self) -> float:
        """Per-micro-batch time including the outgoing boundary's two transfers (activation out, gradient in)."""
        return self.fwd + self.bwd + 2 * self.p2p_out


def stage_edge(cm: CostModel, did: str, cfg: ParallelConfig, b: int, *, first: bool, last: bool) -> LayerCost | None:
    """The edge term of a stage: the embedding (first), the head (last), both as one term at PP = 1 (tied
    embeddings are one matrix there: :meth:`CostModel.single_edge`), or none (a middle stage)."""
    if first and last:
        return cm.single_edge(did, cfg, b)
    if first:
        return cm.first_edge(did, cfg, b)
    return cm.last_edge(did, cfg, b) if last else None


def kind_counts(kinds: tuple[LayerKind, ...], start: int, end: int) -> Counter[LayerKind]:
    return Counter(kinds[start:end])


def stage_totals(
    cm: CostModel,
    did: str,
    cfg: ParallelConfig,
    b: int,
    recompute: Recompute,
    counts: Mapping[LayerKind, int],
    *,
    index: int,
    pp: int,
    num_microbatches: int,
    vpp: int = 1,
    p2p_out: float = 0.0,
    full_counts: Mapping[LayerKind, int] | None = None,
) -> StageTotals:
    """One stage's totals. ``full_counts``: under block recompute (``full:K``), the layers of each kind
    that the first K of every chunk cover (:func:`block_full_counts`)."""
    spec = parse_recompute(recompute)
    full_counts = full_counts or {}
    if spec.granularity == "full" and spec.method == "block" and spec.num_layers > 0:
        # block recompute of the first K layers per chunk: those price as full, the rest as none
        parts = [(cm.layer(did, cfg, b, k, "full"), n) for k, n in full_counts.items() if n]
        parts += [(cm.layer(did, cfg, b, k, "none"), n - full_counts.get(k, 0)) for k, n in counts.items()]
        parts = [(c, n) for c, n in parts if n]
    else:
        parts = [(cm.layer(did, cfg, b, k, recompute), n) for k, n in counts.items() if n]
    edge = stage_edge(cm, did, cfg, b, first=index == 0, last=index == pp - 1)
    if edge is not None:
        parts.append((edge, 1))
    infl = in_flight(index, pp, num_microbatches, vpp)

    def total(attr: str) -> float:
        return sum(getattr(c, attr) * n for c, n in parts)

    weights = total("weights")
    fwd, bwd, rs, ag, opt = total("fwd"), total("bwd"), total("rs"), total("ag"), total("opt")
    acts = infl * total("act")
    fixed = cm.fixed_memory(did, cfg, b) + (edge.work if edge is not None else 0.0)
    allocated = weights + acts + fixed
    state = StateBytes()
    for c, n in parts:
        state = state + c.state.scaled(n)
    mm = cm.memory_model(did)
    items = {**state.to_dict(), "activations": acts, "working": fixed}
    items = mm.items(items, cfg)
    return StageTotals(
        fwd=fwd,
        bwd=bwd,
        p2p_out=p2p_out,
        compute=total("compute"),
        tp=total("tp"),
        cp=total("cp"),
        ep=total("ep"),
        memory=mm.device_total(allocated, cfg),
        capacity=mm.usable(),
        weights=weights,
        activations=acts,
        rs=rs,
        ag=ag,
        opt=opt,
        host=total("host"),
        sync=cm.exposed_sync(did, rs, ag, fwd, bwd, opt),
        allocated=allocated,
        budget=cm.capacity(did, cfg),
        items=items,
    )


def block_full_counts(
    kinds: tuple[LayerKind, ...], start: int, end: int, vpp: int, num_layers: int
) -> Counter[LayerKind]:
    """Kinds of the layers block recompute (``--recompute-method block --recompute-num-layers K``) covers
    in a stage holding layers ``[start, end)``: the first K of each of its ``vpp`` chunks (the stage's
    range split into ``vpp`` contiguous chunks, as the cost model prices interleaved stages)."""
    n = end - start
    out: Counter[LayerKind] = Counter()
    base, extra = divmod(n, vpp)
    pos = start
    for c in range(vpp):
        size = base + (1 if c < extra else 0)
        out.update(kinds[pos : pos + min(num_layers, size)])
        pos += size
    return out
