"""CP-SAT translation of one depth model (:mod:`hapmoe_milp.search.depth_model`; the formulation is
:mod:`hapmoe_milp.search.formulation`), in the sections the MILP backend shares: structure, layout rules,
times, hint, configure, decode (:mod:`hapmoe_milp.search.backends`).

Integer scaling, and why the certificate stays honest:

- Times are integers in units of ``resolution_s`` (default: the power of ten that keeps the worst-case
  rounding error below 1e-6 of the model's lower bound). Every time coefficient (an arc's stage time,
  its sync, a p2p) is rounded **down**, so for every plan the model's stage times are at most the true
  ones: the model's proven bound times the resolution is a valid lower bound on the true optimum, and a
  plan under the true cutoff stays under the scaled cutoff. The price is that the model may rank plans
  within the rounding error of each other wrongly: a returned plan is optimal to within ``tolerance_s``
  = resolution x (alpha 3P + beta 3 + 1) (three rounded terms per stage: time and the two p2p halves).
  The reported objective is always a fresh ``cost.estimate`` of the decoded plan. The lower-bound cuts
  (``tau_max``, ``sum tau``, ``sigma``) are lowered by the same rounding so they hold for scaled times.
- The pipeline coefficients ``alpha, beta`` must be integral after one common scale ``c`` (1F1B: 1 and
  M - 1; interleaved with ``v`` chunks: ``1/v`` and ``M - 1/v``, so ``c = v``): the objective is
  multiplied by ``c`` and the bound divided back.
- Memory needs no scaling: an arc exists only if it fits (the formulation checks it in floating point,
  exactly as ``Instance.evaluate`` does).

Every row has a readable name (``time_k3``, ``p2p_k2_to_c1``, ``inventory_h800``, ...).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ortools.sat.python import cp_model

from hapmoe_milp.errors import SolverError
from hapmoe_milp.search.depth_model import DepthModel
from hapmoe_milp.search.formulation import SubResult

log = logging.getLogger(__name__)

NAME = "cpsat"
#: With ``resolution_s=None`` the time unit is the power of ten that keeps the worst-case rounding
#: error (``tolerance_s``) below this fraction of the model's lower bound, hence of its optimum.
TARGET_RELATIVE_TOLERANCE = 1e-6

_STATUS = {
    cp_model.OPTIMAL: "optimal",
    cp_model.FEASIBLE: "feasible",
    cp_model.INFEASIBLE: "infeasible",
    cp_model.UNKNOWN: "timeout",
}


def describe_scaling(options: dict[str, Any]) -> dict[str, Any]:
    res = options.get("resolution_s")
    return {"time_resolution": "auto" if res is None else float(res)}


def coefficient_scale(alpha: float, beta: float) -> int:
    """Smallest integer ``c`` with ``c alpha`` and ``c beta`` integral (VPP makes them fractional)."""
    fa = Fraction(alpha).limit_denominator(1024)
    fb = Fraction(beta).limit_denominator(1024)
    if abs(float(fa) - alpha) > 1e-12 * max(1.0, alpha) or abs(float(fb) - beta) > 1e-12 * max(1.0, beta):
        raise SolverError(f"cpsat needs rational pipeline coefficients, got {alpha}, {beta}")
    return math.lcm(fa.denominator, fb.denominator)


def tolerance_s(model: DepthModel, resolution_s: float) -> float:
    """Worst-case amount by which the scaled objective can under-rate a plan (see module doc)."""
    return resolution_s * (model.alpha * 3 * model.P + model.beta * 3 + 1)


def auto_resolution(model: DepthModel) -> float:
    """Power-of-ten time unit with ``tolerance_s <= TARGET_RELATIVE_TOLERANCE x`` the model's bound."""
    per_unit = tolerance_s(model, 1.0)
    ref = model.bound if math.isfinite(model.bound) and model.bound > 0 else model.sub.root_bound
    if not math.isfinite(ref) or ref <= 0:
        ref = 1e-3
    return 10.0 ** math.floor(math.log10(TARGET_RELATIVE_TOLERANCE * ref / per_unit))


