"""Predicted against measured peak memory, and the allocator-fragmentation term judged on unseen models.

A measured peak is compared with the quantity it is: ``allocated`` rows with the itemized allocator peak
of the hottest stage, ``reserved`` rows with that peak times the fragmentation term, ``device`` rows
(nvidia-smi) with the device-level total (:class:`hapmoe_milp.cost.memory.MemoryModel`). A row whose
source does not say which GPU its figure is (``peak_memory_rank: any``) is compared only where every rank
holds the same (one pipeline stage); with several stages any reducer (a GPU, the mean, the max) lands
somewhere in the predicted stage range, so such a row is checked against that range and kept out of the
error summary -- a property of the row's convention, the same for every row that shares it. The one fitted
memory term, the fragmentation default, comes from measured reserved/allocated pairs; it is reported
leave-one-model-out (each model's pairs predicted with the median of the other models').
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hapmoe_milp.calibration.fidelity import PreparedRun
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.errors import SpecError
from hapmoe_milp.specs._fields import load_document


@dataclass(frozen=True)
class MemoryResult:
    id: str
    model: str
    kind: str  # allocated / reserved / device
    measured_gib: float
    predicted_gib: float
    fits: bool
    stage: int
    items_gib: dict[str, float]
    source: str = ""
    rank: str = "hottest"  # the row's peak_memory_rank
    lowest_gib: float = math.nan  # the least loaded stage, same convention
    stages: int = 1

    @property
    def error(self) -> float:
        return (self.predicted_gib - self.measured_gib) / self.measured_gib

    @property
    def comparable(self) -> bool:
        """The measured figure is a known rank's, or every rank holds the same (one stage)."""
        return self.rank == "hottest" or self.stages == 1

    @property
    def in_stage_range(self) -> bool:
        """The measured figure lies between the least and the most loaded predicted stage."""
        return self.lowest_gib <= self.measured_gib <= self.predicted_gib

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "kind": self.kind,
            "measured_gib": self.measured_gib,
            "predicted_gib": self.predicted_gib,
            "error": self.error,
            "fits": self.fits,
            "stage": self.stage,
            "items_gib": self.items_gib,
            "source": self.source,
            "rank": self.rank,
            "lowest_gib": self.lowest_gib,
            "stages": self.stages,
            "comparable": self.comparable,
        }


def predict_memory(pr: PreparedRun) -> MemoryResult:
    """The run's hottest stage in the measured quantity's convention."""
    if pr.run.peak_memory_gib is None:
        raise SpecError("has no peak_memory_gib", source=pr.run.origin, field=f"run {pr.run.id}")
    est = estimate(pr.model, pr.cluster, pr.plan, pr.settings)
    kind = pr.run.peak_memory_kind

    def value(s: dict[str, Any]) -> float:
        if kind == "allocated":
            return float(s["allocated_gib"])
        if kind == "reserved":
            return float(s["allocated_gib"] + s["memory_items_gib"]["fragmentation"])
        return float(s["memory_gib"])

    hot = max(est.stages, key=value)
    cold = min(est.stages, key=value)
    return MemoryResult(
        id=pr.run.id,
        model=pr.model.name,
        kind=kind,
        measured_gib=pr.run.peak_memory_gib,
        predicted_gib=value(hot),
        fits=est.fits,
        stage=int(hot["index"]),
        items_gib=dict(hot["memory_items_gib"]),
        source=pr.run.source,
        rank=pr.run.peak_memory_rank,
        lowest_gib=value(cold),
        stages=len(est.stages),
    )


@dataclass(frozen=True)
class MemorySummary:
    runs: int
    mape: float
    worst: float
    worst_id: str
    bias: float

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "mape": self.mape, "worst_abs_error": self.worst, "worst_run": self.worst_id,
                "mean_error": self.bias}  # fmt: skip


def summarize_memory(results: Sequence[MemoryResult]) -> MemorySummary:
    if not results:
        return MemorySummary(0, math.nan, math.nan, "", math.nan)
    errs = [r.error for r in results]
    wi = max(range(len(errs)), key=lambda i: abs(errs[i]))
    return MemorySummary(
        runs=len(errs),
        mape=sum(abs(e) for e in errs) / len(errs),
        worst=abs(errs[wi]),
        worst_id=results[wi].id,
        bias=sum(errs) / len(errs),
    )


# ---------------------------------------------------------------------- allocator fragmentation
@dataclass(frozen=True)
class AllocatorPair:
    model: str
    id: str
    allocated: float
    reserved: float
    source: str

    @property
    def fragmentation(self) -> float:
        return self.reserved / self.allocated - 1.0


def load_allocator_pairs(path: str | Path) -> list[AllocatorPair]:
    """The ``allocator_pairs.pairs`` list of a memory runs file."""
    doc = load_document(path)
    raw = (doc.get("allocator_pairs") or {}).get("pairs") or []
    out = []
    for i, d in enumerate(raw):
        try:
            p = AllocatorPair(
                str(d["model"]), str(d["id"]), float(d["allocated"]), float(d["reserved"]), str(d["source"])
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecError(f"needs model, id, allocated, reserved and source ({exc})", source=str(path),
                            field=f"allocator_pairs.pairs[{i}]") from None  # fmt: skip
        if not 0 < p.allocated <= p.reserved:
            raise SpecError("needs 0 < allocated <= reserved", source=str(path), field=f"allocator_pairs.pairs[{i}]")
        out.append(p)
    return out


def fragmentation_estimate(pairs: Sequence[AllocatorPair]) -> float:
    """The median over models of each model's median ``reserved / allocated - 1``: one number per model, so
    a model measured at many ranks does not outvote the others."""
    per: dict[str, list[float]] = {}
    for p in pairs:
        per.setdefault(p.model, []).append(p.fragmentation)
    return statistics.median(statistics.median(v) for v in per.values())


def fragmentation_leave_one_model_out(pairs: Sequence[AllocatorPair]) -> list[tuple[AllocatorPair, float, float]]:
    """Per pair: (pair, the estimate from the other models, the relative error of the predicted reserved
    peak ``allocated * (1 + estimate)`` against the measured one)."""
    out = []
    for p in pairs:
        rest = [q for q in pairs if q.model != p.model]
        f = fragmentation_estimate(rest)
        out.append((p, f, (p.allocated * (1 + f) - p.reserved) / p.reserved))
    return out
