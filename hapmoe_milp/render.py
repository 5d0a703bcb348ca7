"""Rich tables for the CLI (kept out of library code paths that return data)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _fmt_b(n: float) -> str:
    return f"{n / 1e9:.2f}B"


def models_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="Models")
    for col in ("name", "layers", "hidden", "experts", "top-k", "attention", "total", "active", "GFLOP/token"):
        t.add_column(col, justify="right" if col not in ("name", "attention") else "left")
    for r in rows:
        t.add_row(
            r["name"],
            str(r["layers"]) + (f"+{r['mtp_layers']}m" if r["mtp_layers"] else ""),
            str(r["hidden_size"]),
            str(r["experts"] or "-"),
            str(r["topk"] or "-"),
            r["attention"],
            _fmt_b(r["total_params"]),
            _fmt_b(r["active_params"]),
            f"{r['flops_per_token'] / 1e9:.1f}",
        )
    return t


def clusters_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="Clusters")
    for col in ("name", "devices", "composition", "BF16 PFLOP/s", "description"):
        t.add_column(col, justify="right" if col in ("devices", "BF16 PFLOP/s") else "left")
    for r in rows:
        t.add_row(r["name"], str(r["devices"]), r["composition"], f"{r['aggregate_bf16_pflops']:.2f}", r["description"])
    return t


def devices_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="Devices")
    cols = ("id", "name", "GiB", "BF16 TF", "FP8 TF", "fabric", "intra GB/s", "pair GB/s", "NIC Gb/s", "provenance")
    for col in cols:
        t.add_column(col)
    for r in rows:
        t.add_row(
            r["id"],
            r["name"],
            f"{r['memory_gib']:g}",
            f"{r['bf16_tflops']:g}",
            f"{r['fp8_tflops']:g}" if r["fp8_tflops"] else "-",
            r["fabric"],
            f"{r['intra_GBps']:g}",
            f"{r['pair_GBps']:g}",
            f"{r['nic_Gbps']:g}",
            r["provenance"],
        )
    return t


def kv_table(title: str, d: dict[str, Any]) -> Table:
    t = Table(title=title, show_header=False)
    t.add_column("field")
    t.add_column("value")
    for k, v in d.items():
        t.add_row(str(k), str(v))
    return t


BREAKDOWN_LEGEND = (
    "Exposed time only: communication hidden behind compute (overlap) is not counted again; bubble = "
    "pipeline fill/drain plus waiting on slower stages."
)
STAGES_LEGEND = (
    "Stages in pipeline order. stage ms = forward + backward + pipeline sends of one micro-batch; "
    "* = the bottleneck, the slowest stage, which sets the 1F1B rate. megatron family = one mesh shape for "
    "every stage; hetero = a mesh per stage (the runtime line below names what runs it). mem/cap = peak memory per "
    "device / usable capacity, GiB."
)


def stages_table(stages: list[dict[str, Any]], title: str = "Plan") -> Table:
    t = Table(title=title)
    for col in (
        "#",
        "device",
        "devs",
        "TP",
        "CP",
        "DP",
        "EP",
        "ETP",
        "layers",
        "recompute",
        "stage ms",
        "mem/cap GiB",
    ):
        t.add_column(col, justify="right" if col not in ("device", "recompute") else "left")
    for s in stages:
        mark = " *" if s.get("bottleneck") else ""
        t.add_row(
            str(s["index"]),
            s["device"],
            str(s["devices"]),
            str(s["tp"]),
            str(s["cp"]),
            str(s["dp"]),
            str(s["ep"]),
            str(s["etp"]),
            f"{s['layers']} [{s['layer_range'][0]},{s['layer_range'][1]})",
            s["recompute"],
            f"{1e3 * s['stage_time_s']:.1f}{mark}",
            f"{s['memory_gib']:.1f}/{s['capacity_gib']:.1f}",
        )
    return t


def summary_line(pred: dict[str, Any]) -> str:
    return (
        f"iteration {pred['iteration_time_s']:.3f} s | {pred['tokens_per_s']:,.0f} tokens/s "
        f"({pred['tokens_per_s_per_device']:,.0f}/device) | {pred['model_tflops_per_device']:.0f} TFLOP/s/device "
        f"| MFU {100 * pred['mfu']:.1f}% | fits: {'yes' if pred['fits'] else 'NO'}"
    )


def breakdown_table(bd: dict[str, float]) -> Table:
    t = Table(title="Bottleneck stage: seconds per iteration")
    t.add_column("term")
    t.add_column("seconds", justify="right")
    for k, v in bd.items():
        t.add_row(k, f"{v:.3f}")
    return t


def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, soft_wrap=False, width=160)


def solver_line(sol: Any) -> str:
    gap = sol.gap
    text = f"solver {sol.solver}: {sol.status}, objective {sol.objective_s:.4f} s"
    if gap == gap:
        text += f", bound {sol.bound_s:.4f} s, gap {100 * gap:.2f}%"
    stats = getattr(sol, "stats", {}) or {}
    if stats.get("proved_by"):
        text += f", proved by {stats['proved_by']}"
    if isinstance(stats.get("dp_gap_to_bound"), float):
        text += f"; the DP's plan is {100 * stats['dp_gap_to_bound']:.2f}% above the bound"
    return text + f", {sol.wall_s:.2f} s"


def baselines_table(rep: dict[str, Any], title: str) -> Table:
    t = Table(title=title)
    for col in ("method", "iteration s", "tokens/s", "MFU", "throughput x", "MFU x", "latency x", "plan"):
        t.add_column(col)

    def f(v: Any, fmt: str) -> str:
        return format(v, fmt) if isinstance(v, int | float) and v == v else "-"

    for r in rep["rows"]:
        t.add_row(
            str(r.get("method")),
            f(r.get("iteration_time_s"), ".3f"),
            f(r.get("tokens_per_s"), ",.0f"),
            f(r.get("mfu"), ".1%"),
            f(r.get("throughput_ratio"), ".2f"),
            f(r.get("mfu_ratio"), ".2f"),
            f(r.get("latency_ratio"), ".2f"),
            str(r.get("plan", ""))[:60],
        )
    return t


def best_mixes_table(best: list[dict[str, Any]], summary: Any) -> Table:
    t = Table(title=f"Best mixes ({summary.ok} ok, {summary.errors} errors, {summary.skipped} resumed)")
    for col in ("model", "metric", "cluster", "composition", "value", "tokens/s", "devices"):
        t.add_column(col)
    for r in best:
        t.add_row(
            r["model"],
            r["label"],
            r["cluster"],
            r["composition"],
            f"{r['value']:,.4g}",
            f"{r['tokens_per_s']:,.0f}",
            str(r["devices"]),
        )
    return t


def fitted_terms_table(params: Any, title: str) -> Table:
    t = Table(title=title)
    for col in ("term", "device", "start", "fitted", "bounded by", "at bound"):
        t.add_column(col, justify="right" if col in ("start", "fitted") else "left")
    for p in params:
        for d in p.devices:
            t.add_row(p.key, d, f"{p.start[d]:.4g}", f"{p.value[d]:.4g}", p.bounded_by, p.at_bound or "")
    return t


def calibration_runs_table(before: Any, after: Any, cv: Any) -> Table:
    t = Table(title="runs: step-time error (predicted - measured) / measured")
    for col in ("run", "measured s", "base table", "in-sample", *(("leave-one-run-out",) if cv else ())):
        t.add_column(col, justify="left" if col == "run" else "right")
    for i, (b, e) in enumerate(zip(before, after, strict=True)):
        row = [b.id, f"{b.measured_s:.4g}", f"{b.error:+.1%}", f"{e:+.1%}"]
        if cv:
            row.append(f"{cv[i]:+.1%}")
        t.add_row(*row)
    return t


def fidelity_table(ev: Any) -> Table:
    t = Table(
        title="predicted vs measured step time: error = (predicted - measured) / measured; * in-sample; "
        "LOMO/LOSO/LORO = leave-one-model/source/run-out"
    )
    cols = list(ev.columns)
    heads = {"uncalibrated": "uncalibrated", "planner": "planner", "run": "LORO", "model": "LOMO", "source": "LOSO"}
    for col in ("run", "devices", "measured s", *(heads.get(c, c) for c in cols), "largest terms"):
        t.add_column(col, justify="left" if col in ("run", "devices", "largest terms") else "right")
    for i, r in enumerate(ev.results):
        top = sorted(((v, k) for k, v in r.breakdown.items() if v > 0), reverse=True)[:3]
        terms = ", ".join(f"{k} {v:.3g}" for v, k in top)
        errs = [f"{ev.columns[c][i]:+.1%}" + ("*" if c == "planner" and ev.in_sample[i] else "") for c in cols]
        t.add_row(r.id, "+".join(r.devices), f"{r.measured_s:.4g}", *errs, terms)
    return t


MEMORY_LEGEND = (
    "GiB per rank of each stage at its peak (cost/memory.py): model state (params, FP8 weight copies, main grads, "
    "main params, optimizer moments), activations kept for the micro-batches in flight, the working set of one "
    "layer or the loss, then what lives outside live tensors: allocator fragmentation, CUDA/NCCL context, "
    "DeepEP buffers. allocated = what torch.cuda.max_memory_allocated would report."
)


def memory_table(stages: list[dict[str, Any]]) -> Table:
    """Itemized memory per stage (rows: items; columns: stages)."""
    t = Table(title="memory per rank, GiB")
    t.add_column("item")
    for s in stages:
        t.add_column(f"stage {s['index']} ({s['device']})", justify="right")
    items = list(stages[0]["memory_items_gib"]) if stages else []
    for k in items:
        t.add_row(k, *(f"{s['memory_items_gib'][k]:.2f}" for s in stages))
    t.add_row("allocated", *(f"{s['allocated_gib']:.2f}" for s in stages))
    t.add_row("device total", *(f"{s['memory_gib']:.2f}" for s in stages))
    t.add_row("usable", *(f"{s['capacity_gib']:.2f}" for s in stages))
    return t