def tolerance(model: DepthModel, result: SubResult) -> float:
    return float(result.stats.get("tolerance_s", 0.0))


def _down(x: float, unit: float) -> int:
    return math.floor(x / unit)


@dataclass
class _Arcs:
    """The arcs' booleans and what the rows read of them (per arc: option, size, device type, link class;
    per slot: its arcs), plus the indicators the layout rules create."""

    x: list[Any]
    opt: list[int]
    size: list[int]
    tix: list[int]
    cls: list[int]
    by_slot: list[list[int]]
    class_lit: dict[tuple[int, int], Any] = field(default_factory=dict)  # (slot, link class) -> 0/literal
    type_arcs: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (slot, device type) -> arcs


def solve_model(
    model: DepthModel,
    *,
    time_limit: float | None = None,
    hint: list[int] | None = None,
    threads: int | None = None,
    relative_gap: float | None = None,
    resolution_s: float | None = None,
    symmetry: bool = True,
    fix_hint: bool = False,
    log_search: bool = False,
    **_: Any,
) -> SubResult:
    """Build, solve and decode one depth model, in the sections both backends share: structure, layout
    rules, times (with the cuts and the objective), hint, configure, decode."""
    t0 = time.perf_counter()
    dm = model
    res = float(resolution_s) if resolution_s else auto_resolution(dm)
    m = cp_model.CpModel()
    opt = dm.opt.tolist()
    arcs = _Arcs(
        x=[m.new_bool_var(f"x{a}") for a in range(len(dm.slot))],
        opt=opt,
        size=[int(dm.sub.size[i]) for i in opt],
        tix=[int(dm.sub.tix[i]) for i in opt],
        cls=[int(dm.sub.cls[i]) for i in opt],
        by_slot=[idx.tolist() for idx in dm.by_slot],
    )
    _structure(m, dm, arcs)
    _layout_rules(m, dm, arcs)
    times = _times(m, dm, arcs, res, symmetry)
    if hint is not None:
        _hint(m, dm, arcs, times, hint)
    solver = _configure(time_limit, threads, relative_gap, log_search, fix_hint and hint is not None)
    t_build = time.perf_counter() - t0
    status = solver.solve(m)
    return _decode(m, solver, status, dm, arcs, times, res, t0, t_build)


# ------------------------------------------------------------------------------------------ structure
def _structure(m: cp_model.CpModel, dm: DepthModel, arcs: _Arcs) -> None:
    """One arc per slot; the layers (by count, or flow between consecutive slots' ranges); the inventory
    per device type; one group key per plan."""
    sub, x, by_slot = dm.sub, arcs.x, arcs.by_slot
    A = len(x)
    for k in range(1, dm.P + 1):
        m.add_exactly_one([x[a] for a in by_slot[k - 1]]).with_name(f"one_arc_k{k}")
    if sub.counts:
        m.add(sum(int(dm.n[a]) * x[a] for a in range(A)) == sub.N).with_name("layers")
    else:
        start, end = dm.start.tolist(), dm.end.tolist()
        for k in range(1, dm.P):
            ends: dict[int, list[int]] = {}
            starts: dict[int, list[int]] = {}
            for a in by_slot[k]:  # slot k+1
                ends.setdefault(end[a], []).append(a)
            for a in by_slot[k - 1]:
                starts.setdefault(start[a], []).append(a)
            for p in sorted(set(ends) | set(starts)):
                m.add(sum(x[a] for a in ends.get(p, [])) == sum(x[a] for a in starts.get(p, []))).with_name(
                    f"flow_k{k}_l{p}"
                )
    for j, t in enumerate(sub.types):
        terms = [arcs.size[a] * x[a] for a in range(A) if arcs.tix[a] == j]
        if terms and sum(arcs.size[a] for a in range(A) if arcs.tix[a] == j) > sub.inv[j]:
            m.add(sum(terms) <= sub.inv[j]).with_name(f"inventory_{t}")
    gids = sorted({int(sub.gid[i]) for i in arcs.opt})
    if len(gids) > 1:
        group = {g: m.new_bool_var(f"group_{g}") for g in gids}
        m.add_exactly_one(list(group.values())).with_name("one_group")
        for a in range(A):
            m.add_implication(x[a], group[int(sub.gid[arcs.opt[a]])])


