"""PuLP MILP of one exact sub-problem (see :mod:`hapmoe_milp.search.exact` for the formulation).

Same variables as the CP-SAT model, linearised instead of enforced:

- ``u[k,o,kind] = n[k,kind] * z[k,o]`` (continuous; exact at integral ``z`` through
  ``sum_o u[k,o,kind] = n[k,kind]`` and ``u <= count(kind) z``), so stage time, memory and sync are
  plain linear rows with no big-M;
- ``y[k,o] = first[k] * z[k,o]`` the same way (``sum_o y = first``, ``y <= z``);
- the p2p of slot k towards slot k-1's link class ``j`` uses one big-M row per (k, j):
  ``p[k] >= sum_o p2p[o,j] z[k,o] - max_o p2p[o,j] (1 - class[k-1,j])``.

Units: GiB, and a power-of-ten time unit that puts the root bound between 1e3 and 1e4 (solver
tolerances are absolute, so the unit follows the problem's scale). Nothing is rounded; the reported objective is still a fresh
``cost.estimate`` of the decoded plan, and "optimal" means within the relative MIP gap (1e-7 unless
``relative_gap`` is given). Every row has a unique readable name (``mem_k3_h800_TP2CP1DP1EP2ETP1_none``)
so ``violated_rows`` can name what a candidate assignment breaks.

Backends: ``highs`` (default; ``pulp.HiGHS`` over highspy, with the warm start passed through
``Highs.setSolution`` and the proven bound read from ``mip_dual_bound``) or ``cbc`` (``PULP_CBC_CMD``,
warm start through its ``warmStart`` file; CBC's bound is not read back, so a CBC run that stops on
time reports the sub-problem's root bound).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import warnings
from typing import Any

import pulp

from hapmoe_milp.cost.primitives import GIB
from hapmoe_milp.errors import SolverError
from hapmoe_milp.search.exact import Assignment, SubModel, SubResult, extra_hint_values, option_name

log = logging.getLogger(__name__)


def time_unit(sub: SubModel) -> float:
    """Power-of-ten time unit putting the sub-problem's root bound between 1e3 and 1e4 model units.

    Solver tolerances are absolute (1e-7 on rows, 1e-6 on the objective), so the unit follows the
    problem's scale: milliseconds-to-10 ms for full-size models, microseconds for the tiny test models.
    """
    root = sub.root_bound if math.isfinite(sub.root_bound) and sub.root_bound > 0 else 1.0
    return 10.0 ** math.floor(math.log10(root)) / 1e3


MEM_UNIT_B = GIB  # model memory unit: GiB
DEFAULT_GAP = 1e-7


def describe_scaling(options: dict[str, Any]) -> dict[str, Any]:
    return {"time_unit": "auto (root bound / 1e3..1e4)", "memory_unit_bytes": MEM_UNIT_B, "real_valued": True}


class _HiGHSWarm(pulp.HiGHS):  # type: ignore[misc,name-defined]
    """pulp.HiGHS that hands variables' initial values to HiGHS as a starting solution (``setSolution``;
    pulp 3.3's HiGHS class has no warm start) and resets HiGHS's global thread pool after the run."""

    def __init__(self, *args: Any, warm: bool = False, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.warm = warm

    def callSolver(self, lp: pulp.LpProblem) -> None:
        if self.warm:
            import numpy as np

            idx, val = [], []
            for v in lp.variables():
                if v.varValue is not None:
                    idx.append(v.index)
                    val.append(float(v.varValue))
            if idx:
                lp.solverModel.setSolution(len(idx), np.asarray(idx, dtype=np.int32), np.asarray(val, dtype=np.float64))
        lp.solverModel.run()
        # HiGHS keeps one global thread pool sized by the first run's ``threads``; a later run asking
        # for another size fails ("Not Set"), so release the pool after every solve
        with contextlib.suppress(AttributeError):  # older highspy has no reset
            lp.solverModel.resetGlobalScheduler(True)


def _var(
    prob: pulp.LpProblem, name: str, low: float | None = None, up: float | None = None, cat: str = "Continuous"
) -> Any:
    """A variable attached to ``prob`` (PuLP >= 3.3's ``add_variable``; plain ``LpVariable`` before)."""
    if hasattr(prob, "add_variable"):
        return prob.add_variable(name, low, up, cat=cat)
    return pulp.LpVariable(name, low, up, cat)  # pragma: no cover - older PuLP


def _rows(prob: pulp.LpProblem) -> list[tuple[str, Any]]:
    """(name, constraint) pairs under both PuLP APIs (a list from ``constraints()`` since 3.3)."""
    cons = prob.constraints
    if callable(cons):
        return [(c.name, c) for c in cons()]
    return list(cons.items())  # pragma: no cover - older PuLP


def _highs_available() -> bool:
    try:
        return bool(pulp.HiGHS(msg=False).available())
    except Exception:  # pragma: no cover - pulp without highspy
        return False


def solve_sub(
    sub: SubModel,
    *,
    time_limit: float | None = None,
    cutoff_s: float = math.inf,
    hint: Assignment | None = None,
    threads: int | None = None,
    relative_gap: float | None = None,
    backend: str | None = None,
    device_time_cuts: bool = True,
    relax: bool = False,
    check_hint: bool = False,
    msg: bool = False,
    **_: Any,
) -> SubResult:
    t0 = time.perf_counter()
    tu, mu = time_unit(sub), MEM_UNIT_B
    K, N = sub.K, sub.N
    opts = sub.options
    kinds = sub.kinds
    pr = sub.inst.pruning
    first_dp = sub.inst.first_dp
    cnt = {kd: len(sub.kind_layers[kd]) for kd in kinds}
    names = [option_name(o) for o in opts]
    prob = pulp.LpProblem("hapmoe_stage_plan", pulp.LpMinimize)
    B = pulp.LpBinary

    used = {k: _var(prob, f"used_k{k}", 0, 1, B) for k in range(1, K + 1)}
    used[1].lowBound = 1

    def u_(k: int) -> Any:
        return used[k] if k <= K else 0

    c = {(k, l): _var(prob, f"c_k{k}_l{l}", 0, 1, B) for k in range(2, K + 1) for l in range(N)}

    def cv(k: int, l: int) -> Any:
        if k == 1:
            return 1
        return c[(k, l)] if k <= K else 0

    for k in range(1, K):
        prob += used[k + 1] <= used[k], f"used_mono_k{k}"
    for k in range(2, K + 1):
        prob += c[(k, 0)] == used[k], f"layer0_k{k}"
        for l in range(N - 1):
            prob += c[(k, l + 1)] <= c[(k, l)], f"contig_l_k{k}_l{l}"
        if k < K:
            for l in range(N):
                prob += c[(k + 1, l)] <= c[(k, l)], f"contig_k_k{k}_l{l}"
    n = {}
    for k in range(1, K + 1):
        for kd in kinds:
            pos = sub.kind_layers[kd]
            n[(k, kd)] = pulp.lpSum(cv(k, l) for l in pos) - pulp.lpSum(cv(k + 1, l) for l in pos)
        prob += pulp.lpSum(n[(k, kd)] for kd in kinds) >= used[k], f"nonempty_k{k}"
    z = {
        (k, i): _var(prob, f"z_k{k}_{names[i]}", 0, 1, B)
        for k in range(1, K + 1)
        for i in range(len(opts))
        if sub.allowed[k - 1][i]
    }
    zk: dict[int, list[int]] = {k: [i for i in range(len(opts)) if (k, i) in z] for k in range(1, K + 1)}
    u = {(k, i, kd): _var(prob, f"u_k{k}_{names[i]}_{kd}", 0, cnt[kd]) for (k, i) in z for kd in kinds}
    y = {(k, i): _var(prob, f"y_k{k}_{names[i]}", 0, 1) for (k, i) in z}
    for k in range(1, K + 1):
        prob += pulp.lpSum(z[(k, i)] for i in zk[k]) == used[k], f"one_option_k{k}"
        bad = [z[(k, i)] for i in zk[k] if opts[i].cfg.dp != first_dp]
        if bad:
            prob += pulp.lpSum(bad) <= u_(k + 1), f"first_dp_k{k}"
        first = used[k] - u_(k + 1)
        prob += pulp.lpSum(y[(k, i)] for i in zk[k]) == first, f"first_option_k{k}"
        for i in zk[k]:
            prob += y[(k, i)] <= z[(k, i)], f"first_link_k{k}_{names[i]}"
            for kd in kinds:
                prob += u[(k, i, kd)] <= cnt[kd] * z[(k, i)], f"count_link_k{k}_{names[i]}_{kd}"
        for kd in kinds:
            prob += pulp.lpSum(u[(k, i, kd)] for i in zk[k]) == n[(k, kd)], f"count_split_k{k}_{kd}"
    for t in sub.types:
        terms = [opts[i].devices * v for (k, i), v in z.items() if opts[i].device == t]
        if terms:
            prob += pulp.lpSum(terms) <= sub.inst.inventory[t], f"inventory_{t}"
    if len(sub.groups) > 1:
        gam = [_var(prob, f"group_{g}", 0, 1, B) for g in range(len(sub.groups))]
        prob += pulp.lpSum(gam) == 1, "one_group"
        for k in range(1, K + 1):
            for g, grp in enumerate(sub.groups):
                members = [z[(k, i)] for i in grp if (k, i) in z]
                if members:
                    prob += pulp.lpSum(members) <= gam[g], f"group_k{k}_g{g}"
    else:
        gam = []
    extra_vars: dict[tuple, Any] = {}
    if sub.contiguous and len(sub.types) > 1:
        for t in sub.types:
            b = {k: pulp.lpSum(z[(k, i)] for i in zk[k] if opts[i].device == t) for k in range(1, K + 1)}
            starts = []
            for k in range(1, K + 1):
                st_ = _var(prob, f"type_start_k{k}_{t}", 0, 1)
                extra_vars[("start", k, t)] = st_
                prob += st_ >= b[k] - (b[k - 1] if k > 1 else 0), f"type_start_k{k}_{t}"
                starts.append(st_)
            prob += pulp.lpSum(starts) <= 1, f"contiguous_{t}"
    if sub.same_size:
        for t in sub.types:
            sizes = sorted({o.devices for o in opts if o.device == t})
            for k in range(1, K):
                here_t = pulp.lpSum(z[(k, i)] for i in zk[k] if opts[i].device == t)
                for g in sizes:
                    a_k = pulp.lpSum(z[(k, i)] for i in zk[k] if opts[i].device == t and opts[i].devices == g)
                    a_k1 = pulp.lpSum(z[(k + 1, i)] for i in zk[k + 1] if opts[i].device == t and opts[i].devices == g)
                    prob += a_k1 + here_t - a_k <= 1, f"same_size_k{k}_{t}_g{g}"
    for t in sub.align_types:
        node = sub.node[t]
        inv_t = sub.inst.inventory[t]
        cum: list[Any] = []
        for k in range(1, K + 1):
            cum.extend(opts[i].devices * z[(k, i)] for i in zk[k] if opts[i].device == t)
            q = _var(prob, f"node_q_k{k}_{t}", -1, inv_t // node + 1, pulp.LpInteger)
            r = _var(prob, f"node_r_k{k}_{t}", 0, node - 1)
            extra_vars[("q", k, t)], extra_vars[("r", k, t)] = q, r
            prob += inv_t - pulp.lpSum(cum) == node * q + r, f"offset_k{k}_{t}"
            here = [min(opts[i].devices, node) * z[(k, i)] for i in zk[k] if opts[i].device == t]
            if here:
                prob += r + pulp.lpSum(here) <= node, f"align_k{k}_{t}"
    if pr.layer_band:
        for k in range(1, K + 1):
            ntot = pulp.lpSum(n[(k, kd)] for kd in kinds)
            prob += ntot >= pulp.lpSum(opts[i].band[0] * z[(k, i)] for i in zk[k]), f"band_lo_k{k}"
            prob += ntot <= pulp.lpSum(opts[i].band[1] * z[(k, i)] for i in zk[k]), f"band_hi_k{k}"

    # p2p towards the next (later) stage's link class
    ncls = len(sub.classes)
    dcls = {
        (k, j): pulp.lpSum(z[(k, i)] for i in zk[k] if sub.cls_of[i] == j) for k in range(1, K) for j in range(ncls)
    }
    P = [[v / tu for v in row] for row in sub.p2p]
    p = {k: _var(prob, f"p2p_k{k}", 0) for k in range(2, K + 1)}
    for k in range(2, K + 1):
        for j in range(ncls):
            if not any(sub.cls_of[i] == j for i in zk[k - 1]):
                continue
            big = max((P[i][j] for i in zk[k]), default=0.0)
            if big <= 0:
                continue
            prob += (
                p[k] >= pulp.lpSum(P[i][j] * z[(k, i)] for i in zk[k]) - big * (1 - dcls[(k - 1, j)]),
                f"p2p_k{k}_to_{sub.classes[j][0]}_{'small' if sub.classes[j][1] else 'node'}",
            )

    # stage time, memory, sync
    T = [{kd: sub.time_kind(i, kd) / tu for kd in kinds} for i in range(len(opts))]
    TF = [sub.time_first(i) / tu for i in range(len(opts))]
    TL = [sub.time_last(i) / tu for i in range(len(opts))]
    tau = {k: _var(prob, f"tau_k{k}", 0) for k in range(1, K + 1)}
    tmax = _var(prob, "tau_max", 0)
    sigma = _var(prob, "sigma_max", 0)
    work: dict[int, Any] = {}
    for k in range(1, K + 1):
        last = k == 1
        work[k] = (
            pulp.lpSum(T[i][kd] * u[(k, i, kd)] for i in zk[k] for kd in kinds)
            + pulp.lpSum(TF[i] * y[(k, i)] for i in zk[k])
            + (pulp.lpSum(TL[i] * z[(k, i)] for i in zk[k]) if last else 0)
        )
        prob += tau[k] >= work[k] + (2 * p[k] if k >= 2 else 0), f"time_k{k}"
        prob += tmax >= tau[k], f"tau_max_k{k}"
        for i in zk[k]:
            mem_k = {kd: sub.mem_kind(i, kd, k) / mu for kd in kinds}
            mf = sub.mem_first(i, k) / mu
            fixed = sub.mem_fixed(i, k) / mu
            capg = opts[i].capacity / mu
            if sum(mem_k[kd] * cnt[kd] for kd in kinds) + mf + fixed <= capg:
                continue
            prob += (
                pulp.lpSum(mem_k[kd] * u[(k, i, kd)] for kd in kinds) + mf * y[(k, i)] + (fixed - capg) * z[(k, i)]
                <= 0,
                f"mem_k{k}_{names[i]}",
            )
        for q, pc in enumerate(sub.pieces):
            expr = pulp.lpSum(sub.piece_kind(pc, i, kd) / tu * u[(k, i, kd)] for i in zk[k] for kd in kinds)
            expr += pulp.lpSum(sub.piece_first(pc, i) / tu * y[(k, i)] for i in zk[k])
            if last:
                expr += pulp.lpSum(sub.piece_last(pc, i) / tu * z[(k, i)] for i in zk[k])
            prob += sigma >= expr, f"sync_k{k}_p{q}"
        if pr.cross_type_comm and k >= 2:
            for i in zk[k]:
                for j in range(ncls):
                    if sub.classes[j][0] == opts[i].device or not any(sub.cls_of[x] == j for x in zk[k - 1]):
                        continue
                    comp = pulp.lpSum(T[i][kd] * u[(k, i, kd)] for kd in kinds) + TF[i] * y[(k, i)]
                    prob += (
                        2 * P[i][j] * (z[(k, i)] + dcls[(k - 1, j)] - 1) <= pr.eta * comp,
                        f"cross_type_k{k}_{names[i]}_c{j}",
                    )
    # valid cuts: the DP's root bound, and per device type "device-seconds used <= inventory x tau_max"
    D = sum(sub.inst.inventory.values())
    W = [sum(min(T[i][kd] * opts[i].devices for i in g) for kd in sub.inst.layer_kinds) for g in sub.groups]
    gmax = [max(opts[i].devices for i in g) for g in sub.groups]
    prob += tmax >= min(w / D for w in W), "root_tau_max"
    if math.isfinite(sub.tau_floor) and sub.tau_floor > 0:
        prob += tmax >= sub.tau_floor / tu * (1 - 1e-12), "covering_tau_max"
    fastest = sum(min(T[i][kd] for i in range(len(opts))) for kd in sub.inst.layer_kinds)
    prob += pulp.lpSum(tau.values()) >= fastest * (1 - 1e-12), "fastest_sum_tau"
    prob += pulp.lpSum(tau.values()) >= min(w / g for w, g in zip(W, gmax)), "root_sum_tau"
    if device_time_cuts:
        for t in sub.types:
            terms = []
            for k in range(1, K + 1):
                for i in zk[k]:
                    if opts[i].device != t:
                        continue
                    g = opts[i].devices
                    terms.extend(g * T[i][kd] * u[(k, i, kd)] for kd in kinds)
                    terms.append(g * TF[i] * y[(k, i)])
                    if k == 1:
                        terms.append(g * TL[i] * z[(k, i)])
            if terms:
                prob += pulp.lpSum(terms) <= sub.inst.inventory[t] * tmax, f"device_time_{t}"

    obj = sub.alpha * pulp.lpSum(tau.values()) + sub.beta * tmax + sigma
    prob += obj
    if math.isfinite(cutoff_s):
        prob += obj <= cutoff_s / tu * (1 + 1e-9), "cutoff"

    hint_violations: list[str] | None = None
    if hint is not None:
        _set_initial(sub, hint, used, c, z, u, y, p, tau, tmax, sigma, gam, T, TF, TL, P, tu)
        for key, val in extra_hint_values(sub, hint, extra_vars).items():
            extra_vars[key].setInitialValue(val)
        if check_hint:
            hint_violations = violated_rows(prob)
            if hint_violations:
                log.warning("milp: the warm start breaks %d rows, e.g. %s", len(hint_violations), hint_violations[:3])

    gap = DEFAULT_GAP if relative_gap is None else float(relative_gap)
    name = (backend or "highs").lower()
    thr = int(threads) if threads else min(16, os.cpu_count() or 1)
    if name == "highs" and not _highs_available():
        log.warning("HiGHS (highspy) is not available; falling back to CBC")
        name = "cbc"
    if name == "highs":
        # gapAbs=0: HiGHS's default absolute gap (1e-6 model units = 1 ns) would stop tiny models early
        solver = _HiGHSWarm(
            mip=not relax,
            msg=msg,
            timeLimit=time_limit,
            gapRel=gap,
            gapAbs=0.0,
            threads=thr,
            warm=hint is not None and not relax,
        )
    elif name == "cbc":
        with warnings.catch_warnings():  # PuLP 3.3 deprecates the bundled CBC; it is still the fallback here
            warnings.simplefilter("ignore", DeprecationWarning)
            solver = pulp.PULP_CBC_CMD(
                msg=msg, timeLimit=time_limit, gapRel=gap, gapAbs=0.0, threads=thr, warmStart=hint is not None
            )
    else:
        raise SolverError(f"unknown MILP backend {backend!r}; use highs or cbc", field="backend")
    t_build = time.perf_counter() - t0
    try:
        prob.solve(solver)
    except pulp.PulpSolverError as exc:
        raise SolverError(f"MILP backend {name} failed: {exc}") from None
    stats: dict[str, Any] = {
        "variables": len(prob.variables()),
        "constraints": len(_rows(prob)),
        "build_s": t_build,
        "backend": name,
        "relative_gap": gap,
        "time_unit_s": tu,
    }
    if hint_violations is not None:
        stats["hint_violations"] = hint_violations
    status, bound_units = _status(prob, name, gap)
    if name == "highs":
        h = prob.solverModel
        stats["highs_status"] = h.modelStatusToString(h.getModelStatus())
    if relax:  # LP relaxation only: a bound, no plan
        stats["lp"] = {v.name: v.varValue for v in prob.variables() if v.varValue and abs(v.varValue) > 1e-6}
        ok = status == "optimal"
        val = pulp.value(prob.objective) * tu if ok else math.inf
        return SubResult("feasible" if ok else "infeasible", None, val, time.perf_counter() - t0, stats)
    assignment: Assignment | None = None
    if status in ("optimal", "feasible"):
        assignment = _decode(sub, used, c, z)
        stats["model_objective"] = pulp.value(prob.objective)
    bound = max(0.0, bound_units * tu) if bound_units is not None and math.isfinite(bound_units) else 0.0
    if status == "optimal" and bound_units is None:
        bound = pulp.value(prob.objective) * tu * (1 - gap)
    # a sub-problem bound from the LP can only be trusted up to the solver's feasibility tolerance
    bound = max(0.0, bound * (1 - 1e-9))
    if status == "infeasible":
        stats["note"] = "infeasible under the cutoff" if math.isfinite(cutoff_s) else "no plan fits"
    return SubResult(status, assignment, bound, time.perf_counter() - t0, stats)  # type: ignore[arg-type]


def _status(prob: pulp.LpProblem, backend: str, gap: float) -> tuple[str, float | None]:
    """Map the backend's result to (status, proven bound in model units or None)."""
    if backend == "highs":
        import highspy

        h = prob.solverModel
        ms = h.getModelStatus()
        info = h.getInfo()
        has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
        bound = info.mip_dual_bound
        bound = None if bound is None or not math.isfinite(bound) else float(bound)
        S = highspy.HighsModelStatus
        if ms == S.kOptimal:
            return "optimal", bound if bound is not None else pulp.value(prob.objective)
        if ms in (S.kInfeasible, S.kUnboundedOrInfeasible):
            return "infeasible", None
        if has_sol:
            return "feasible", bound
        return "timeout", bound
    st = prob.status
    sol = prob.sol_status
    if st == pulp.LpStatusOptimal and sol == pulp.LpSolutionOptimal:
        return "optimal", None
    if st == pulp.LpStatusInfeasible:
        return "infeasible", None
    if sol == pulp.LpSolutionIntegerFeasible:
        return "feasible", None
    return "timeout", None


def _val(v: Any) -> float:
    if isinstance(v, (int, float)):
        return float(v)
    x = v.varValue
    return 0.0 if x is None else float(x)


def _decode(sub: SubModel, used: dict, c: dict, z: dict) -> Assignment:
    K, N = sub.K, sub.N
    out: Assignment = []

    def ends(k: int) -> int:
        if k == 1:
            return N
        if k > K:
            return 0
        return sum(1 for l in range(N) if _val(c[(k, l)]) > 0.5)

    for k in range(K, 0, -1):
        if _val(used[k]) < 0.5:
            continue
        i = max((i for (kk, i) in z if kk == k), key=lambda i: _val(z[(k, i)]))
        out.append((i, ends(k + 1), ends(k)))
    return out


def _set_initial(sub, hint, used, c, z, u, y, p, tau, tmax, sigma, gam, T, TF, TL, P, tu) -> None:  # type: ignore[no-untyped-def]
    """Initial values of every variable on the hint plan (read by the warm start)."""
    K = sub.K
    Pn = len(hint)
    slot = {Pn - j: a for j, a in enumerate(hint)}
    for k in range(1, K + 1):
        used[k].setInitialValue(1 if k <= Pn else 0)
    for (k, l), v in c.items():
        v.setInitialValue(1 if k in slot and l < slot[k][2] else 0)
    taus = {}
    sig = 0.0
    for k in range(1, K + 1):
        a = slot.get(k)
        cnts = sub.counts(a[1], a[2]) if a else dict.fromkeys(sub.kinds, 0)
        for (kk, i), v in z.items():
            if kk != k:
                continue
            on = a is not None and a[0] == i
            v.setInitialValue(1 if on else 0)
            y[(k, i)].setInitialValue(1 if on and k == Pn else 0)
            for kd in sub.kinds:
                u[(k, i, kd)].setInitialValue(cnts[kd] if on else 0)
        pk = 0.0
        if k >= 2 and a is not None:
            pk = P[a[0]][sub.cls_of[slot[k - 1][0]]]
        if k in p:
            p[k].setInitialValue(pk)
        t = 0.0
        if a is not None:
            i = a[0]
            first = k == Pn
            t = sum(T[i][kd] * cnts[kd] for kd in sub.kinds) + (TF[i] if first else 0) + (TL[i] if k == 1 else 0)
            t += 2 * pk
            for pc in sub.pieces:
                s = sum(sub.piece_kind(pc, i, kd) * cnts[kd] for kd in sub.kinds)
                s += sub.piece_first(pc, i) if first else 0.0
                s += sub.piece_last(pc, i) if k == 1 else 0.0
                sig = max(sig, s / tu)
        taus[k] = t
        tau[k].setInitialValue(t)
    tmax.setInitialValue(max(taus.values()))
    sigma.setInitialValue(sig)
    for g, b in enumerate(gam):
        b.setInitialValue(1 if hint[0][0] in sub.groups[g] else 0)


def violated_rows(prob: pulp.LpProblem, tol: float = 1e-6) -> list[str]:
    """Names of the rows the variables' current values break (as meta-pytorch/autoparallel reports)."""
    out = []
    for name, con in _rows(prob):
        v = con.value()
        if v is None:
            continue
        if (
            (con.sense == pulp.LpConstraintLE and v > tol)
            or (con.sense == pulp.LpConstraintGE and v < -tol)
            or (con.sense == pulp.LpConstraintEQ and abs(v) > tol)
        ):
            out.append(name)
    return out


__all__ = ["DEFAULT_GAP", "describe_scaling", "solve_sub", "violated_rows"]
