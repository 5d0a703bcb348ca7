"""DP search time per scenario: HAPMoE Table 1 (16/24/32 devices x Mixtral-S/L) and large clusters.

Run: python bench/search_time.py [--quick] [--time-limit S]
Prints a markdown table: scenario, wall time of the whole `solve` (both families, optimizer-offload
retry included), status, chosen family, pipeline depth, predicted iteration time and MFU.
Targets (issue): < 5 s per HAPMoE scenario, < 60 s at 1024 devices.
"""

from __future__ import annotations

import argparse
import time

from hapmoe_milp.api import solve
from hapmoe_milp.errors import HapmoeError

TABLE1 = ["16-1-h", "16-2-h", "16-3-h", "16-1", "16-2", "16-3", "24-1", "24-2", "24-3", "32-1", "32-2", "32-3"]
LARGE = [
    ("deepseek-v3", "256-h800-910b", 1024),
    ("qwen3-235b-a22b", "256-h800-910b", 1024),
    ("deepseek-v3", "1024-h100-a100", 2048),
    ("qwen3-235b-a22b", "1024-h100-a100", 2048),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="Mixtral-S on three clusters only")
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    cases = [(m, c, None) for m in ("mixtral-s", "mixtral-l") for c in TABLE1]
    if args.quick:
        cases = [("mixtral-s", c, None) for c in ("16-1", "24-2", "32-3")]
    else:
        cases += LARGE
    print("| model | cluster | devices | wall s | status | family | pp | iteration s | MFU |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model, cluster, gbs in cases:
        t0 = time.perf_counter()
        try:
            sol = solve(model, cluster, time_limit=args.time_limit, global_batch_size=gbs)
        except HapmoeError as exc:
            print(f"| {model} | {cluster} | | {time.perf_counter() - t0:.1f} | error: {exc} | | | | |")
            continue
        wall = time.perf_counter() - t0
        p = sol.plan
        pred = p.predicted
        print(
            f"| {model} | {cluster} | {pred['devices']} | {wall:.1f} | {sol.status} | {p.family} | {p.pp} "
            f"| {pred['iteration_time_s']:.3f} | {100 * pred['mfu']:.1f}% |",
            flush=True,
        )


if __name__ == "__main__":
    main()
