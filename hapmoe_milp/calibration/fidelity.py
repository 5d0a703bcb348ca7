"""Predicted against measured: per-run error with the cost breakdown, and the summary a user checks.

A measured run is turned into the same Plan and Settings that ``estimate`` would build from its launch
knobs, then priced by the cost model, so fidelity judges exactly what the planner optimises.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hapmoe_milp.calibration.runs import MeasuredRun
from hapmoe_milp.config import Settings, make_settings
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.errors import HapmoeError, SpecError
from hapmoe_milp.knobs import plan_from_knobs
from hapmoe_milp.limits import RANGE_STEP_TIME_S
from hapmoe_milp.plan import Plan, check_plan
from hapmoe_milp.specs.catalog import Catalog
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.model import ModelSpec

#: Same-model pairs whose measured throughputs differ by less than this are ties, not rankings to check.
TIE_TOLERANCE = 0.03


@dataclass(frozen=True)
class PreparedRun:
    """A run resolved once (model, cluster, plan, settings), so a fit can re-price it many times."""

    run: MeasuredRun
    model: ModelSpec
    cluster: ClusterSpec
    plan: Plan
    settings: Settings

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.device for s in self.plan.stages))

    @property
    def measured_s(self) -> float:
        return self.run.step_time_s(self.cluster.world_size)

    @property
    def config_key(self) -> str:
        """What the cost model sees of the run: two runs with equal keys cannot be told apart by it."""
        p = self.plan
        stages = [(s.device, s.cfg, s.layer_start, s.layer_end, s.recompute) for s in p.stages]
        return repr((self.model.name, self.cluster.name, stages, p.vpp, self.settings))


def prepare(run: MeasuredRun, catalog: Catalog) -> PreparedRun:
    where = f"{run.origin}: run {run.id}" if run.origin else f"run {run.id}"
    try:
        m = catalog.model(run.model)
        if run.model_fields:  # the run's own model flags (e.g. tied embeddings its script left at the default)
            m = replace(m, **run.model_fields)
        c = catalog.cluster(run.cluster)
        st = make_settings(m, None, **run.settings_kw())
        plan = plan_from_knobs(
            m,
            c,
            st,
            tp=run.tp,
            pp=run.pp,
            cp=run.cp,
            ep=run.ep,
            etp=run.etp,
            vpp=run.vpp,
            recompute=run.recompute,
            layout=run.layout,
        )
        check_plan(plan, m, c, where)
    except HapmoeError as exc:
        raise type(exc)(f"{where}: {exc}") from None
    pr = PreparedRun(run, m, c, plan, st)
    lo, hi = RANGE_STEP_TIME_S
    # memory-only rows (a peak, no step time) have nothing to range-check
    if (
        run.has_time and not lo <= pr.measured_s <= hi
    ):  # tokens/s in range can still mean a step of microseconds or years
        raise SpecError(
            f"{run.measure} {run.value:g} means a step of {pr.measured_s:.3g} s on {c.world_size} devices, outside "
            f"the physical range [{lo:g}, {hi:g}] s",
            source=where,
            field=run.measure,
        )
    return pr


def with_devices(cluster: ClusterSpec, devices: Mapping[str, DeviceSpec]) -> ClusterSpec:
    """The cluster with some device types' tables replaced (e.g. by a calibration candidate)."""
    if not devices:
        return cluster
    groups = tuple(replace(g, device=devices.get(g.device.id, g.device)) for g in cluster.groups)
    return replace(cluster, groups=groups)


@dataclass(frozen=True)
class RunResult:
    id: str
    model: str
    devices: tuple[str, ...]
    world_size: int
    measured_s: float
    predicted_s: float
    fits: bool
    breakdown: dict[str, float]
    memory_gib: float
    measured_memory_gib: float | None
    source: str = ""
    config_key: str = ""

    @property
    def error(self) -> float:
        """Relative error of the predicted step time, (predicted - measured) / measured."""
        return (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def tokens_per_s_per_device(self) -> tuple[float, float]:
        """(measured, predicted) throughput per device; GBS x sequence cancels in every comparison."""
        return 1.0 / (self.measured_s * self.world_size), 1.0 / (self.predicted_s * self.world_size)

    @property
    def memory_error(self) -> float | None:
        """Relative error of the predicted peak memory (largest stage), when the run measured it."""
        if self.measured_memory_gib is None:
            return None
        return (self.memory_gib - self.measured_memory_gib) / self.measured_memory_gib

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "devices": list(self.devices),
            "world_size": self.world_size,
            "measured_step_s": self.measured_s,
            "predicted_step_s": self.predicted_s,
            "error": self.error,
            "fits": self.fits,
            "memory_gib": self.memory_gib,
            "measured_memory_gib": self.measured_memory_gib,
            "memory_error": self.memory_error,
            "breakdown": self.breakdown,
            "source": self.source,
        }


