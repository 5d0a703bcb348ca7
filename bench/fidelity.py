#!/usr/bin/env python3
"""Cost-model fidelity on the public calibration set, judged on what each fit has not seen.

For the runs in ``bench/calibration/runs.yaml``:

- **uncalibrated**: the shipped (datasheet + micro-benchmark) tables predict every run;
- **in-sample**: one pooled, identifiable fit to every run (what ``--write-tables`` ships) predicts the
  runs it was fitted to -- reported, never the headline;
- **leave-one-model-out** (headline), **leave-one-source-out**, **leave-one-run-out**: every run
  predicted by the whole procedure (terms, identifiability, fit) rerun on the runs outside its fold.

Same-model pairs on the same hardware must rank as measured (throughput per device). The section
``fidelity`` of bench/RESULTS.md is regenerated; ``--write-tables`` also (re)writes the shipped
calibrated tables in ``clusters/devices-calibrated/`` and checks each against its micro-benchmark rows.

Usage::

    python bench/fidelity.py [--runs bench/calibration/runs.yaml] [--write-tables] [--no-results] [--no-memory]
    python bench/fidelity.py --devices b200,h100 --kinds model   # a cheap subset while iterating (prints only)
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from common import ROOT, command_line, fx, quiet_logging, table, update_section
from fidelity_memory import memory_section

from hapmoe_milp import __version__
from hapmoe_milp.calibration import (
    calibrated_document,
    cross_validate,
    load_rows,
    load_runs,
    pooled_fit,
    predict,
    prepare,
    summarize,
    table_stack,
    write_document,
)
from hapmoe_milp.calibration.microbench import table_rows_report
from hapmoe_milp.specs import Catalog

#: Devices without runs of their own that share a calibrated device's chip: they take its fitted kernel and
#: host terms and keep their own link terms (A100 and A800 are the same GA100 die; A800's NVLink is capped).
SAME_CHIP = {"a100": "a800"}
CHIP_TERMS = ("launch_us", "sync_us", "gemm_scale", "fp8_gemm_scale", "grouped_rows_half", "attention_scale",
              "memory_efficiency")  # fmt: skip
METHOD = (
    "pooled fit over the public set: stack terms (host, sync, overlap shares) shared by the devices of one "
    "software stack, kernel terms per device only inside their micro-benchmark tolerance, only the terms the "
    "runs identify (pivoted sensitivity, at most one per two runs); soft-L1 least squares on log step-time "
    "ratios, runs weighted 1/sqrt(runs of the same model and device), weak prior toward the base table"
)
KINDS = ("model", "source", "run")
LABEL = {"uncalibrated": "uncalibrated", "in-sample": "in-sample (fitted to all)", "model": "leave-one-model-out",
         "source": "leave-one-source-out", "run": "leave-one-run-out"}  # fmt: skip


def pct(x: float) -> str:
    return f"{x:+.1%}"


def mw(s) -> str:
    return f"{s.mape:.1%} / {s.worst:.1%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=ROOT / "bench" / "calibration" / "runs.yaml")
    ap.add_argument("--write-tables", action="store_true", help="write clusters/devices-calibrated/<device>.yaml")
    ap.add_argument("--no-results", action="store_true", help="print only, do not touch bench/RESULTS.md")
    ap.add_argument("--kinds", default=",".join(KINDS), help="cross-validations to run (model,source,run)")
    ap.add_argument("--memory-runs", type=Path, default=ROOT / "bench" / "calibration" / "memory_runs.yaml")
    ap.add_argument("--memory-only", action="store_true", help="only the memory section (no table fitting)")
    ap.add_argument("--no-memory", action="store_true", help="leave the memory section (fidelity_memory) as it is")
    ap.add_argument(
        "--devices",
        default="",
        help="only the runs whose devices are all in this comma list (a cheaper subset while iterating: the fits "
        "and cross-validations see only those runs, so the figures differ from the full set's; prints only)",
    )
    args = ap.parse_args(argv)
    subset = {d for d in args.devices.split(",") if d}
    if subset and args.write_tables:
        ap.error("--devices fits a subset: it cannot write the shipped tables (drop --write-tables)")
    quiet_logging()
    if args.memory_only:
        mem = memory_section(args.memory_runs, args.runs, Catalog(root=ROOT, use_calibrated=False), command_line())
        print(mem)
        if not args.no_results:
            update_section("fidelity_memory", mem)
        return 0
    t0 = time.perf_counter()
    shipped = Catalog(root=ROOT, use_calibrated=False)
    runs = [prepare(r, shipped) for r in load_runs(args.runs)]
    if subset:
        runs = [r for r in runs if set(r.devices) <= subset]
        if not runs:
            ap.error(f"--devices {args.devices}: no run uses only these devices")
    devices = sorted({d for r in runs for d in r.devices})
    bases = {d: shipped.device(d) for d in devices}
    rows = load_rows(ROOT)
    before = [predict(r, bases) for r in runs]
    pf = pooled_fit(runs, bases, rows)
    cols: dict[str, list[float]] = {"uncalibrated": [b.error for b in before], "in-sample": list(pf.result.errors)}
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        print(f"cross-validating by {k} ...", file=sys.stderr)
        cols[k] = cross_validate(runs, bases, rows, k)
    print("\n".join(pf.report()))
    for p in pf.result.params:
        print(f"fitted {p.key}: " + ", ".join(f"{d} {p.start[d]:.4g} -> {p.value[d]:.4g}" for d in p.devices))
    written = write_tables(runs, before, pf, rows) if args.write_tables else []
    summ = {c: summarize(before, v) for c, v in cols.items()}
    head = "model" if "model" in cols else "in-sample"
    lines = header(runs, devices, time.perf_counter() - t0, summ, head)
    lines += device_section(runs, before, cols, devices)
    lines += fit_section(pf, written)
    lines += run_section(runs, before, cols)
    body = "\n".join(lines)
    print(body)
    if subset:
        return 0  # a subset's figures never replace the full set's section
    if not args.no_results:
        update_section("fidelity", body)
    if args.no_memory:
        return 0
    mem = memory_section(args.memory_runs, args.runs, shipped, command_line())
    print(mem)
    if not args.no_results:
        update_section("fidelity_memory", mem)
    return 0


def write_tables(runs, before, pf, rows) -> list[str]:
    """Write each device's calibrated table (scope public) and its micro-benchmark check."""
    out = []
    for did, base in pf.problem.bases.items():
        mine = [i for i, r in enumerate(runs) if did in r.devices]
        stack = table_stack(runs, did)
        table_dev = pf.tables(stack)[did]
        doc = calibrated_document(
            base, table_dev, pf.result.params, [runs[i] for i in mine], [before[i] for i in mine],
            [pf.result.errors[i] for i in mine], scope="public", method=METHOD,
            identification=pf.identification.to_dict(), rows=rows, version=__version__, stack=stack,
        )  # fmt: skip
        path = write_document(doc, ROOT / "clusters" / "devices-calibrated" / f"{did}.yaml")
        out.append(f"{path.relative_to(ROOT)}: " + micro_line(table_dev, rows))
        for twin, src in SAME_CHIP.items():
            if src != did:
                continue
            tb = Catalog(root=ROOT, use_calibrated=False).device(twin)
            vals = {n: getattr(table_dev.runtime, n) for n in CHIP_TERMS}
            tdev = replace(tb, runtime=tb.runtime.with_values(vals))
            tdoc = calibrated_document(
                tb, tdev, [], [runs[i] for i in mine], [before[i] for i in mine],
                [pf.result.errors[i] for i in mine], scope="public", method=METHOD, rows=rows, version=__version__,
            )  # fmt: skip
            tdoc["calibration"]["derived_from"] = (
                f"{did}'s fit ({', '.join(CHIP_TERMS)}): same chip, no runs of its own; link terms stay {twin}'s"
            )
            tpath = write_document(tdoc, ROOT / "clusters" / "devices-calibrated" / f"{twin}.yaml")
            out.append(f"{tpath.relative_to(ROOT)} (from {did}): " + micro_line(tdev, rows))
    return out