def _indicator(m: cp_model.CpModel, arcs: _Arcs, members: list[int], name: str) -> Any:
    """0, the one arc's literal, or a new boolean equal to the sum of ``members`` (at most one is on)."""
    if not members:
        return 0
    if len(members) == 1:
        return arcs.x[members[0]]
    b = m.new_bool_var(name)
    m.add(b == sum(arcs.x[a] for a in members)).with_name(name)
    return b


# ------------------------------------------------------------------------------------------ layout rules
def _layout_rules(m: cp_model.CpModel, dm: DepthModel, arcs: _Arcs) -> None:
    """Each slot's link class (the p2p of the slot above depends on it); hetero's contiguous device
    types, one stage size per type, and stages that do not straddle a node."""
    sub, x, by_slot, P = dm.sub, arcs.x, arcs.by_slot, dm.P
    for k in range(1, P):
        for j in range(len(sub.classes)):
            members = [a for a in by_slot[k - 1] if arcs.cls[a] == j]
            if members:
                arcs.class_lit[(k, j)] = _indicator(m, arcs, members, f"class_k{k}_c{j}")
    if sub.contiguous or sub.align_types or sub.same_size:
        for k in range(1, P + 1):
            for j in range(len(sub.types)):
                arcs.type_arcs[(k, j)] = [a for a in by_slot[k - 1] if arcs.tix[a] == j]
    of = arcs.type_arcs
    if sub.contiguous:
        for j, t in enumerate(sub.types):
            starts_ = []
            for k in range(1, P + 1):
                here = sum(x[a] for a in of[(k, j)])
                prev = sum(x[a] for a in of[(k - 1, j)]) if k > 1 else 0
                s_ = m.new_bool_var(f"type_start_k{k}_{t}")
                m.add(s_ >= here - prev).with_name(f"type_start_k{k}_{t}")
                starts_.append(s_)
            m.add(sum(starts_) <= 1).with_name(f"contiguous_{t}")
    if sub.same_size:
        for j, t in enumerate(sub.types):
            for k in range(1, P):
                here_t = sum(x[a] for a in of[(k, j)])
                for g in sorted({arcs.size[a] for a in of[(k, j)] + of[(k + 1, j)]}):
                    a_k = sum(x[a] for a in of[(k, j)] if arcs.size[a] == g)
                    a_k1 = sum(x[a] for a in of[(k + 1, j)] if arcs.size[a] == g)
                    m.add(a_k1 + here_t - a_k <= 1).with_name(f"same_size_k{k}_{t}_g{g}")
    for j in sub.align_types:
        t = sub.types[j]
        node, inv_t = sub.node[t], sub.inv[j]
        cum: list[Any] = []
        for k in range(1, P + 1):
            cum.extend(arcs.size[a] * x[a] for a in of[(k, j)])
            q = m.new_int_var(-1, inv_t // node + 1, f"node_q_k{k}_{t}")
            r = m.new_int_var(0, node - 1, f"node_r_k{k}_{t}")
            m.add(inv_t - sum(cum) == node * q + r).with_name(f"offset_k{k}_{t}")
            here = [min(arcs.size[a], node) * x[a] for a in of[(k, j)]]
            if here:
                m.add(r + sum(here) <= node).with_name(f"align_k{k}_{t}")


# ------------------------------------------------------------------------------------------ times
@dataclass
class _Times:
    """Scaled coefficients (time units of ``resolution_s``, rounded down) and the time variables."""

    stage: list[int]  # per arc: fwd + bwd (with edges)
    sync: list[int]  # per arc
    p2p: list[list[int]]  # per option and link class
    tau: list[Any]
    tau_max: Any
    sigma: Any
    p: dict[int, Any]  # slot (>= 2) -> its p2p towards the slot after it
    scale: int  # common denominator of the pipeline coefficients
    symmetry_cuts: int = 0


def _times(m: cp_model.CpModel, dm: DepthModel, arcs: _Arcs, res: float, symmetry: bool) -> _Times:
    """Stage times with the boundary's p2p, ``tau_max`` and ``sigma``; the lower-bound cuts, symmetry and
    cross-type rows; the objective and the cutoff."""
    sub, x, by_slot, opt, P = dm.sub, arcs.x, arcs.by_slot, arcs.opt, dm.P
    c = coefficient_scale(dm.alpha, dm.beta)
    ca, cb = round(c * dm.alpha), round(c * dm.beta)
    TM = [_down(v, res) for v in dm.time.tolist()]
    SY = [_down(v, res) for v in dm.sync.tolist()]
    PP = [[_down(v, res) for v in row] for row in sub.p2p.tolist()]
    pmax = max((max(row) for row in PP), default=0)
    tau_ub = max(TM, default=0) + 2 * pmax
    tau = [m.new_int_var(0, tau_ub, f"tau_k{k}") for k in range(1, P + 1)]
    tmax = m.new_int_var(0, tau_ub, "tau_max")
    sigma = m.new_int_var(0, max(SY, default=0), "sigma_max")
    p: dict[int, Any] = {}
    for k in range(2, P + 1):
        p[k] = m.new_int_var(0, pmax, f"p2p_k{k}")
        for j in range(len(sub.classes)):
            lit = arcs.class_lit.get((k - 1, j))
            if lit is None:
                continue
            terms = [PP[opt[a]][j] * x[a] for a in by_slot[k - 1] if PP[opt[a]][j]]
            if not terms:
                continue
            row = m.add(p[k] >= sum(terms)).with_name(f"p2p_k{k}_to_c{j}")
            if not isinstance(lit, int):
                row.only_enforce_if(lit)
    for k in range(1, P + 1):
        idx = by_slot[k - 1]
        m.add(tau[k - 1] == sum(TM[a] * x[a] for a in idx) + (2 * p[k] if k >= 2 else 0)).with_name(f"time_k{k}")
        m.add(tmax >= tau[k - 1]).with_name(f"tau_max_k{k}")
        m.add(sigma >= sum(SY[a] * x[a] for a in idx)).with_name(f"sync_k{k}")
    # lower-bound cuts, lowered by the rounding (each scaled stage time is >= true / res - 3)
    m.add(tmax >= max(0, _down(dm.tau_lo, res) - 3)).with_name("cover_tau_max")
    m.add(sum(tau) >= max(0, _down(dm.sum_lo, res) - 3 * P)).with_name("sum_tau_lower")
    m.add(sigma >= max(0, _down(dm.sigma_lo, res) - 1)).with_name("sigma_lower")
    out = _Times(TM, SY, PP, tau, tmax, sigma, p, c)
    if symmetry:
        out.symmetry_cuts = _symmetry(m, dm, arcs)
    for a, j in dm.forbidden:
        lit = arcs.class_lit.get((int(dm.slot[a]) - 1, j))
        if lit is not None and not isinstance(lit, int):
            m.add_bool_or([x[a].Not(), lit.Not()]).with_name(f"cross_type_a{a}_c{j}")
    for name, plus, minus, rhs in dm.rule_rows():  # the runtime's rules between stages
        m.add(sum(x[a] for a in plus) - sum(x[a] for a in minus) <= rhs).with_name(name)
    obj = ca * sum(tau) + cb * tmax + c * sigma
    m.minimize(obj)
    if math.isfinite(dm.cutoff):
        m.add(obj <= math.floor(c * dm.cutoff / res * (1 + 1e-12))).with_name("cutoff")
    return out


def _symmetry(m: cp_model.CpModel, dm: DepthModel, arcs: _Arcs) -> int:
    """``n[k+1] <= n[k]`` for adjacent middle slots running one option (see the depth model's doc)."""
    count = 0
    for k, i in dm.symmetry:
        j = int(dm.sub.cls[i])
        lit_prev = arcs.class_lit.get((k - 1, j))
        if lit_prev is None or isinstance(lit_prev, int):
            continue
        here = [a for a in arcs.by_slot[k - 1] if arcs.opt[a] == i]
        above = [a for a in arcs.by_slot[k] if arcs.opt[a] == i]
        z = _indicator(m, arcs, here, f"z_k{k}_o{i}")
        x = arcs.x
        row = m.add(sum(int(dm.n[a]) * x[a] for a in above) <= sum(int(dm.n[a]) * x[a] for a in here))
        row.with_name(f"sym_k{k}_o{i}").only_enforce_if([z, lit_prev] if not isinstance(z, int) else lit_prev)
        count += 1
    return count


# ------------------------------------------------------------------------------------------ hint
def _hint(m: cp_model.CpModel, dm: DepthModel, arcs: _Arcs, times: _Times, hint: list[int]) -> None:
    """The warm start: the hinted arcs on, and the time variables at the values they imply."""
    x, opt, cls, P = arcs.x, arcs.opt, arcs.cls, dm.P
    TM, PP = times.stage, times.p2p
    on = set(hint)
    for a in range(len(x)):
        m.add_hint(x[a], a in on)
    vals = dm.values(hint)
    for k in range(1, P + 1):
        a = hint[P - k]
        pk = PP[opt[a]][cls[hint[P - k + 1]]] if k >= 2 else 0
        if k >= 2:
            m.add_hint(times.p[k], pk)
        m.add_hint(times.tau[k - 1], TM[a] + 2 * pk)
    m.add_hint(
        times.tau_max,
        max(
            TM[hint[P - k]] + (2 * PP[opt[hint[P - k]]][cls[hint[P - k + 1]]] if k >= 2 else 0) for k in range(1, P + 1)
        ),
    )
    m.add_hint(times.sigma, max(times.sync[a] for a in hint))
    log.debug("cpsat hint objective %.9g s", vals["objective"])


# ------------------------------------------------------------------------------------------ configure
def _configure(
    time_limit: float | None, threads: int | None, relative_gap: float | None, log_search: bool, fix_hint: bool
) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    prm = solver.parameters
    if time_limit is not None:
        prm.max_time_in_seconds = max(0.01, float(time_limit))
    prm.num_workers = int(threads) if threads else min(16, os.cpu_count() or 1)
    prm.random_seed = 0
    if relative_gap:
        prm.relative_gap_limit = float(relative_gap)
    prm.log_search_progress = bool(log_search)
    if fix_hint:  # tests: the hinted plan must be a solution of the model
        prm.fix_variables_to_their_hinted_value = True
    return solver


# ------------------------------------------------------------------------------------------ decode
def _decode(
    m: cp_model.CpModel,
    solver: cp_model.CpSolver,
    status: Any,
    dm: DepthModel,
    arcs: _Arcs,
    times: _Times,
    res: float,
    t0: float,
    t_build: float,
) -> SubResult:
    """Status, the chosen arcs as stages, and the proven bound back in seconds."""
    st = _STATUS.get(status)
    if st is None:
        raise SolverError(f"CP-SAT rejected the model ({solver.status_name(status)}): {m.validate()}")
    c = times.scale
    stats: dict[str, Any] = {
        "variables": len(m.proto.variables),
        "constraints": len(m.proto.constraints),
        "arcs": len(arcs.x),
        "symmetry_cuts": times.symmetry_cuts,
        "build_s": t_build,
        "tolerance_s": tolerance_s(dm, res),
        "resolution_s": res,
        "coefficient_scale": c,
        "cpsat_status": solver.status_name(status),
    }
    assignment = None
    bound = 0.0
    if st in ("optimal", "feasible"):
        chosen = [a for a in range(len(arcs.x)) if solver.boolean_value(arcs.x[a])]
        assignment = dm.assignment(chosen)
        stats["model_objective_s"] = solver.objective_value * res / c
    if st in ("optimal", "feasible", "timeout"):
        bound = math.ceil(solver.best_objective_bound - 1e-9) * res / c
    return SubResult(st, assignment, max(bound, 0.0), time.perf_counter() - t0, stats)  # type: ignore[arg-type]


__all__ = [
    "NAME",
    "TARGET_RELATIVE_TOLERANCE",
    "auto_resolution",
    "coefficient_scale",
    "describe_scaling",
    "solve_model",
    "tolerance",
    "tolerance_s",
]
