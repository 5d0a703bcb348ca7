#!/usr/bin/env python3
"""Cost-model fidelity against the public calibration set: before and after calibration, leave-one-out.

For every device type with measured runs in ``bench/calibration/runs.yaml``:

- **before**: the shipped (datasheet + micro-benchmark) table predicts every run;
- **after**: the table fitted to all of that device's runs (in-sample; what ``--write-tables`` ships);
- **leave-one-out**: each run predicted by a table fitted to the device's *other* runs -- the honest
  estimate of how well a calibrated table predicts a run it has not seen.

Same-model pairs on the same hardware must rank as measured (throughput per device). The section
``fidelity`` of bench/RESULTS.md is regenerated; ``--write-tables`` also (re)writes the shipped
calibrated tables in ``clusters/devices-calibrated/``.

Usage::

    python bench/fidelity.py [--runs bench/calibration/runs.yaml] [--write-tables] [--no-results]
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
    DEFAULT_FIT,
    calibrated_document,
    fit_device,
    leave_one_out,
    load_runs,
    predict,
    prepare,
    summarize,
    write_document,
)
from hapmoe_milp.specs import Catalog

#: Devices without runs of their own that share a calibrated device's chip: they take its fitted compute and
#: host terms and keep their own link terms (A100 and A800 are the same GA100 die; A800's NVLink is capped).
SAME_CHIP = {"a100": ("a800", ("launch_us", "sync_us", "gemm_scale", "fp8_gemm_scale", "grouped_rows_half",
                               "attention_scale", "memory_efficiency"))}  # fmt: skip


def pct(x: float) -> str:
    return f"{x:+.1%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=ROOT / "bench" / "calibration" / "runs.yaml")
    ap.add_argument("--write-tables", action="store_true", help="write clusters/devices-calibrated/<device>.yaml")
    ap.add_argument("--no-results", action="store_true", help="print only, do not touch bench/RESULTS.md")
    ap.add_argument("--memory-runs", type=Path, default=ROOT / "bench" / "calibration" / "memory_runs.yaml")
    ap.add_argument("--memory-only", action="store_true", help="only the memory section (no table fitting)")
    args = ap.parse_args(argv)
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
    devices = sorted({d for r in runs for d in r.devices})
    rows: dict[str, dict[str, object]] = {}
    before_all, after_all, loo_all = [], [], []
    per_device: list[list[object]] = []
    for did in devices:
        mine = [r for r in runs if did in r.devices]
        base = shipped.device(did)
        before = [predict(r) for r in mine]
        fit = fit_device(mine, base, DEFAULT_FIT)
        after = [replace(b, predicted_s=b.measured_s * (1 + e)) for b, e in zip(before, fit.errors, strict=True)]
        loo = leave_one_out(mine, base, DEFAULT_FIT) if len(mine) > 1 else [b.error for b in before]
        loo_res = [replace(b, predicted_s=b.measured_s * (1 + e)) for b, e in zip(before, loo, strict=True)]
        before_all += before
        after_all += after
        loo_all += loo_res
        sb, sa, sl = summarize(before), summarize(after), summarize(loo_res)
        per_device.append(
            [did, len(mine), f"{sb.mape:.1%} / {sb.worst:.1%}", f"{sa.mape:.1%} / {sa.worst:.1%}",
             f"{sl.mape:.1%} / {sl.worst:.1%}" + ("" if len(mine) > 1 else " (1 run: none)"),
             f"{sb.pairs_agree}/{sb.pairs}", f"{sl.pairs_agree}/{sl.pairs}"]
        )  # fmt: skip
        for b, a, lr in zip(before, after, loo_res, strict=True):
            rows[b.id] = {"device": did, "model": b.model, "measured": b.measured_s, "before": b.error,
                          "after": a.error, "loo": lr.error, "source": b.source}  # fmt: skip
        hit = [f"{p.name}={p.value:.4g} ({p.at_bound} bound)" for p in fit.params if p.at_bound]
        print(f"{did}: {len(mine)} runs, fitted " + ", ".join(f"{p.name}={p.value:.4g}" for p in fit.params))
        if hit:
            print(f"  at a bound: {', '.join(hit)}")
        if args.write_tables:
            doc = calibrated_document(base, fit, mine, before, loo if len(mine) > 1 else None, __version__)
            path = write_document(doc, ROOT / "clusters" / "devices-calibrated" / f"{did}.yaml")
            print(f"  wrote {path.relative_to(ROOT)}")
            for twin, (src, names) in SAME_CHIP.items():
                if src != did:
                    continue
                tb = shipped.device(twin)
                values = {n: getattr(fit.device.runtime, n) for n in names}
                tfit = replace(fit, device=replace(tb, runtime=tb.runtime.with_values(values)))
                tdoc = calibrated_document(tb, tfit, mine, before, loo if len(mine) > 1 else None, __version__)
                tdoc["calibration"]["derived_from"] = (
                    f"{did}'s fit ({', '.join(names)}): same chip, no runs of its own; link terms stay {twin}'s"
                )
                tpath = write_document(tdoc, ROOT / "clusters" / "devices-calibrated" / f"{twin}.yaml")
                print(f"  wrote {tpath.relative_to(ROOT)} (from {did})")
    sb, sa, sl = summarize(before_all), summarize(after_all), summarize(loo_all)
    wall = time.perf_counter() - t0
    lines = [
        "## Cost-model fidelity on the public calibration set",
        "",
        f"Command: `{command_line()}` — {len(runs)} runs on {len(devices)} device types in {wall:.0f} s.",
        "",
        "Runs: `bench/calibration/runs.yaml` (public measured Megatron-Core training runs, a source link per row; "
        "GPT-OSS-120B, Qwen3-235B-A22B and Mixtral-8x22B are held out and appear nowhere). Error = "
        "(predicted − measured) / measured step time. *Before*: shipped datasheet + micro-benchmark tables. "
        "*After*: the table fitted to all of the device's runs (in-sample; what `clusters/devices-calibrated/` "
        "ships). *Leave-one-out*: each run predicted by a table fitted to the device's other runs.",
        "",
        f"- **Leave-one-out MAPE {sl.mape:.1%}, worst {sl.worst:.1%}** ({sl.worst_id}); same-model pairs ranked "
        f"as measured: {sl.pairs_agree}/{sl.pairs}.",
        f"- Before calibration: MAPE {sb.mape:.1%}, worst {sb.worst:.1%} ({sb.worst_id}); pairs {sb.pairs_agree}/"
        f"{sb.pairs}. After (in-sample): MAPE {sa.mape:.1%}, worst {sa.worst:.1%}; pairs {sa.pairs_agree}/{sa.pairs}.",
        "",
        "### Per device",
        "",
        table(
            [
                "device",
                "runs",
                "before MAPE / worst",
                "after MAPE / worst",
                "leave-one-out MAPE / worst",
                "pairs before",
                "pairs LOO",
            ],
            per_device,
        ),
        "",
        "### Per run",
        "",
        table(
            ["run", "device", "model", "measured s", "before", "after", "leave-one-out"],
            [
                [k, v["device"], v["model"], fx(v["measured"], 3), pct(v["before"]), pct(v["after"]), pct(v["loo"])]
                for k, v in rows.items()
            ],
        ),
    ]
    body = "\n".join(lines)
    print(body)
    mem = memory_section(args.memory_runs, args.runs, shipped, command_line())
    print(mem)
    if not args.no_results:
        update_section("fidelity", body)
        update_section("fidelity_memory", mem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
