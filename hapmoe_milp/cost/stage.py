"""Stage totals from per-layer coefficients: the single assembly used by `estimate` and the search.

A stage's forward/backward time, memory and sync are sums of per-layer-kind coefficients times the
number of layers of that kind, plus edge terms (embedding on the first stage, head on the last). The
instance builder exports exactly these coefficients to the solvers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from hapmoe_milp.config import ParallelConfig, Recompute
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

    @property
    def tau(self) -> float:
        """Per-micro-batch time including the outgoing boundary's two transfers (activation out, gradient in)."""
        return self.fwd + self.bwd + 2 * self.p2p_out


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
) -> StageTotals:
    parts: list[tuple[LayerCost, int]] = [(cm.layer(did, cfg, b, k, recompute), n) for k, n in counts.items() if n]
    if index == 0:
        parts.append((cm.first_edge(did, cfg, b), 1))
    if index == pp - 1:
        parts.append((cm.last_edge(did, cfg, b), 1))
    infl = in_flight(index, pp, num_microbatches, vpp)

    def total(attr: str) -> float:
        return sum(getattr(c, attr) * n for c, n in parts)

    weights = total("weights")
    fwd, bwd, rs, ag, opt = total("fwd"), total("bwd"), total("rs"), total("ag"), total("opt")
    acts = infl * total("act")
    fixed = cm.fixed_memory(did, cfg, b) + (cm.last_edge(did, cfg, b).work if index == pp - 1 else 0.0)
    return StageTotals(
        fwd=fwd,
        bwd=bwd,
        p2p_out=p2p_out,
        compute=total("compute"),
        tp=total("tp"),
        cp=total("cp"),
        ep=total("ep"),
        memory=weights + acts + fixed,
        capacity=cm.capacity(did),
        weights=weights,
        activations=acts,
        rs=rs,
        ag=ag,
        opt=opt,
        host=total("host"),
        sync=cm.exposed_sync(did, rs, ag, fwd, bwd, opt),
    )
