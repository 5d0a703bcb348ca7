"""The memory half of bench/fidelity.py: measured peaks vs the itemized memory model, the fragmentation
term leave-one-model-out, and whether every calibration run that really ran is predicted to fit."""

from __future__ import annotations

from pathlib import Path

from common import fx, table

from hapmoe_milp.calibration import load_runs, prepare
from hapmoe_milp.calibration.memory_fidelity import (
    fragmentation_estimate,
    fragmentation_leave_one_model_out,
    load_allocator_pairs,
    predict_memory,
    summarize_memory,
)
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs.memory_terms import MemoryTerms


def pct(x: float) -> str:
    return f"{x:+.1%}"


def memory_section(memory_runs: Path, time_runs: Path, catalog: Catalog, command: str) -> str:
    rows = [prepare(r, catalog) for r in load_runs(memory_runs)]
    every = [predict_memory(r) for r in rows]
    res = [r for r in every if r.comparable]
    apart = [r for r in every if not r.comparable]
    sm = summarize_memory(res)
    hottest_all = summarize_memory(every)
    by_kind = {k: summarize_memory([r for r in res if r.kind == k]) for k in sorted({r.kind for r in res})}
    pairs = load_allocator_pairs(memory_runs)
    frag = fragmentation_estimate(pairs)
    loo = fragmentation_leave_one_model_out(pairs)
    loo_mape = sum(abs(e) for _, _, e in loo) / len(loo)
    loo_worst = max(loo, key=lambda x: abs(x[2]))
    # every calibration run that really ran must be predicted to fit under its own settings
    ran = [prepare(r, catalog) for r in load_runs(time_runs)]
    not_fit = [pr.run.id for pr in ran if not estimate(pr.model, pr.cluster, pr.plan, pr.settings).fits]
    inside = [r for r in apart if r.in_stage_range]
    lines = [
        "## Memory fidelity on public measured peaks",
        "",
        f"Command: `{command}` — {len(every)} runs of `{memory_runs.name}` with measured peaks; {sm.runs} compared "
        f"({', '.join(f'{k}: {v.runs}' for k, v in by_kind.items())}), {len(apart)} whose GPU is not stated and "
        "whose stages differ reported apart; device tables as shipped.",
        "",
        "Each row is compared in its own convention: *allocated* = live tensors at the peak "
        "(`torch.cuda.max_memory_allocated`, Megatron's `max allocated`), *device* = nvidia-smi use (allocated × "
        "(1 + fragmentation) + context + DeepEP buffers). Error = (predicted − measured) / measured, hottest stage. "
        "A row marked `peak_memory_rank: any` (the source does not say which GPU, or which summary over GPUs, its "
        "figure is: every FlagPerf `mem` cell) is compared only where every rank holds the same (PP 1); with PP > 1 "
        "it is checked against the predicted stage range [least loaded, hottest] instead.",
        "",
        f"- **Memory MAPE {sm.mape:.1%}, worst {sm.worst:.1%}** ({sm.worst_id}), mean error {pct(sm.bias)}, "
        f"over the {sm.runs} compared runs.",
        *(f"- {k}: {v.runs} runs, MAPE {v.mape:.1%}, worst {v.worst:.1%} ({v.worst_id})." for k, v in by_kind.items()),
        f"- For comparison, every one of the {hottest_all.runs} runs against its hottest stage (the convention before "
        f"`peak_memory_rank`): MAPE {hottest_all.mape:.1%}, worst {hottest_all.worst:.1%} ({hottest_all.worst_id}).",
        f"- GPU not stated, stages differ: {len(apart)} runs; measured inside the predicted stage range for "
        f"{len(inside)} of {len(apart)}"
        + (f" (outside: {', '.join(r.id for r in apart if not r.in_stage_range)})" if len(inside) < len(apart) else "")
        + ".",
        f"- Allocator fragmentation (the one fitted memory term, `memory.fragmentation` in device tables): median "
        f"over {len({p.model for p in pairs})} models of {len(pairs)} measured reserved/allocated pairs = "
        f"{frag:.3f} (shipped default {MemoryTerms().fragmentation:.2f}; measured range "
        f"{min(p.fragmentation for p in pairs):.3f}-{max(p.fragmentation for p in pairs):.3f}). Leave-one-model-out "
        f"error of the predicted reserved peak: MAPE {loo_mape:.1%}, worst {abs(loo_worst[2]):.1%} ({loo_worst[0].id}).",
        f"- Calibration runs (`{time_runs.name}`) that really ran and are predicted not to fit under their own "
        f"settings: {len(not_fit)} of {len(ran)}" + (f" ({', '.join(not_fit)})" if not_fit else "") + ".",
        "",
        table(
            [
                "run",
                "model",
                "kind",
                "measured GiB",
                "predicted GiB",
                "error",
                "compared",
                "least loaded stage GiB",
                "stage",
                "state",
                "activations",
                "working",
            ],
            [
                [
                    r.id,
                    r.model,
                    r.kind,
                    fx(r.measured_gib),
                    fx(r.predicted_gib),
                    pct(r.error),
                    "yes" if r.comparable else ("in range" if r.in_stage_range else "outside range"),
                    fx(r.lowest_gib),
                    r.stage,
                    fx(sum(r.items_gib[k] for k in ("params", "fp8_weights", "grads", "main_params", "optimizer")), 1),
                    fx(r.items_gib["activations"], 1),
                    fx(r.items_gib["working"], 1),
                ]
                for r in every
            ],
        ),
    ]
    return "\n".join(lines)
