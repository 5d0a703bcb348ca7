"""Pruned DP vs the exact solvers on HAPMoE's Table 1 scenarios: times, statuses, objectives, bounds.

For every cluster (16-1-h, 16-2-h, 16-3-h, 16-1..16-3, 24-1..24-3, 32-1..32-3) and model (Mixtral-S: GBS
256, all-gather dispatcher; Mixtral-L: GBS 512, all-to-all -- the catalog defaults), run the pruned DP,
the unpruned DP ("dp-exact"), CP-SAT and the MILP (HiGHS) with the same time limit each, and print one
markdown row per scenario. The DP's gap is to the best bound any exact solver proved (an unpruned DP
that finishes proves its objective). Mixtral-L does not fit these clusters without
optimizer offload: as ``api.solve(optimizer_offload='auto')`` does, a scenario whose pruned DP finds
nothing is re-run with the optimizer states offloaded.

The exact solvers are warm-started from the DP plan by default (what ``--solver auto`` does); pass
``--cold`` to run them independently of the DP. Always exits 0: this is a report, not a test.

    python bench/exact_vs_dp.py [--clusters 16-1,24-2] [--models mixtral-s] [--time-limit 60] [--threads 2]
                                [--family both] [--solvers cpsat,milp] [--cold] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from dataclasses import replace
from typing import Any

from hapmoe_milp.api import make_settings
from hapmoe_milp.search import exact
from hapmoe_milp.search.dp import solve_dp
from hapmoe_milp.search.solution import Solution
from hapmoe_milp.space import Pruning
from hapmoe_milp.specs import Catalog

CLUSTERS = ["16-1-h", "16-2-h", "16-3-h", "16-1", "16-2", "16-3", "24-1", "24-2", "24-3", "32-1", "32-2", "32-3"]
MODELS = ["mixtral-s", "mixtral-l"]


def _fmt(x: float, spec: str = ".4f") -> str:
    return "-" if x is None or x != x or math.isinf(x) else format(x, spec)


def _cell(sol: Solution | None) -> str:
    if sol is None:
        return "-"
    return f"{sol.status} {_fmt(sol.objective_s)} / {_fmt(sol.bound_s)} ({sol.wall_s:.0f}s)"


def run_scenario(catalog: Catalog, model_name: str, cluster_name: str, args: argparse.Namespace) -> dict[str, Any]:
    model = catalog.model(model_name)
    cluster = catalog.cluster(cluster_name)
    st = make_settings(model)
    t0 = time.perf_counter()
    dp = solve_dp(model, cluster, st, family=args.family, time_limit=args.time_limit)
    offload = False
    if dp.plan is None and dp.status != "timeout":
        st = replace(st, optimizer_offload=True)
        offload = True
        dp = solve_dp(model, cluster, st, family=args.family, time_limit=args.time_limit)
    row: dict[str, Any] = {"model": model_name, "cluster": cluster_name, "offload": offload, "dp": dp}
    for solver in args.solvers:
        if solver == "dp-exact":
            row[solver] = solve_dp(
                model, cluster, st, family=args.family, pruning=Pruning.off(), time_limit=args.time_limit
            )
            continue
        row[solver] = exact.solve(
            model,
            cluster,
            st,
            solver=solver,
            family=args.family,
            time_limit=args.time_limit,
            threads=args.threads,
            hint=None if args.cold else dp.plan,
        )
    bounds = [row[s].bound_s for s in args.solvers if row[s].bound_s == row[s].bound_s]
    row["best_bound"] = max((b for b in bounds if math.isfinite(b)), default=math.nan)
    objs = [row[s].objective_s for s in ["dp", *args.solvers] if row[s].plan is not None]
    row["best_objective"] = min(objs, default=math.nan)
    row["dp_gap"] = (
        (dp.objective_s - row["best_bound"]) / dp.objective_s
        if dp.plan is not None and row["best_bound"] == row["best_bound"]
        else math.nan
    )
    row["wall"] = time.perf_counter() - t0
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--family", default="both")
    ap.add_argument("--solvers", default="dp-exact,cpsat,milp", help="any of dp-exact (the unpruned DP), cpsat, milp")
    ap.add_argument("--cold", action="store_true", help="do not warm-start the exact solvers from the DP plan")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    args.solvers = [s for s in args.solvers.split(",") if s]
    logging.basicConfig(level=logging.WARNING)
    catalog = Catalog()
    start = "cold" if args.cold else "warm-started from the DP plan"
    print(
        f"# Pruned DP vs exact solvers ({', '.join(args.solvers)}; {args.time_limit:g} s each, family {args.family}, "
        f"exact solvers {start})\n"
    )
    head = "| model | cluster | offload | DP obj (s) | DP wall (s) | "
    head += " | ".join(f"{s} status obj / bound (wall)" for s in args.solvers)
    head += " | best bound (s) | DP gap |"
    print(head)
    print("|" + "---|" * (6 + len(args.solvers)))
    out = []
    for m in args.models.split(","):
        for c in args.clusters.split(","):
            try:
                row = run_scenario(catalog, m, c, args)
            except Exception as exc:  # a report: show the failure and carry on
                print(f"| {m} | {c} | - | error: {exc} |")
                continue
            dp = row["dp"]
            cells = [
                m,
                c,
                "yes" if row["offload"] else "no",
                f"{dp.status} {_fmt(dp.objective_s)}",
                f"{dp.wall_s:.1f}",
                *(_cell(row[s]) for s in args.solvers),
                _fmt(row["best_bound"]),
                _fmt(row["dp_gap"] * 100, ".2f") + "%" if row["dp_gap"] == row["dp_gap"] else "-",
            ]
            print("| " + " | ".join(cells) + " |", flush=True)
            out.append(
                {
                    "model": m,
                    "cluster": c,
                    "offload": row["offload"],
                    "best_bound_s": row["best_bound"],
                    "best_objective_s": row["best_objective"],
                    "dp_gap": row["dp_gap"],
                    **{
                        s: {
                            "status": row[s].status,
                            "objective_s": row[s].objective_s,
                            "bound_s": row[s].bound_s,
                            "wall_s": row[s].wall_s,
                            "stages": [] if row[s].plan is None else [st.device for st in row[s].plan.stages],
                        }
                        for s in ["dp", *args.solvers]
                    },
                }
            )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
