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
    res = [predict_memory(r) for r in rows]
    sm = summarize_memory(res)
    by_kind = {k: summarize_memory([r for r in res if r.kind == k]) for k in sorted({r.kind for r in res})}
    pairs = load_allocator_pairs(memory_runs)
    frag = fragmentation_estimate(pairs)
    loo = fragmentation_leave_one_model_out(pairs)
    loo_mape = sum(abs(e) for _, _, e in loo) / len(loo)
    loo_worst = max(loo, key=lambda x: abs(x[2]))
    # every calibration run that really ran must be predicted to fit under its own settings
    ran = [prepare(r, catalog) for r in load_runs(time_runs)]
    not_fit = [pr.run.id for pr in ran if not estimate(pr.model, pr.cluster, pr.plan, pr.settings).fits]
    lines = [
        "## Memory fidelity on public measured peaks",
        "",
        f"Command: `{command}` — {sm.runs} runs of `{memory_runs.name}` with measured peaks "
        f"({', '.join(f'{k}: {v.runs}' for k, v in by_kind.items())}); device tables as shipped.",
        "",
        "Each row is compared in its own convention: *allocated* = live tensors at the peak "
        "(`torch.cuda.max_memory_allocated`, Megatron's `max allocated`), *device* = nvidia-smi use (allocated × "
        "(1 + fragmentation) + context + DeepEP buffers). Error = (predicted − measured) / measured, hottest stage.",
        "",
        f"- **Memory MAPE {sm.mape:.1%}, worst {sm.worst:.1%}** ({sm.worst_id}), mean error {pct(sm.bias)}.",
        *(f"- {k}: {v.runs} runs, MAPE {v.mape:.1%}, worst {v.worst:.1%} ({v.worst_id})." for k, v in by_kind.items()),
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
                    r.stage,
                    fx(sum(r.items_gib[k] for k in ("params", "fp8_weights", "grads", "main_params", "optimizer")), 1),
                    fx(r.items_gib["activations"], 1),
                    fx(r.items_gib["working"], 1),
                ]
                for r in res
            ],
        ),
    ]
    return "\n".join(lines)
