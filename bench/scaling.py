"""Search time vs cluster size and vs layer count (HAPMoE claims < 60 s; design §6 "under a minute").

Part A: the pruned DP on 50/50 H800 + 910B clusters from 16 to 2048 devices (inline clusters) and the
catalog's large clusters, Mixtral-S with the global batch scaled with the cluster (max(256, 2 x devices)
rounded up to a power of two; the paper scales GBS with cluster size). Part B: the DP on one cluster
with Mixtral-S-like models of 12..96 layers (``dataclasses.replace`` on ``num_layers``). With
``--exact``, CP-SAT and the MILP (each with its own time limit) run on the instances up to
``--exact-max-devices`` and their status / gap to the DP is reported. A DP that hits its time limit is
reported as ``timeout`` with the best plan it had.

    python bench/scaling.py [--max-devices 2048] [--time-limit 120] [--exact] [--layers 12 24 48 96]
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from typing import Any

from common import command_line, fx, quiet_logging, table, update_section

from hapmoe_milp import api
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.search.dp import solve_dp
from hapmoe_milp.search.solution import Solution
from hapmoe_milp.specs import Catalog

INLINE = [f"{n}xh800+{n}x910b" for n in (8, 16, 32, 64, 128, 256, 512, 1024)]
CATALOG_LARGE = ["64-h100", "256-h800-910b", "1024-h100-a100", "2048-h800"]


def scaled_gbs(world: int, base: int) -> int:
    g = max(base, 2 * world)
    p = 1
    while p < g:
        p *= 2
    return p


def run_dp(model: Any, cluster: Any, st: Any, limit: float) -> tuple[Solution, bool, float, float]:
    """The DP with the optimizer-offload retry, one time limit for both; (solution, offloaded, wall, CPU)."""
    t0, c0 = time.perf_counter(), time.process_time()
    sol = solve_dp(model, cluster, st, time_limit=limit)
    off = False
    if sol.plan is None and sol.status == "infeasible":
        left = max(0.05, limit - (time.perf_counter() - t0))
        sol = solve_dp(model, cluster, replace(st, optimizer_offload=True), time_limit=left)
        off = True
    return sol, off, time.perf_counter() - t0, time.process_time() - c0


def run_exact(model: Any, cluster: Any, st: Any, solver: str, limit: float, hint: Solution) -> dict[str, Any]:
    from hapmoe_milp.search import exact

    t0 = time.perf_counter()
    try:
        sol = exact.solve(model, cluster, st, solver=solver, time_limit=limit, hint=hint if hint.plan else None)
    except HapmoeError as err:
        return {"status": f"error: {err}", "wall_s": time.perf_counter() - t0}
    return {
        "status": sol.status,
        "objective_s": sol.objective_s if sol.plan is not None else None,
        "gap": sol.gap,
        "wall_s": time.perf_counter() - t0,
    }


def exact_cell(r: dict[str, Any], dp: Solution) -> str:
    """``status wall, objective / DP objective, proven gap``."""
    rel = r.get("objective_s") / dp.objective_s if r.get("objective_s") and dp.plan is not None else None
    return f"{r['status']} {fx(r['wall_s'], 1)} s, obj/DP {fx(rel, 4)}, gap {fx(r.get('gap'), 3)}"


def _exact_available() -> bool:
    try:
        from hapmoe_milp.search import exact  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mixtral-s")
    ap.add_argument("--max-devices", type=int, default=2048)
    ap.add_argument("--time-limit", type=float, default=120.0, help="DP limit per point (s)")
    ap.add_argument("--exact", action="store_true", help="also run CP-SAT and the MILP on small instances")
    ap.add_argument("--exact-time-limit", type=float, default=60.0)
    ap.add_argument("--exact-max-devices", type=int, default=32)
    ap.add_argument("--layers", nargs="+", type=int, default=[12, 24, 48, 96])
    ap.add_argument("--layer-cluster", default="32-1")
    ap.add_argument("--no-catalog", action="store_true", help="skip the catalog's large clusters")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    quiet_logging()
    cat = Catalog()
    base = cat.model(args.model)
    exact_ok = args.exact and _exact_available()
    t_all = time.perf_counter()

    size_rows: list[list[str]] = []
    names = INLINE + ([] if args.no_catalog else CATALOG_LARGE)
    for cname in names:
        c = cat.cluster(cname)
        if c.world_size > args.max_devices:
            continue
        st = api.make_settings(base, global_batch_size=scaled_gbs(c.world_size, base.defaults.global_batch_size))
        sol, off, wall, cpu = run_dp(base, c, st, args.time_limit)
        row = [
            cname,
            str(c.world_size),
            str(st.global_batch_size),
            sol.status + (" (offload)" if off else ""),
            fx(wall, 2),
            fx(cpu, 2),
            fx(sol.objective_s if sol.plan else None, 3),
            str(sol.plan.pp) if sol.plan else "—",
            str(sol.plan.vpp) if sol.plan else "—",
            str(sol.stats.get("instances", "—")),
        ]
        ex: list[str] = []
        if exact_ok:
            for solver in ("cpsat", "milp"):
                if c.world_size <= args.exact_max_devices:
                    r = run_exact(base, c, replace(st, optimizer_offload=off), solver, args.exact_time_limit, sol)
                    ex.append(exact_cell(r, sol))
                else:
                    ex.append("—")
        size_rows.append(row + ex)
        print(" | ".join(size_rows[-1]), flush=True)

    layer_rows: list[list[str]] = []
    c = cat.cluster(args.layer_cluster)
    for n in args.layers:
        m = replace(base, name=f"{base.name}-L{n}", num_layers=n)
        st = api.make_settings(m)
        sol, off, wall, cpu = run_dp(m, c, st, args.time_limit)
        row = [
            str(n),
            sol.status + (" (offload)" if off else ""),
            fx(wall, 2),
            fx(cpu, 2),
            fx(sol.objective_s if sol.plan else None, 3),
            str(sol.plan.pp) if sol.plan else "—",
        ]
        ex = []
        if exact_ok:
            for solver in ("cpsat", "milp"):
                if c.world_size <= args.exact_max_devices and n <= 48:
                    r = run_exact(m, c, replace(st, optimizer_offload=off), solver, args.exact_time_limit, sol)
                    ex.append(exact_cell(r, sol))
                else:
                    ex.append("—")
        layer_rows.append(row + ex)
        print(" | ".join(layer_rows[-1]), flush=True)

    total = time.perf_counter() - t_all
    ex_h = ["CP-SAT", "MILP"] if exact_ok else []
    out = ["## Search time scaling", ""]
    out.append(f"Command: `{command_line()}` — finished in {total:.0f} s.")
    out.append("")
    out.append(
        f"- DP with the default pruning, time limit {args.time_limit:.0f} s per point (status `timeout` = it hit "
        "the limit and returns the best plan found so far, with no bound); wall and CPU time include building "
        "the instances and the optimizer-offload retry (CPU time is the better estimate of a quiet machine "
        f"when the load, {os.getloadavg()[0]:.1f} at the end of this run on {os.cpu_count()} cores, exceeds the cores). "
        "Model: "
        f"{args.model} (GBS scaled with the cluster in part A)."
        + (
            f" Exact solvers: {args.exact_time_limit:.0f} s limit each, on clusters up to "
            f"{args.exact_max_devices} devices (and up to 48 layers), warm-started from the DP plan; cells "
            "give status, wall time, objective relative to the DP's (< 1: the exact solver found a better plan) "
            "and the proven relative gap to its bound."
            if exact_ok
            else " Exact solvers not run (pass --exact)."
        )
    )
    out.append("")
    out.append("### A. vs cluster size")
    out.append("")
    out.append(
        table(
            [
                "Cluster",
                "Devices",
                "GBS",
                "DP status",
                "DP wall (s)",
                "DP CPU (s)",
                "Iter (s)",
                "PP",
                "VPP",
                "Instances",
                *ex_h,
            ],
            size_rows,
        )
    )
    out.append("")
    out.append(f"### B. vs layer count (cluster {args.layer_cluster}, GBS {base.defaults.global_batch_size})")
    out.append("")
    out.append(table(["Layers", "DP status", "DP wall (s)", "DP CPU (s)", "Iter (s)", "PP", *ex_h], layer_rows))
    md = "\n".join(out) + "\n"
    print(md)
    if not args.no_write:
        update_section("scaling", md)


if __name__ == "__main__":
    main()
