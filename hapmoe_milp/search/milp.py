"""PuLP MILP translation of one depth model (:mod:`hapmoe_milp.search.depth_model`; the formulation is
:mod:`hapmoe_milp.search.formulation`), in the sections the CP-SAT backend shares: structure, layout
rules, times, hint, configure, decode (:mod:`hapmoe_milp.search.backends`).

The same arcs and rows as the CP-SAT model, with the two conditional rows written linearly:

- the p2p of slot ``k`` towards slot ``k-1``'s link class ``j``: ``p[k] >= sum_a p2p[a, j] x[a] -
  max_a p2p[a, j] (1 - class[k-1, j])`` (the big-M is the largest p2p of that slot, so it is tight);
- the symmetry cut ``n[k+1] <= n[k]`` when slot ``k`` and ``k+1`` run option ``o`` and slot ``k-1`` has
  ``o``'s class: ``sum n x[k+1, o] - sum n x[k, o] <= N (2 - z[k, o] - class[k-1, cls(o)])``.

Units: a power-of-ten time unit that puts the model's lower bound between 1e3 and 1e4 (solver
tolerances are absolute, so the unit follows the problem's scale). Nothing is rounded; the reported
objective is still a fresh ``cost.estimate`` of the decoded plan, and "optimal" means within the
relative MIP gap (1e-7 unless ``relative_gap`` is given). Every row has a unique readable name
(``time_k3``, ``p2p_k2_to_h800_node``, ``inventory_h800``, ...) so ``violated_rows`` can name what a
candidate assignment breaks.

Backends: ``highs`` (default; ``pulp.HiGHS`` over highspy, with the warm start passed through
``Highs.setSolution`` and the proven bound read from ``mip_dual_bound``) or ``cbc`` (``PULP_CBC_CMD``,
warm start through its ``warmStart`` file; CBC's bound is not read back, so a CBC run that stops on
time reports the model's own lower bound).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import pulp

from hapmoe_milp.errors import SolverError
from hapmoe_milp.fileio import stdout_to_stderr
from hapmoe_milp.search.depth_model import DepthModel
from hapmoe_milp.search.formulation import SubResult

log = logging.getLogger(__name__)

NAME = "milp"
DEFAULT_GAP = 1e-7


def time_unit(model: DepthModel) -> float:
    """Power-of-ten time unit putting the model's lower bound between 1e3 and 1e4 model units."""
    ref = model.bound if math.isfinite(model.bound) and model.bound > 0 else model.sub.root_bound
    if not math.isfinite(ref) or ref <= 0:
        ref = 1.0
    return 10.0 ** math.floor(math.log10(ref)) / 1e3


def describe_scaling(options: dict[str, Any]) -> dict[str, Any]:
    return {"time_unit": "auto (model bound / 1e3..1e4)", "real_valued": True}


def tolerance(model: DepthModel, result: SubResult) -> float:
    gap = float(result.stats.get("relative_gap", DEFAULT_GAP))
    obj = float(result.stats.get("model_objective_s", 0.0))
    return gap * obj