def micro_line(dev, rows) -> str:
    rep = table_rows_report(dev, rows)
    if not rep:
        return "no micro-benchmark row applies"
    bad = [r["id"] for r in rep if not r["within"]]
    return f"{len(rep) - len(bad)}/{len(rep)} micro-benchmark rows within tolerance" + (
        f" (outside: {', '.join(bad)})" if bad else ""
    )


def header(runs, devices, wall, summ, head) -> list[str]:
    models = {r.model.name for r in runs}
    h = summ[head]
    lines = [
        "## Cost-model fidelity on the public calibration set",
        "",
        f"Command: `{command_line()}` — {len(runs)} runs of {len(models)} models on {len(devices)} device types, "
        f"{wall:.0f} s.",
        "",
        "Runs: `bench/calibration/runs.yaml` (public measured Megatron-Core / MindSpeed-LLM training runs, a source "
        "link per row; GPT-OSS-120B, Qwen3-235B-A22B and Mixtral-8x22B are held out and appear nowhere). Error = "
        "(predicted − measured) / measured step time. *Uncalibrated*: shipped datasheet + micro-benchmark tables. "
        "*In-sample*: one pooled fit to every run (what `clusters/devices-calibrated/` ships) predicting its own "
        "runs. *Leave-one-model-out / -source-out / -run-out*: each run predicted by the whole procedure (terms, "
        "identifiability, fit) rerun without the run's model / source / the run itself.",
        "",
        f"- **{LABEL[head]}: MAPE {h.mape:.1%}, worst {h.worst:.1%}** ({h.worst_id}); same-model pairs ranked as "
        f"measured {h.pairs_agree}/{h.pairs}.",
    ]
    for c, s in summ.items():
        if c != head:
            lines.append(
                f"- {LABEL[c]}: MAPE {s.mape:.1%}, worst {s.worst:.1%} ({s.worst_id}); pairs {s.pairs_agree}/{s.pairs}."
            )
    return [*lines, ""]