def predict(pr: PreparedRun, devices: Mapping[str, DeviceSpec] | None = None) -> RunResult:
    cluster = with_devices(pr.cluster, devices or {})
    est = estimate(pr.model, cluster, pr.plan, pr.settings)
    return RunResult(
        id=pr.run.id,
        model=pr.model.name,
        devices=pr.devices,
        world_size=pr.cluster.world_size,
        measured_s=pr.measured_s,
        predicted_s=est.iteration_time_s,
        fits=est.fits,
        breakdown=dict(est.breakdown),
        memory_gib=max(s["memory_gib"] for s in est.stages),
        measured_memory_gib=pr.run.peak_memory_gib,
        source=pr.run.source,
        config_key=pr.config_key,
    )


@dataclass(frozen=True)
class PairCheck:
    a: str
    b: str
    measured_ratio: float  # throughput a / b, measured
    predicted_ratio: float

    @property
    def agrees(self) -> bool:
        return (self.measured_ratio > 1) == (self.predicted_ratio > 1)


def pairs(results: Sequence[RunResult], tie: float = TIE_TOLERANCE) -> list[PairCheck]:
    """Every two runs of one model on one hardware type, unless measured within ``tie`` of each other or
    identical as far as the cost model sees (same plan and settings: no model of the layout ranks them)."""
    out: list[PairCheck] = []
    for i, a in enumerate(results):
        for b in results[i + 1 :]:
            if a.model != b.model or a.devices != b.devices:
                continue
            if a.config_key and a.config_key == b.config_key:
                continue
            (ma, pa), (mb, pb) = a.tokens_per_s_per_device, b.tokens_per_s_per_device
            if abs(ma / mb - 1) < tie:
                continue
            out.append(PairCheck(a.id, b.id, ma / mb, pa / pb))
    return out


@dataclass(frozen=True)
class Summary:
    runs: int
    mape: float
    worst: float
    worst_id: str
    bias: float  # mean signed error
    pairs: int
    pairs_agree: int
    per_device: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "mape": self.mape,
            "worst_abs_error": self.worst,
            "worst_run": self.worst_id,
            "mean_error": self.bias,
            "pairs": self.pairs,
            "pairs_ranked_right": self.pairs_agree,
            "per_device": self.per_device,
        }


def summarize(results: Sequence[RunResult], errors: Sequence[float] | None = None) -> Summary:
    """MAPE, worst case and pair ranking; ``errors`` replaces the per-run errors (e.g. leave-one-out)."""
    errs = list(errors) if errors is not None else [r.error for r in results]
    if not errs:
        return Summary(0, math.nan, math.nan, "", math.nan, 0, 0)
    absd = [abs(e) for e in errs]
    wi = max(range(len(absd)), key=absd.__getitem__)
    per: dict[str, list[float]] = {}
    for r, e in zip(results, errs, strict=True):
        per.setdefault("+".join(r.devices), []).append(e)
    adjusted = [replace(r, predicted_s=r.measured_s * (1 + e)) for r, e in zip(results, errs, strict=True)]
    pc = pairs(adjusted)
    return Summary(
        runs=len(errs),
        mape=sum(absd) / len(absd),
        worst=absd[wi],
        worst_id=results[wi].id,
        bias=sum(errs) / len(errs),
        pairs=len(pc),
        pairs_agree=sum(p.agrees for p in pc),
        per_device={
            d: {"runs": len(v), "mape": sum(abs(x) for x in v) / len(v), "worst": max(abs(x) for x in v)}
            for d, v in sorted(per.items())
        },
    )
