#!/usr/bin/env python3
"""Re-plan HAPMoE's 24 Table 1 scenarios under two versions of the cost model and compare the plans.

Run once per version of the package (its PYTHONPATH), then compare::

    PYTHONPATH=/path/to/old python bench/memory_replan.py --dump old.jsonl
    PYTHONPATH=. python bench/memory_replan.py --dump new.jsonl
    python bench/memory_replan.py --compare old.jsonl new.jsonl   # writes the section memory_replan

Each scenario is solved with the default solver and settings (optimizer offload only where nothing else fits).
The comparison counts plans whose recompute, optimizer offload or pipeline depth changed, and how much the
predicted iteration time moved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from common import command_line, quiet_logging, table, update_section

TABLE1 = ["16-1-h", "16-2-h", "16-3-h", "16-1", "16-2", "16-3", "24-1", "24-2", "24-3", "32-1", "32-2", "32-3"]
MODELS = ("mixtral-s", "mixtral-l")


def dump(path: Path) -> None:
    from hapmoe_milp.api import solve

    rows = []
    for m in MODELS:
        for c in TABLE1:
            sol = solve(m, c, time_limit=60)
            p = sol.plan
            rows.append({"model": m, "cluster": c, "iteration_s": sol.objective_s,
                         "recompute": sorted({s.recompute for s in p.stages}), "pp": p.pp, "vpp": p.vpp,
                         "offload": bool(p.settings().optimizer_offload), "family": p.family})  # fmt: skip
            print(json.dumps(rows[-1]))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def compare(old_p: Path, new_p: Path, write: bool, note: str = "") -> str:
    old = {(r["model"], r["cluster"]): r for r in map(json.loads, old_p.read_text().splitlines())}
    new = {(r["model"], r["cluster"]): r for r in map(json.loads, new_p.read_text().splitlines())}
    keys = [k for k in old if k in new]
    ch = {"recompute": 0, "offload": 0, "depth": 0, "any": 0}
    moves, out = [], []
    for k in keys:
        a, b = old[k], new[k]
        d = {"recompute": a["recompute"] != b["recompute"], "offload": a["offload"] != b["offload"],
             "depth": (a["pp"], a["vpp"]) != (b["pp"], b["vpp"])}  # fmt: skip
        for n, v in d.items():
            ch[n] += v
        ch["any"] += any(d.values()) or a["family"] != b["family"]
        mv = b["iteration_s"] / a["iteration_s"] - 1
        moves.append(mv)
        out.append([k[0], k[1], f"{a['iteration_s']:.2f} → {b['iteration_s']:.2f}", f"{mv:+.1%}",
                    f"{'/'.join(a['recompute'])} → {'/'.join(b['recompute'])}", f"{a['offload']} → {b['offload']}",
                    f"{a['pp']}/{a['vpp']} → {b['pp']}/{b['vpp']}"])  # fmt: skip
    lines = [
        "## Table 1 re-planned with the itemized memory model",
        "",
        f"Command: `{command_line()}` (plans dumped with `python bench/memory_replan.py --dump` under the old and "
        "the new package). Default solver and settings; optimizer offload only where nothing else fits.",
        "",
        f"- {len(keys)} scenarios: plans changed in {ch['any']} (recompute in {ch['recompute']}, optimizer offload "
        f"in {ch['offload']}, pipeline depth or VPP in {ch['depth']}).",
        f"- Predicted iteration time moved by median {statistics.median(moves):+.1%}, mean "
        f"{statistics.mean(moves):+.1%}, from {min(moves):+.1%} to {max(moves):+.1%}.",
        *([f"- {note}"] if note else []),
        "",
        table(["model", "cluster", "iteration s old → new", "move", "recompute", "offload", "PP/VPP"], out),
    ]
    body = "\n".join(lines)
    if write:
        update_section("memory_replan", body)
    return body


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump", type=Path)
    ap.add_argument("--compare", type=Path, nargs=2)
    ap.add_argument("--no-results", action="store_true")
    ap.add_argument("--note", default="", help="what the two dumps are (versions, tables), a line of the section")
    a = ap.parse_args(argv)
    quiet_logging()
    if a.dump:
        dump(a.dump)
    if a.compare:
        print(compare(*a.compare, write=not a.no_results, note=a.note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