def device_section(runs, before, cols, devices) -> list[str]:
    rows_out = []
    for did in devices:
        idx = [i for i, r in enumerate(runs) if did in r.devices]
        b = [before[i] for i in idx]
        models = len({runs[i].model.name for i in idx})
        cells = [mw(summarize(b, [cols[c][i] for i in idx])) for c in cols]
        s = summarize(b, [cols["model"][i] for i in idx]) if "model" in cols else summarize(b)
        rows_out.append([did, len(idx), models, *cells, f"{s.pairs_agree}/{s.pairs}"])
    heads = ["device", "runs", "models", *(f"{LABEL[c]} MAPE / worst" for c in cols), "pairs (LOMO)"]
    return ["### Per device", "", table(heads, rows_out), ""]


def fit_section(pf, written) -> list[str]:
    lines = ["### What the full fit moved, and why", "", "```", *pf.report(), "```", ""]
    for p in pf.result.params:
        lines.append(
            f"- `{p.key}`: " + ", ".join(f"{d} {p.start[d]:.4g} → {p.value[d]:.4g}" for d in p.devices)
            + f" (bounded by {p.bounded_by}{'; at ' + p.at_bound + ' bound' if p.at_bound else ''})"
        )  # fmt: skip
    if written:
        lines += ["", "Tables written:", "", *(f"- {w}" for w in written)]
    return [*lines, ""]


def run_section(runs, before, cols) -> list[str]:
    heads = ["run", "device", "model", "stack", "measured s", *(LABEL[c] for c in cols)]
    body = [
        [
            r.run.id,
            "+".join(r.devices),
            r.model.name,
            r.run.stack,
            fx(b.measured_s, 3),
            *(pct(cols[c][i]) for c in cols),
        ]
        for i, (r, b) in enumerate(zip(runs, before, strict=True))
    ]
    return ["### Per run", "", table(heads, body)]


if __name__ == "__main__":
    sys.exit(main())
