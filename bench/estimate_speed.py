"""How long one plan evaluation takes: closed form (cold and warm memo caches) and the 1F1B simulation.

DeepSeek-V3 (61 layers + MTP) on 1024 devices, PP16 stages of 64 devices each (TP1 CP1 DP64, EP64 ETP1),
global batch 4096 sequences of 4096 tokens, micro-batch 1 -> 64 micro-batches. The target for the closed
form is well under 10 ms per estimate: the search calls the same cost model millions of times through
memoised coefficients, and `estimate --plan` should feel instant.

"cold" builds a fresh CostModel per call (empty memo: every layer kind, edge and boundary is priced);
"warm" reuses one CostModel, as the search and repeated CLI calls within a process do. Medians over the
repeats are printed.

    python bench/estimate_speed.py [--cluster 1024-h100-a100|1024xh100] [--repeats 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

from hapmoe_milp.config import ParallelConfig
from hapmoe_milp.cost.estimate import estimate, plan_stage_totals
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.cost.pipeline import simulate
from hapmoe_milp.plan import Plan, Stage, check_plan
from hapmoe_milp.specs import Catalog


def deepseek_plan(cluster_name: str, device_order: list[str], gbs: int) -> Plan:
    cfg = ParallelConfig(tp=1, cp=1, dp=64, ep=64, etp=1)
    counts = [3] + [4] * 14 + [3]  # 62 placeable layers (61 decoder + 1 MTP) over 16 stages
    stages, pos = [], 0
    for i, n in enumerate(counts):
        stages.append(Stage(device_order[i], cfg, pos, pos + n, "full"))
        pos += n
    return Plan("deepseek-v3", cluster_name, "hetero", tuple(stages), gbs, 4096, 1)


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="1024-h100-a100")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--gbs", type=int, default=4096)
    args = ap.parse_args()

    cat = Catalog()
    model = cat.model("deepseek-v3")
    cluster = cat.cluster(args.cluster)
    inv = cluster.inventory
    order: list[str] = []
    for did in cluster.device_types:  # stages take each type's devices in order, 64 at a time
        order += [did] * (inv[did] // 64)
    if len(order) < 16:
        raise SystemExit(f"{args.cluster} has {sum(inv.values())} devices; the plan needs 16 x 64")
    plan = deepseek_plan(cluster.name, order[:16], args.gbs)
    check_plan(plan, model, cluster)
    st = plan.settings()

    # first call in the process (imports warm, memo empty)
    t0 = time.perf_counter()
    first = estimate(model, cluster, plan)
    first_ms = (time.perf_counter() - t0) * 1e3

    cold = median_ms(lambda: estimate(model, cluster, plan), args.repeats)
    cm = CostModel(model, cluster, st)
    estimate(model, cluster, plan, cost_model=cm)
    warm = median_ms(lambda: estimate(model, cluster, plan, cost_model=cm), args.repeats)
    sim_est = median_ms(lambda: estimate(model, cluster, plan, cost_model=cm, simulate_schedule=True), args.repeats)
    totals = plan_stage_totals(cm, plan)
    delays = [0.0] + [t.p2p_out for t in totals[:-1]]
    fwd, bwd = [t.fwd for t in totals], [t.bwd for t in totals]
    sim_only = median_ms(lambda: simulate(fwd, bwd, delays, plan.num_microbatches), args.repeats)
    sim = estimate(model, cluster, plan, cost_model=cm, simulate_schedule=True)

    print(
        f"DeepSeek-V3 on {cluster.name} ({plan.devices_used} devices): PP{plan.pp} x 64 devices "
        f"(TP1 CP1 DP64 EP64), GBS {plan.global_batch_size}, M = {plan.num_microbatches}, "
        f"types {'/'.join(cluster.device_types)}"
    )
    print(
        f"  prediction: iteration {first.iteration_time_s:.2f} s closed form, {sim.iteration_time_s:.2f} s simulated; "
        f"MFU {first.mfu:.1%}; fits {first.fits}"
    )
    print(f"  closed-form estimate, first call in process : {first_ms:8.3f} ms")
    print(f"  closed-form estimate, cold (new CostModel)  : {cold:8.3f} ms  (median of {args.repeats})")
    print(f"  closed-form estimate, warm (memo populated) : {warm:8.3f} ms  (median of {args.repeats})")
    print(f"  estimate with 1F1B simulation, warm        : {sim_est:8.3f} ms  (median of {args.repeats})")
    print(
        f"  simulate() alone ({plan.pp} stages x {plan.num_microbatches} micro-batches x 2 ops): "
        f"{sim_only:8.3f} ms  (median of {args.repeats})"
    )
    print(f"  target: closed form well under 10 ms -> {'met' if cold < 10 else 'MISSED'}")


if __name__ == "__main__":
    main()