class _HiGHSWarm(pulp.HiGHS):  # type: ignore[misc,name-defined]
    """pulp.HiGHS that hands variables' initial values to HiGHS as a starting solution (``setSolution``;
    pulp 3.3's HiGHS class has no warm start) and resets HiGHS's global thread pool after the run."""

    def __init__(self, *args: Any, warm: bool = False, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.warm = warm

    def createAndConfigureSolver(self, lp: pulp.LpProblem) -> None:
        # HiGHS prints its banner on stdout when the first Highs object is made, before the output flag
        # can be set; stdout carries only the CLI's answer (e.g. ``--json``), so send it to stderr
        with stdout_to_stderr():
            super().createAndConfigureSolver(lp)

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


def _lin(pairs: list[tuple[Any, float]]) -> pulp.LpAffineExpression:
    """A linear expression from (variable, coefficient) pairs, repeated variables summed."""
    acc: dict[int, list[Any]] = {}
    for v, c in pairs:
        slot = acc.setdefault(id(v), [v, 0.0])
        slot[1] += c
    return pulp.LpAffineExpression([(v, c) for v, c in acc.values() if c])


def _class_name(model: DepthModel, j: int) -> str:
    dev, small = model.sub.classes[j]
    return f"{dev}_{'small' if small else 'node'}"


@dataclass
class _Arcs:
    """The arcs' binaries and what the rows read of them (per arc: option, size, device type, link class;
    per slot: its arcs; per (slot, type) and (slot, link class): their arcs)."""

    x: list[Any]
    opt: list[int]
    size: list[int]
    tix: list[int]
    cls: list[int]
    by_slot: list[list[int]]
    type_arcs: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    class_arcs: dict[tuple[int, int], list[int]] = field(default_factory=dict)


def build(model: DepthModel) -> tuple[pulp.LpProblem, dict[str, Any], float]:
    """The PuLP problem of a depth model, its variables by role, and the time unit: the structure, layout
    rules and times sections (the same rows as the CP-SAT model, in the same order)."""
    dm = model
    tu = time_unit(dm)
    opt = dm.opt.tolist()
    prob = pulp.LpProblem("hapmoe_depth_model", pulp.LpMinimize)
    arcs = _Arcs(
        x=[_var(prob, f"x_k{int(dm.slot[a])}_a{a}", 0, 1, pulp.LpBinary) for a in range(len(dm.slot))],
        opt=opt,
        size=[int(dm.sub.size[i]) for i in opt],
        tix=[int(dm.sub.tix[i]) for i in opt],
        cls=[int(dm.sub.cls[i]) for i in opt],
        by_slot=[idx.tolist() for idx in dm.by_slot],
    )
    _structure(prob, dm, arcs)
    _layout_rules(prob, dm, arcs)
    roles = _times(prob, dm, arcs, tu)
    return prob, roles, tu


# ------------------------------------------------------------------------------------------ structure
def _structure(prob: pulp.LpProblem, dm: DepthModel, arcs: _Arcs) -> None:
    """One arc per slot; the layers (by count, or flow between consecutive slots' ranges); the inventory
    per device type; one group key per plan."""
    sub, x, by_slot = dm.sub, arcs.x, arcs.by_slot
    for k in range(1, dm.P + 1):
        prob += _lin([(x[a], 1.0) for a in by_slot[k - 1]]) == 1, f"one_arc_k{k}"
    if sub.counts:
        prob += _lin([(x[a], float(dm.n[a])) for a in range(len(x))]) == sub.N, "layers"
    else:
        start, end = dm.start.tolist(), dm.end.tolist()
        for k in range(1, dm.P):
            terms: dict[int, list[tuple[Any, float]]] = {}
            for a in by_slot[k]:
                terms.setdefault(end[a], []).append((x[a], 1.0))
            for a in by_slot[k - 1]:
                terms.setdefault(start[a], []).append((x[a], -1.0))
            for pos in sorted(terms):
                prob += _lin(terms[pos]) == 0, f"flow_k{k}_l{pos}"
    for j, t in enumerate(sub.types):
        members = [a for a in range(len(x)) if arcs.tix[a] == j]
        if members and sum(arcs.size[a] for a in members) > sub.inv[j]:
            prob += _lin([(x[a], float(arcs.size[a])) for a in members]) <= sub.inv[j], f"inventory_{t}"
    gids = sorted({int(sub.gid[i]) for i in arcs.opt})
    if len(gids) > 1:
        group = {g: _var(prob, f"group_{g}", 0, 1, pulp.LpBinary) for g in gids}
        prob += _lin([(v, 1.0) for v in group.values()]) == 1, "one_group"
        for k in range(1, dm.P + 1):
            for g in gids:
                members = [a for a in by_slot[k - 1] if int(sub.gid[arcs.opt[a]]) == g]
                if members:
                    prob += _lin([(x[a], 1.0) for a in members] + [(group[g], -1.0)]) <= 0, f"group_k{k}_g{g}"


# ------------------------------------------------------------------------------------------ layout rules
def _layout_rules(prob: pulp.LpProblem, dm: DepthModel, arcs: _Arcs) -> None:
    """Hetero's contiguous device types, one stage size per type, and stages that do not straddle a node;
    and each slot's link-class members (the p2p of the slot above depends on them)."""
    sub, x, by_slot, P = dm.sub, arcs.x, arcs.by_slot, dm.P
    of = arcs.type_arcs
    of.update(
        {
            (k, j): [a for a in by_slot[k - 1] if arcs.tix[a] == j]
            for k in range(1, P + 1)
            for j in range(len(sub.types))
        }
    )
    if sub.contiguous:
        for j, t in enumerate(sub.types):
            starts = []
            for k in range(1, P + 1):
                s_ = _var(prob, f"type_start_k{k}_{t}", 0, 1)
                pairs = [(s_, 1.0)] + [(x[a], -1.0) for a in of[(k, j)]]
                if k > 1:
                    pairs += [(x[a], 1.0) for a in of[(k - 1, j)]]
                prob += _lin(pairs) >= 0, f"type_start_k{k}_{t}"
                starts.append((s_, 1.0))
            prob += _lin(starts) <= 1, f"contiguous_{t}"
    if sub.same_size:
        for j, t in enumerate(sub.types):
            for k in range(1, P):
                here_t = [(x[a], 1.0) for a in of[(k, j)]]
                for g in sorted({arcs.size[a] for a in of[(k, j)] + of[(k + 1, j)]}):
                    a_k = [(x[a], -1.0) for a in of[(k, j)] if arcs.size[a] == g]
                    a_k1 = [(x[a], 1.0) for a in of[(k + 1, j)] if arcs.size[a] == g]
                    prob += _lin(a_k1 + here_t + a_k) <= 1, f"same_size_k{k}_{t}_g{g}"
    for j in sub.align_types:
        t = sub.types[j]
        node, inv_t = sub.node[t], sub.inv[j]
        cum: list[tuple[Any, float]] = []
        for k in range(1, P + 1):
            cum.extend((x[a], float(arcs.size[a])) for a in of[(k, j)])
            q = _var(prob, f"node_q_k{k}_{t}", -1, inv_t // node + 1, pulp.LpInteger)
            r = _var(prob, f"node_r_k{k}_{t}", 0, node - 1)
            prob += _lin([*cum, (q, float(node)), (r, 1.0)]) == inv_t, f"offset_k{k}_{t}"
            if of[(k, j)]:
                pairs = [(r, 1.0)] + [(x[a], float(min(arcs.size[a], node))) for a in of[(k, j)]]
                prob += _lin(pairs) <= node, f"align_k{k}_{t}"
    arcs.class_arcs.update(
        {(k, j): [a for a in by_slot[k - 1] if arcs.cls[a] == j] for k in range(1, P) for j in range(len(sub.classes))}
    )


# ------------------------------------------------------------------------------------------ times
def _times(prob: pulp.LpProblem, dm: DepthModel, arcs: _Arcs, tu: float) -> dict[str, Any]:
    """Stage times with the boundary's p2p (big-M on the next slot's link class), ``tau_max`` and
    ``sigma``; the lower-bound cuts, symmetry and cross-type rows; the objective and the cutoff."""
    sub, x, by_slot, opt, P = dm.sub, arcs.x, arcs.by_slot, arcs.opt, dm.P
    TM = (dm.time / tu).tolist()
    SY = (dm.sync / tu).tolist()
    PP = (sub.p2p / tu).tolist()
    tau = [_var(prob, f"tau_k{k}", 0) for k in range(1, P + 1)]
    tmax = _var(prob, "tau_max", 0)
    sigma = _var(prob, "sigma_max", 0)
    p: dict[int, Any] = {}
    for k in range(2, P + 1):
        p[k] = _var(prob, f"p2p_k{k}", 0)
        for j in range(len(sub.classes)):
            below = arcs.class_arcs[(k - 1, j)]
            if not below:
                continue
            big = max((PP[opt[a]][j] for a in by_slot[k - 1]), default=0.0)
            if big <= 0:
                continue
            pairs = [(p[k], 1.0)] + [(x[a], -PP[opt[a]][j]) for a in by_slot[k - 1]]
            pairs += [(x[a], -big) for a in below]
            prob += _lin(pairs) >= -big, f"p2p_k{k}_to_{_class_name(dm, j)}"
    for k in range(1, P + 1):
        idx = by_slot[k - 1]
        pairs = [(tau[k - 1], 1.0)] + [(x[a], -TM[a]) for a in idx]
        if k >= 2:
            pairs.append((p[k], -2.0))
        prob += _lin(pairs) >= 0, f"time_k{k}"
        prob += _lin([(tmax, 1.0), (tau[k - 1], -1.0)]) >= 0, f"tau_max_k{k}"
        prob += _lin([(sigma, 1.0)] + [(x[a], -SY[a]) for a in idx]) >= 0, f"sync_k{k}"
    prob += _lin([(tmax, 1.0)]) >= dm.tau_lo / tu * (1 - 1e-12), "cover_tau_max"
    prob += _lin([(v, 1.0) for v in tau]) >= dm.sum_lo / tu * (1 - 1e-12), "sum_tau_lower"
    prob += _lin([(sigma, 1.0)]) >= dm.sigma_lo / tu * (1 - 1e-12), "sigma_lower"
    for k, i in dm.symmetry:
        prev = arcs.class_arcs.get((k - 1, int(sub.cls[i])), [])
        if not prev:
            continue
        here = [a for a in by_slot[k - 1] if opt[a] == i]
        above = [a for a in by_slot[k] if opt[a] == i]
        pairs = [(x[a], float(dm.n[a])) for a in above] + [(x[a], -float(dm.n[a])) for a in here]
        pairs += [(x[a], float(sub.N)) for a in here] + [(x[a], float(sub.N)) for a in prev]
        prob += _lin(pairs) <= 2 * sub.N, f"sym_k{k}_o{i}"
    for a, j in dm.forbidden:
        prev = arcs.class_arcs.get((int(dm.slot[a]) - 1, j), [])
        if prev:
            prob += _lin([(x[a], 1.0)] + [(x[b], 1.0) for b in prev]) <= 1, f"cross_type_a{a}_{_class_name(dm, j)}"
    for name, plus, minus, rhs in dm.rule_rows():  # the runtime's rules between stages
        prob += _lin([(x[a], 1.0) for a in plus] + [(x[a], -1.0) for a in minus]) <= rhs, name
    obj = _lin([(v, dm.alpha) for v in tau] + [(tmax, dm.beta), (sigma, 1.0)])
    prob += obj
    if math.isfinite(dm.cutoff):
        prob += obj <= dm.cutoff / tu * (1 + 1e-9), "cutoff"
    return {"x": x, "tau": tau, "tau_max": tmax, "sigma": sigma, "p": p}


# ------------------------------------------------------------------------------------------ hint
def _hint(dm: DepthModel, hint: list[int], roles: dict[str, Any], tu: float) -> None:
    """Initial values of the main variables on the hint (the rest HiGHS completes)."""
    on = set(hint)
    for a, v in enumerate(roles["x"]):
        v.setInitialValue(1 if a in on else 0)
    vals = dm.values(hint)
    for k in range(1, dm.P + 1):
        roles["tau"][k - 1].setInitialValue(vals["tau"][k] / tu)
        if k >= 2:
            roles["p"][k].setInitialValue(vals["p2p"][k] / tu)
    roles["tau_max"].setInitialValue(vals["tau_max"] / tu)
    roles["sigma"].setInitialValue(vals["sigma"] / tu)


def solve_model(
    model: DepthModel,
    *,
    time_limit: float | None = None,
    hint: list[int] | None = None,
    threads: int | None = None,
    relative_gap: float | None = None,
    backend: str | None = None,
    check_hint: bool = False,
    msg: bool = False,
    **_: Any,
) -> SubResult:
    """Build (structure, layout rules, times), hint, configure, solve and decode one depth model."""
    t0 = time.perf_counter()
    dm = model
    prob, roles, tu = build(dm)
    hint_violations: list[str] | None = None
    if hint is not None:
        _hint(dm, hint, roles, tu)
        if check_hint:
            hint_violations = violated_rows(prob)
    gap = DEFAULT_GAP if relative_gap is None else float(relative_gap)
    solver, name = _configure(time_limit, threads, gap, backend, msg, hint is not None)
    t_build = time.perf_counter() - t0
    try:
        prob.solve(solver)
    except pulp.PulpSolverError as exc:
        raise SolverError(f"MILP backend {name} failed: {exc}") from None
    stats: dict[str, Any] = {
        "variables": len(prob.variables()),
        "constraints": len(_rows(prob)),
        "arcs": len(dm.slot),
        "build_s": t_build,
        "backend": name,
        "relative_gap": gap,
        "time_unit_s": tu,
    }
    if hint_violations is not None:
        stats["hint_violations"] = hint_violations
    return _decode(prob, name, dm, roles, tu, gap, stats, t0)


# ------------------------------------------------------------------------------------------ configure
def _configure(
    time_limit: float | None, threads: int | None, gap: float, backend: str | None, msg: bool, warm: bool
) -> tuple[Any, str]:
    """The PuLP solver object (HiGHS, or CBC where highspy is missing or asked for) and its name."""
    name = (backend or "highs").lower()
    thr = int(threads) if threads else min(16, os.cpu_count() or 1)
    if name == "highs" and not _highs_available():
        log.warning("HiGHS (highspy) is not available; falling back to CBC")
        name = "cbc"
    if name == "highs":
        # gapAbs=0: HiGHS's default absolute gap would stop tiny models early
        return _HiGHSWarm(msg=msg, timeLimit=time_limit, gapRel=gap, gapAbs=0.0, threads=thr, warm=warm), name
    if name == "cbc":
        with warnings.catch_warnings():  # PuLP 3.3 deprecates the bundled CBC; it is still the fallback here
            warnings.simplefilter("ignore", DeprecationWarning)
            cbc = pulp.PULP_CBC_CMD(msg=msg, timeLimit=time_limit, gapRel=gap, gapAbs=0.0, threads=thr, warmStart=warm)
        return cbc, name
    raise SolverError(f"unknown MILP backend {backend!r}; use highs or cbc", field="backend")


# ------------------------------------------------------------------------------------------ decode
def _decode(
    prob: pulp.LpProblem,
    name: str,
    dm: DepthModel,
    roles: dict[str, Any],
    tu: float,
    gap: float,
    stats: dict[str, Any],
    t0: float,
) -> SubResult:
    """Status, the chosen arcs as stages, and the proven bound back in seconds."""
    status, bound_units = _status(prob, name)
    if name == "highs":
        h = prob.solverModel
        stats["highs_status"] = h.modelStatusToString(h.getModelStatus())
    assignment = None
    if status in ("optimal", "feasible"):
        chosen = [a for a, v in enumerate(roles["x"]) if _val(v) > 0.5]
        assignment = dm.assignment(chosen)
        stats["model_objective_s"] = pulp.value(prob.objective) * tu
    if bound_units is not None and math.isfinite(bound_units):
        bound = bound_units * tu
    elif status == "optimal":
        bound = pulp.value(prob.objective) * tu * (1 - gap)
    else:
        bound = dm.bound  # CBC stopped on time: the model's own lower bound
    # a bound from the LP can only be trusted up to the solver's feasibility tolerance
    bound = max(0.0, bound * (1 - 1e-9))
    if status == "infeasible":
        stats["note"] = "infeasible under the cutoff" if math.isfinite(dm.cutoff) else "no plan fits"
    return SubResult(status, assignment, bound, time.perf_counter() - t0, stats)  # type: ignore[arg-type]


def _status(prob: pulp.LpProblem, backend: str) -> tuple[str, float | None]:
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
    x = v.varValue
    return 0.0 if x is None else float(x)


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


__all__ = ["DEFAULT_GAP", "NAME", "build", "describe_scaling", "solve_model", "time_unit", "tolerance", "violated_rows"]
