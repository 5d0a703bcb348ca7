"""CP-SAT model of one exact sub-problem (see :mod:`hapmoe_milp.search.exact` for the formulation).

Integer scaling, and why the certificate stays honest:

- Times are integers in units of ``resolution_s`` (default: the power of ten that keeps the worst-case
  rounding error below 1e-6 of the sub-problem's root lower bound; 1 ns for Mixtral on 16 devices, 10 ps
  for the tiny test models). Every time coefficient is rounded **down**, so for every plan the model objective is <= the true objective / resolution. Hence the
  model's proven bound times the resolution is a valid lower bound on the true optimum, with nothing
  to subtract. The price is that the model may rank plans that are within the rounding error of each
  other wrongly: the plan it returns is optimal to within ``tolerance_s`` = resolution x (alpha (N + 4K)
  + beta (N + 4) + N + 3), the worst case of one unit lost per coefficient use. The reported objective
  is always a fresh ``cost.estimate`` of the decoded plan.
- Memory is in integers of ``memory_unit`` bytes (default 1 KiB), coefficients rounded **up** and
  capacity **down**, so a returned plan always fits. This excludes plans whose memory slack is below
  (N + 3) units (a few tens of KiB per device); the bound is proven over the remaining plans.

Every stage constraint is stated for each option and enforced only when that option is chosen
(``OnlyEnforceIf``), which is what CP-SAT propagates well. Its LP relaxation of such constraints is
weak, so the same rows are added again in product form (``u = n z``, ``y = first z``, as in the MILP:
each slot's convex hull), with per-device-type "device-seconds <= inventory x tau_max" cuts, the DP's
root bound, and the positional covering bound on ``tau_max`` (``exact.covering_bound``). Adjacent
identical middle stages are ordered by layer count when every layer has the same kind (swapping their
layers keeps every cost and only lowers the earlier stage's in-flight memory), which removes mirrored
solutions.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

from ortools.sat.python import cp_model

from hapmoe_milp.errors import SolverError
from hapmoe_milp.search.exact import Assignment, SubModel, SubResult, extra_hint_values, option_name

log = logging.getLogger(__name__)

DEFAULT_MEMORY_UNIT = 1024.0
#: With ``resolution_s=None`` the time unit is the power of ten that keeps the worst-case rounding
#: error (``tolerance_s``) below this fraction of the sub-problem's root lower bound, hence of its optimum.
TARGET_RELATIVE_TOLERANCE = 1e-6

_STATUS = {
    cp_model.OPTIMAL: "optimal",
    cp_model.FEASIBLE: "feasible",
    cp_model.INFEASIBLE: "infeasible",
    cp_model.UNKNOWN: "timeout",
}


def describe_scaling(options: dict[str, Any]) -> dict[str, Any]:
    res = options.get("resolution_s")
    return {
        "time_resolution": "auto" if res is None else float(res),
        "memory_unit_bytes": float(options.get("memory_unit", DEFAULT_MEMORY_UNIT)),
    }


def auto_resolution(sub: SubModel) -> float:
    """Power-of-ten time unit with ``tolerance_s <= TARGET_RELATIVE_TOLERANCE x root bound``."""
    per_unit = tolerance_s(sub, 1.0)
    root = sub.root_bound if math.isfinite(sub.root_bound) and sub.root_bound > 0 else 1e-3
    res = TARGET_RELATIVE_TOLERANCE * root / per_unit
    return 10.0 ** math.floor(math.log10(res))


def _down(x: float, unit: float) -> int:
    return math.floor(x / unit)


def _up(x: float, unit: float) -> int:
    return math.ceil(x / unit)


def tolerance_s(sub: SubModel, resolution_s: float) -> float:
    """Worst-case amount by which the scaled objective can under-rate a plan (see module doc)."""
    n, k = sub.N, sub.K
    return resolution_s * (sub.alpha * (n + 4 * k) + sub.beta * (n + 4) + n + 3)


def solve_sub(
    sub: SubModel,
    *,
    time_limit: float | None = None,
    cutoff_s: float = math.inf,
    hint: Assignment | None = None,
    threads: int | None = None,
    relative_gap: float | None = None,
    backend: str | None = None,
    resolution_s: float | None = None,
    memory_unit: float = DEFAULT_MEMORY_UNIT,
    symmetry: bool = True,
    linearized: bool = True,
    fix_hint: bool = False,
    log_search: bool = False,
    **_: Any,
) -> SubResult:
    t0 = time.perf_counter()
    res = float(resolution_s) if resolution_s else auto_resolution(sub)
    mu = float(memory_unit)
    K, N = sub.K, sub.N
    opts = sub.options
    kinds = sub.kinds
    pr = sub.inst.pruning
    first_dp = sub.inst.first_dp
    alpha, beta = round(sub.alpha), round(sub.beta)
    if abs(alpha - sub.alpha) > 1e-12 or abs(beta - sub.beta) > 1e-12:
        raise SolverError(f"cpsat needs integral pipeline coefficients, got {sub.alpha}, {sub.beta}")
    m = cp_model.CpModel()

    # ---------------------------------------------------------------- structure
    used: dict[int, Any] = {k: m.new_bool_var(f"used_k{k}") for k in range(1, K + 1)}
    m.add(used[1] == 1).with_name("used_k1")
    for k in range(1, K):
        m.add_implication(used[k + 1], used[k]).with_name(f"used_mono_k{k}")

    def u_(k: int) -> Any:
        return used[k] if k <= K else 0

    c: dict[int, list[Any]] = {k: [m.new_bool_var(f"c_k{k}_l{l}") for l in range(N)] for k in range(2, K + 1)}

    def cv(k: int, l: int) -> Any:
        if k == 1:
            return 1
        return c[k][l] if k <= K else 0

    for k in range(2, K + 1):
        m.add(c[k][0] == used[k]).with_name(f"layer0_k{k}")
        for l in range(N - 1):
            m.add_implication(c[k][l + 1], c[k][l]).with_name(f"contig_l_k{k}_l{l}")
        if k < K:
            for l in range(N):
                m.add_implication(c[k + 1][l], c[k][l]).with_name(f"contig_k_k{k}_l{l}")
    n: dict[int, dict[str, Any]] = {}
    ntot: dict[int, Any] = {}
    for k in range(1, K + 1):
        n[k] = {}
        for kd in kinds:
            pos = sub.kind_layers[kd]
            v = m.new_int_var(0, len(pos), f"n_k{k}_{kd}")
            m.add(v == sum(cv(k, l) for l in pos) - sum(cv(k + 1, l) for l in pos)).with_name(f"count_k{k}_{kd}")
            n[k][kd] = v
        ntot[k] = sum(n[k].values())
        m.add(ntot[k] >= used[k]).with_name(f"nonempty_k{k}")

    z: dict[int, dict[int, Any]] = {}
    for k in range(1, K + 1):
        z[k] = {i: m.new_bool_var(f"z_k{k}_{option_name(opts[i])}") for i in range(len(opts)) if sub.allowed[k - 1][i]}
        m.add(sum(z[k].values()) == used[k]).with_name(f"one_option_k{k}")
        bad = [v for i, v in z[k].items() if opts[i].cfg.dp != first_dp]
        if bad:
            m.add(sum(bad) <= u_(k + 1)).with_name(f"first_dp_k{k}")
    for t in sub.types:
        terms = [opts[i].devices * v for k in z for i, v in z[k].items() if opts[i].device == t]
        if terms:
            m.add(sum(terms) <= sub.inst.inventory[t]).with_name(f"inventory_{t}")
    if len(sub.groups) > 1:
        gam = [m.new_bool_var(f"group_{g}") for g in range(len(sub.groups))]
        m.add_exactly_one(gam).with_name("one_group")
        gof = {i: g for g, grp in enumerate(sub.groups) for i in grp}
        for k in z:
            for i, v in z[k].items():
                m.add_implication(v, gam[gof[i]])
    else:
        gam = []
    # hetero: each device type's stages are one contiguous block (FlagScale ranks meshes by type)
    extra_vars: dict[tuple, Any] = {}
    if sub.contiguous and len(sub.types) > 1:
        for t in sub.types:
            b = {k: sum(v for i, v in z[k].items() if opts[i].device == t) for k in z}
            starts = []
            for k in z:
                st_ = m.new_bool_var(f"type_start_k{k}_{t}")
                extra_vars[("start", k, t)] = st_
                m.add(st_ >= b[k] - (b[k - 1] if k > 1 else 0)).with_name(f"type_start_k{k}_{t}")
                starts.append(st_)
            m.add(sum(starts) <= 1).with_name(f"contiguous_{t}")
    if sub.same_size:
        for t in sub.types:
            sizes = sorted({opts[i].devices for i in range(len(opts)) if opts[i].device == t})
            for k in range(1, K):
                here_t = sum(v for i, v in z[k].items() if opts[i].device == t)
                for g in sizes:
                    a_k = sum(v for i, v in z[k].items() if opts[i].device == t and opts[i].devices == g)
                    a_k1 = sum(v for i, v in z[k + 1].items() if opts[i].device == t and opts[i].devices == g)
                    m.add(a_k1 + here_t - a_k <= 1).with_name(f"same_size_k{k}_{t}_g{g}")
    # stages take their type's devices from the end; a block must not straddle a node boundary
    for t in sub.align_types:
        node = sub.node[t]
        inv_t = sub.inst.inventory[t]
        cum: list[Any] = []
        for k in z:
            cum.extend(opts[i].devices * v for i, v in z[k].items() if opts[i].device == t)
            q = m.new_int_var(-1, inv_t // node + 1, f"node_q_k{k}_{t}")
            r = m.new_int_var(0, node - 1, f"node_r_k{k}_{t}")
            extra_vars[("q", k, t)], extra_vars[("r", k, t)] = q, r
            m.add(inv_t - sum(cum) == node * q + r).with_name(f"offset_k{k}_{t}")
            here = [min(opts[i].devices, node) * v for i, v in z[k].items() if opts[i].device == t]
            if here:
                m.add(r + sum(here) <= node).with_name(f"align_k{k}_{t}")
    if pr.layer_band:
        for k in z:
            for i, v in z[k].items():
                lo, hi = opts[i].band
                if lo > 1:
                    m.add(ntot[k] >= lo).only_enforce_if(v).with_name(f"band_lo_k{k}_{option_name(opts[i])}")
                if hi < N:
                    m.add(ntot[k] <= hi).only_enforce_if(v).with_name(f"band_hi_k{k}_{option_name(opts[i])}")

    # ---------------------------------------------------------------- link classes and p2p
    ncls = len(sub.classes)
    d: dict[int, dict[int, Any]] = {}
    for k in range(1, K):
        d[k] = {}
        for j in range(ncls):
            members = [v for i, v in z[k].items() if sub.cls_of[i] == j]
            if members:
                b = m.new_bool_var(f"class_k{k}_{sub.classes[j][0]}_{'small' if sub.classes[j][1] else 'node'}")
                m.add(b == sum(members)).with_name(f"class_k{k}_c{j}")
                d[k][j] = b
    P = [[_down(v, res) for v in row] for row in sub.p2p]
    pmax = max((max(r) for r in P), default=0)
    p: dict[int, Any] = {}
    for k in range(2, K + 1):
        p[k] = m.new_int_var(0, pmax, f"p2p_k{k}")
        for j, b in d[k - 1].items():
            terms = [P[i][j] * v for i, v in z[k].items() if P[i][j]]
            if terms:
                m.add(p[k] >= sum(terms)).only_enforce_if(b).with_name(f"p2p_k{k}_to_c{j}")

    # ---------------------------------------------------------------- time, memory, sync
    T = [{kd: _down(sub.time_kind(i, kd), res) for kd in kinds} for i in range(len(opts))]
    TF = [_down(sub.time_first(i), res) for i in range(len(opts))]
    TL = [_down(sub.time_last(i), res) for i in range(len(opts))]
    cnt = {kd: len(sub.kind_layers[kd]) for kd in kinds}
    tau_ub = max(sum(T[i][kd] * cnt[kd] for kd in kinds) + TF[i] + TL[i] for i in range(len(opts))) + 2 * pmax
    tau = {k: m.new_int_var(0, tau_ub, f"tau_k{k}") for k in range(1, K + 1)}
    pieces = sub.pieces
    S = [[{kd: _down(sub.piece_kind(pc, i, kd), res) for kd in kinds} for i in range(len(opts))] for pc in pieces]
    SF = [[_down(sub.piece_first(pc, i), res) for i in range(len(opts))] for pc in pieces]
    SL = [[_down(sub.piece_last(pc, i), res) for i in range(len(opts))] for pc in pieces]
    sig_ub = max(
        max(0, sum(max(0, S[q][i][kd]) * cnt[kd] for kd in kinds) + max(0, SF[q][i]) + max(0, SL[q][i]))
        for q in range(len(pieces))
        for i in range(len(opts))
    )
    sigma = m.new_int_var(0, sig_ub, "sigma_max")
    tmax = m.new_int_var(0, tau_ub, "tau_max")
    cap = {i: _down(opts[i].capacity, mu) for i in range(len(opts))}
    eta = pr.eta
    n_sym = 0
    for k in range(1, K + 1):
        first = 1 - u_(k + 1) if k < K else 1
        last = k == 1
        tmin = {kd: min(T[i][kd] for i in z[k]) for kd in kinds} if z[k] else dict.fromkeys(kinds, 0)
        extra = 2 * p[k] if k >= 2 else 0
        m.add(tau[k] >= sum(tmin[kd] * n[k][kd] for kd in kinds) + extra).with_name(f"time_floor_k{k}")
        m.add(tmax >= tau[k]).with_name(f"tau_max_k{k}")
        for i, v in z[k].items():
            name = option_name(opts[i])
            expr = sum(T[i][kd] * n[k][kd] for kd in kinds) + TF[i] * first + (TL[i] if last else 0) + extra
            m.add(tau[k] >= expr).only_enforce_if(v).with_name(f"time_k{k}_{name}")
            # memory (conservative rounding); skipped when even all layers of every kind would fit
            mem_k = {kd: _up(sub.mem_kind(i, kd, k), mu) for kd in kinds}
            mf = _up(sub.mem_first(i, k), mu)
            rhs = cap[i] - _up(sub.mem_fixed(i, k), mu)
            worst = sum(mem_k[kd] * cnt[kd] for kd in kinds) + mf
            if worst > rhs:
                m.add(sum(mem_k[kd] * n[k][kd] for kd in kinds) + mf * first <= rhs).only_enforce_if(v).with_name(
                    f"mem_k{k}_{name}"
                )
            # exposed sync: one constraint per non-dominated piece
            vecs = []
            for q in range(len(pieces)):
                vec = (*(S[q][i][kd] for kd in kinds), SF[q][i], SL[q][i] if last else 0)
                vecs.append(vec)
            for q, vec in enumerate(vecs):
                if any(
                    r != q and all(a >= b for a, b in zip(vecs[r], vec)) and (vecs[r] != vec or r < q)
                    for r in range(len(vecs))
                ):
                    continue
                if all(x <= 0 for x in vec):
                    continue
                expr_s = sum(S[q][i][kd] * n[k][kd] for kd in kinds) + SF[q][i] * first + (SL[q][i] if last else 0)
                m.add(sigma >= expr_s).only_enforce_if(v).with_name(f"sync_k{k}_p{q}_{name}")
            if pr.cross_type_comm and k >= 2:
                comp = {kd: _up(eta * sub.time_kind(i, kd), res) for kd in kinds}
                compf = _up(eta * sub.time_first(i), res)
                for j, b in d[k - 1].items():
                    if sub.classes[j][0] == opts[i].device:
                        continue
                    need = _down(2 * sub.p2p[i][j], res)
                    m.add(sum(comp[kd] * n[k][kd] for kd in kinds) + compf * first >= need).with_name(
                        f"cross_type_k{k}_{name}_c{j}"
                    ).only_enforce_if([v, b])
        # symmetry: of two identical adjacent middle stages the earlier holds no more layers
        if symmetry and sub.uniform and k >= 2 and k + 2 <= K:
            for i, v in z[k].items():
                w = z[k + 1].get(i)
                if w is not None:
                    m.add(ntot[k + 1] <= ntot[k]).with_name(f"sym_k{k}_i{i}").only_enforce_if([v, w, used[k + 2]])
                    n_sym += 1
    lin_vars: dict[tuple, Any] = {}
    if linearized:
        lin_vars = _add_linearization(m, sub, z, n, used, tau, tmax, sigma, p, T, TF, TL, S, SF, SL, mu)
    # the DP's root bound as unconditional cuts, in the model's own (rounded-down) units so that they
    # hold for the scaled stage times: a stage of g devices takes >= W_stage / g, and sum(g) <= D
    D = sum(sub.inst.inventory.values())
    W = [sum(min(T[i][kd] * opts[i].devices for i in g) for kd in sub.inst.layer_kinds) for g in sub.groups]
    gmax = [max(opts[i].devices for i in g) for g in sub.groups]
    m.add(tmax >= min(-(-w // D) for w in W)).with_name("root_tau_max")
    # the covering bound is in seconds; the scaled stage time is below the true one by less than one
    # unit per rounded coefficient (N + 4 at most), so this cut is valid for the scaled model
    if math.isfinite(sub.tau_floor) and sub.tau_floor > 0:
        m.add(tmax >= max(0, _down(sub.tau_floor, res) - (N + 4))).with_name("covering_tau_max")
    fastest = sum(min(T[i][kd] for i in range(len(opts))) for kd in sub.inst.layer_kinds)
    m.add(sum(tau.values()) >= fastest).with_name("fastest_sum_tau")
    m.add(sum(tau.values()) >= min(-(-w // g) for w, g in zip(W, gmax))).with_name("root_sum_tau")

    obj = alpha * sum(tau.values()) + beta * tmax + sigma
    m.minimize(obj)
    if math.isfinite(cutoff_s):
        m.add(obj <= math.floor(cutoff_s / res * (1 + 1e-12))).with_name("cutoff")

    # ---------------------------------------------------------------- warm start
    if hint is not None:
        _add_hint(m, sub, hint, used, c, n, z, gam, d, p, tau, tmax, sigma, T, TF, TL, P, S, SF, SL)
        for key, val in extra_hint_values(sub, hint, extra_vars).items():
            m.add_hint(extra_vars[key], val)
        P_ = len(hint)
        slot_of = {P_ - j: a for j, a in enumerate(hint)}
        for key, var in lin_vars.items():
            a = slot_of.get(key[1])
            on = a is not None and a[0] == key[2]
            if key[0] == "y":
                m.add_hint(var, on and key[1] == P_)
            else:
                m.add_hint(var, sub.counts(a[1], a[2])[key[3]] if on else 0)

    solver = cp_model.CpSolver()
    prm = solver.parameters
    if time_limit is not None:
        prm.max_time_in_seconds = max(0.01, float(time_limit))
    prm.num_workers = int(threads) if threads else min(16, os.cpu_count() or 1)
    prm.random_seed = 0
    if relative_gap:
        prm.relative_gap_limit = float(relative_gap)
    prm.log_search_progress = bool(log_search)
    if fix_hint and hint is not None:  # tests: the hinted plan must be a solution of the model
        prm.fix_variables_to_their_hinted_value = True
    t_build = time.perf_counter() - t0
    status = solver.solve(m)
    st = _STATUS.get(status)
    if st is None:
        raise SolverError(f"CP-SAT rejected the model ({solver.status_name(status)}): {m.validate()}")
    proto = m.proto
    stats: dict[str, Any] = {
        "variables": len(proto.variables),
        "constraints": len(proto.constraints),
        "symmetry_cuts": n_sym,
        "build_s": t_build,
        "tolerance_s": tolerance_s(sub, res),
        "resolution_s": res,
        "cpsat_status": solver.status_name(status),
    }
    assignment: Assignment | None = None
    bound = 0.0
    if st in ("optimal", "feasible"):
        assignment = []
        for k in range(K, 0, -1):
            if not solver.boolean_value(used[k]):
                continue
            i = next(i for i, v in z[k].items() if solver.boolean_value(v))
            end = N if k == 1 else sum(solver.value(c[k][l]) for l in range(N))
            start = 0 if k == K else sum(solver.value(c[k + 1][l]) for l in range(N))
            assignment.append((i, start, end))
        stats["model_objective"] = solver.objective_value
    if st == "optimal":
        bound = solver.objective_value * res
    elif st in ("feasible", "timeout"):
        bound = math.ceil(solver.best_objective_bound - 1e-9) * res
    return SubResult(st, assignment, max(bound, 0.0), time.perf_counter() - t0, stats)  # type: ignore[arg-type]


def _add_linearization(m, sub, z, n, used, tau, tmax, sigma, p, T, TF, TL, S, SF, SL, mu) -> dict[tuple, Any]:  # type: ignore[no-untyped-def]
    """Redundant product form (as in the MILP) so the LP relaxation sees each slot's convex hull.

    ``u[k,i,kind] = n[k,kind] z[k,i]`` and ``y[k,i] = first[k] z[k,i]`` make stage time, memory and sync
    linear without enforcement literals; the per-device-type cuts ``sum g (time of stages on t) <= inv_t
    tau_max`` and the same for the optimizer part of ``sigma`` tie the pipeline's bottleneck to the
    devices the plan can actually use.
    """
    K = sub.K
    opts = sub.options
    kinds = sub.kinds
    cnt = {kd: len(sub.kind_layers[kd]) for kd in kinds}
    dev_time: dict[str, list[Any]] = {t: [] for t in sub.types}
    dev_opt: dict[str, list[Any]] = {t: [] for t in sub.types}
    opt_q = next((q for q, pc in enumerate(sub.pieces) if not pc), None)  # the optimizer-only piece
    out: dict[tuple, Any] = {}
    for k in range(1, K + 1):
        if not z[k]:
            continue
        first = used[k] - (used[k + 1] if k < K else 0)
        u = {}
        y = {}
        for i, v in z[k].items():
            for kd in kinds:
                u[(i, kd)] = m.new_int_var(0, cnt[kd], f"u_k{k}_i{i}_{kd}")
                m.add(u[(i, kd)] <= cnt[kd] * v)
                m.add(u[(i, kd)] == n[k][kd]).only_enforce_if(v)
            y[i] = m.new_bool_var(f"y_k{k}_i{i}")
            m.add_implication(y[i], v)
            out[("y", k, i)] = y[i]
            for kd in kinds:
                out[("u", k, i, kd)] = u[(i, kd)]
        for kd in kinds:
            m.add(sum(u[(i, kd)] for i in z[k]) == n[k][kd]).with_name(f"count_split_k{k}_{kd}")
        m.add(sum(y.values()) == first).with_name(f"first_option_k{k}")
        last = k == 1
        lin = []
        for i, v in z[k].items():
            lin.extend(T[i][kd] * u[(i, kd)] for kd in kinds)
            lin.append(TF[i] * y[i])
            if last:
                lin.append(TL[i] * v)
            g = opts[i].devices
            dev_time[opts[i].device].extend(g * T[i][kd] * u[(i, kd)] for kd in kinds)
            dev_time[opts[i].device].append(g * TF[i] * y[i])
            if last:
                dev_time[opts[i].device].append(g * TL[i] * v)
            if opt_q is not None:
                dev_opt[opts[i].device].extend(g * S[opt_q][i][kd] * u[(i, kd)] for kd in kinds)
                dev_opt[opts[i].device].append(g * SF[opt_q][i] * y[i])
                if last:
                    dev_opt[opts[i].device].append(g * SL[opt_q][i] * v)
            # memory in product form
            mem_k = {kd: _up(sub.mem_kind(i, kd, k), mu) for kd in kinds}
            rhs = _down(opts[i].capacity, mu) - _up(sub.mem_fixed(i, k), mu)
            mf = _up(sub.mem_first(i, k), mu)
            if sum(mem_k[kd] * cnt[kd] for kd in kinds) + mf > rhs:
                m.add(sum(mem_k[kd] * u[(i, kd)] for kd in kinds) + mf * y[i] <= rhs * v)
        m.add(tau[k] >= sum(lin) + (2 * p[k] if k >= 2 else 0)).with_name(f"time_lin_k{k}")
        for q in range(len(sub.pieces)):
            expr = []
            for i, v in z[k].items():
                expr.extend(S[q][i][kd] * u[(i, kd)] for kd in kinds)
                expr.append(SF[q][i] * y[i])
                if last:
                    expr.append(SL[q][i] * v)
            m.add(sigma >= sum(expr)).with_name(f"sync_lin_k{k}_p{q}")
    for t in sub.types:
        if dev_time[t]:
            m.add(sum(dev_time[t]) <= sub.inst.inventory[t] * tmax).with_name(f"device_time_{t}")
        if dev_opt[t]:
            m.add(sum(dev_opt[t]) <= sub.inst.inventory[t] * sigma).with_name(f"device_opt_{t}")
    return out


def _add_hint(m, sub, hint, used, c, n, z, gam, d, p, tau, tmax, sigma, T, TF, TL, P, S, SF, SL) -> None:  # type: ignore[no-untyped-def]
    """Hint every variable with the values the model takes on the given plan (a complete hint)."""
    K, N = sub.K, sub.N
    Pn = len(hint)
    slot = {Pn - j: a for j, a in enumerate(hint)}  # slot k -> (option, start, end)
    for k in range(1, K + 1):
        m.add_hint(used[k], k <= Pn)
    for k in range(2, K + 1):
        end = slot[k][2] if k in slot else 0
        for l in range(N):
            m.add_hint(c[k][l], l < end)
    taus = {}
    sig = 0
    for k in range(1, K + 1):
        a = slot.get(k)
        cnts = sub.counts(a[1], a[2]) if a else dict.fromkeys(sub.kinds, 0)
        for kd in sub.kinds:
            m.add_hint(n[k][kd], cnts[kd])
        for i, v in z[k].items():
            m.add_hint(v, a is not None and a[0] == i)
        if k in d:
            for j, b in d[k].items():
                m.add_hint(b, a is not None and sub.cls_of[a[0]] == j)
        pk = 0
        if k >= 2 and a is not None:
            pk = P[a[0]][sub.cls_of[slot[k - 1][0]]]
        if k in p:
            m.add_hint(p[k], pk)
        t = 0
        if a is not None:
            i = a[0]
            first = k == Pn
            t = sum(T[i][kd] * cnts[kd] for kd in sub.kinds) + (TF[i] if first else 0) + (TL[i] if k == 1 else 0)
            t += 2 * pk
            for q in range(len(sub.pieces)):
                s = sum(S[q][i][kd] * cnts[kd] for kd in sub.kinds) + (SF[q][i] if first else 0)
                s += SL[q][i] if k == 1 else 0
                sig = max(sig, s)
        taus[k] = t
        m.add_hint(tau[k], t)
    m.add_hint(tmax, max(taus.values()))
    m.add_hint(sigma, sig)
    if gam:
        for g, b in enumerate(gam):
            m.add_hint(b, hint[0][0] in sub.groups[g])


__all__ = [
    "DEFAULT_MEMORY_UNIT",
    "TARGET_RELATIVE_TOLERANCE",
    "auto_resolution",
    "describe_scaling",
    "solve_sub",
    "tolerance_s",
]
