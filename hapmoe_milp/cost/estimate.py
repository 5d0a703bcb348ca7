"""Evaluate a plan: iteration time (closed form or simulated), memory per stage, metrics, breakdown."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hapmoe_milp.config import Settings, parse_recompute
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.cost.pipeline import closed_form, simulate
from hapmoe_milp.cost.primitives import GIB
from hapmoe_milp.cost.stage import StageTotals, block_full_counts, kind_counts, stage_totals
from hapmoe_milp.plan import Plan
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec


@dataclass(frozen=True)
class Estimate:
    iteration_time_s: float
    pipeline_s: float
    sync_s: float
    tokens_per_s: float
    tokens_per_s_per_device: float
    model_tflops_per_device: float
    mfu: float
    fits: bool
    devices: int
    stages: tuple[dict[str, Any], ...]
    breakdown: dict[str, float]
    simulated: bool = False
    closed_form_s: float = 0.0
    totals: tuple[StageTotals, ...] = field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "iteration_time_s": self.iteration_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_device": self.tokens_per_s_per_device,
            "model_tflops_per_device": self.model_tflops_per_device,
            "mfu": self.mfu,
            "fits": self.fits,
            "devices": self.devices,
            "pipeline_s": self.pipeline_s,
            "sync_s": self.sync_s,
            "simulated": self.simulated,
            "closed_form_s": self.closed_form_s,
            "stages": list(self.stages),
            "breakdown": self.breakdown,
        }

    def worst_memory(self) -> dict[str, Any] | None:
        over = [s for s in self.stages if not s["fits"]]
        return max(over, key=lambda s: s["memory_gib"] - s["capacity_gib"]) if over else None


def plan_stage_totals(cm: CostModel, plan: Plan) -> list[StageTotals]:
    kinds = cm.model.layer_kinds
    out: list[StageTotals] = []
    M = plan.num_microbatches
    for i, s in enumerate(plan.stages):
        b = plan.stage_micro_batch(i)
        spec = parse_recompute(s.recompute)
        full = None
        if spec.granularity == "full" and spec.method == "block" and spec.num_layers > 0:
            full = block_full_counts(kinds, s.layer_start, s.layer_end, plan.vpp, spec.num_layers)
        p2p = 0.0
        if i + 1 < plan.pp:
            nxt = plan.stages[i + 1]
            p2p = cm.boundary_p2p(s.device, s.cfg, b, nxt.device, nxt.devices, plan.vpp)
        out.append(
            stage_totals(
                cm,
                s.device,
                s.cfg,
                b,
                s.recompute,
                kind_counts(kinds, s.layer_start, s.layer_end),
                index=i,
                pp=plan.pp,
                num_microbatches=M,
                vpp=plan.vpp,
                p2p_out=p2p,
                full_counts=full,
            )
        )
    return out


def estimate(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: Plan,
    settings: Settings | None = None,
    *,
    simulate_schedule: bool = False,
    cost_model: CostModel | None = None,
) -> Estimate:
    st = plan.settings(settings)
    cm = cost_model or CostModel(model, cluster, st)
    totals = plan_stage_totals(cm, plan)
    M = plan.num_microbatches
    taus = [t.tau for t in totals]
    pipe_cf = closed_form(taus, M, plan.vpp)
    sync = [t.sync for t in totals]
    t_cf = pipe_cf + max(sync)
    if simulate_schedule:
        delays = [0.0] + [t.p2p_out / plan.vpp for t in totals[:-1]]  # one hop per chunk
        tl = simulate([t.fwd for t in totals], [t.bwd for t in totals], delays, M, plan.vpp)
        pipe = tl.makespan
        t_iter = max(end + y for end, y in zip(tl.stage_end, sync, strict=True))
    else:
        pipe = pipe_cf
        t_iter = t_cf
    tokens = plan.global_batch_size * plan.seq_length
    devices = plan.devices_used
    peak = sum(cluster.device(s.device).dense_peak_tflops * s.devices for s in plan.stages)
    flops = model.flops_per_token(plan.seq_length) * tokens
    stages: list[dict[str, Any]] = []
    busy_max = max(taus) if taus else 0.0
    for i, (s, t) in enumerate(zip(plan.stages, totals, strict=True)):
        stages.append(
            {
                "index": i,
                "device": s.device,
                "devices": s.devices,
                "tp": s.cfg.tp,
                "cp": s.cfg.cp,
                "dp": s.cfg.dp,
                "ep": s.cfg.ep,
                "etp": s.cfg.etp,
                "recompute": s.recompute,
                "layers": s.num_layers,
                "layer_range": [s.layer_start, s.layer_end],
                "micro_batch": plan.stage_micro_batch(i),
                "forward_s": t.fwd,
                "backward_s": t.bwd,
                "p2p_out_s": t.p2p_out,
                "stage_time_s": t.tau,
                "memory_gib": t.memory / GIB,
                "capacity_gib": t.capacity / GIB,
                "allocated_gib": t.allocated / GIB,
                "fits": t.fits,
                "memory_items_gib": {k: v / GIB for k, v in t.items.items()},
                "weights_gib": t.weights / GIB,
                "activations_gib": t.activations / GIB,
                "sync_exposed_s": sync[i],
                "bottleneck": t.tau == busy_max,
            }
        )
    worst = max(range(len(totals)), key=lambda i: taus[i])
    bt = totals[worst]
    breakdown = {
        "compute": M * bt.compute,
        "host": M * bt.host,
        "tp": M * bt.tp,
        "cp": M * bt.cp,
        "ep": M * bt.ep,
        "pp_p2p": M * 2 * bt.p2p_out,
        "dp_sync": max(sync) - totals[sync.index(max(sync))].opt,
        "optimizer": totals[sync.index(max(sync))].opt,
    }
    breakdown["bubble"] = max(0.0, t_iter - sum(breakdown.values()))
    return Estimate(
        iteration_time_s=t_iter,
        pipeline_s=pipe,
        sync_s=max(sync),
        tokens_per_s=tokens / t_iter,
        tokens_per_s_per_device=tokens / t_iter / devices,
        model_tflops_per_device=flops / t_iter / devices / 1e12,
        mfu=flops / (t_iter * peak * 1e12),
        fits=all(t.fits for t in totals),
        devices=devices,
        stages=tuple(stages),
        breakdown=breakdown,
        simulated=simulate_schedule,
        closed_form_s=t_cf,
        totals=tuple(totals),
    )
