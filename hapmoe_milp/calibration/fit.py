"""Fit runtime terms to measured runs: only the directions the runs inform, inside measured ranges.

Residuals are log(predicted / measured) step times, so a run twice too slow and one twice too fast weigh
the same. Each run is weighted by ``1 / sqrt(runs of its model on its devices)``, so ten layouts of one
model do not outvote one layout each of three others: the fit is for models it has not seen.

The steps, each of which a user can read in the report:

1. **terms** (:mod:`hapmoe_milp.calibration.terms`): kernel terms only where a micro-benchmark measures
   them, inside that measurement's tolerance; stack terms shared by the devices of a software stack.
2. **identifiability** (:mod:`hapmoe_milp.calibration.identify`): the sensitivity of every run to every
   term, in units of the term's prior width; a pivoted Gram-Schmidt picks terms in order of the
   *independent* information the runs carry about them, stops when that falls below
   :data:`~hapmoe_milp.calibration.identify.INFORM_MIN`, and never takes more than one term per two runs.
   The rest stay at their prior.
3. **fit**: Levenberg-Marquardt on the chosen coordinates with a soft-L1 loss (one odd run cannot drag
   every term), a weak prior toward the start, box bounds from step 1, and a line search that refuses any
   step that would put a table outside a micro-benchmark row's tolerance (terms like FP8 GEMM efficiency
   depend on two coordinates at once, so boxes alone cannot guarantee it).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from hapmoe_milp.calibration.fidelity import PreparedRun, predict
from hapmoe_milp.calibration.microbench import Row, violations
from hapmoe_milp.calibration.terms import Term, apply_terms
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.specs.device import DeviceSpec

F_SCALE = 0.05  # residual (log-ratio) where the soft-L1 loss turns linear: ~5% error
PRIOR_WEIGHT = 1.0  # prior strength, in units of one run off by F_SCALE at one prior sigma


def stack_of(pr: PreparedRun) -> str:
    return pr.run.stack


@dataclass(frozen=True)
class Problem:
    """Runs to fit, the tables they start from, and the coordinates that may move."""

    runs: tuple[PreparedRun, ...]
    bases: Mapping[str, DeviceSpec]
    terms: tuple[Term, ...]
    rows: tuple[Row, ...] = ()
    weights: tuple[float, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.weights:
            n = Counter((r.model.name, r.devices) for r in self.runs)
            object.__setattr__(self, "weights", tuple(1.0 / math.sqrt(n[(r.model.name, r.devices)]) for r in self.runs))

    @property
    def measured(self) -> np.ndarray:
        return np.array([r.measured_s for r in self.runs])

    def tables(self, z: Sequence[float], stack: str, *, whole_stack: bool = False) -> dict[str, DeviceSpec]:
        return apply_terms(self.bases, self.terms, z, stack, whole_stack=whole_stack)

    def predicted(self, z: Sequence[float]) -> np.ndarray:
        cache: dict[str, dict[str, DeviceSpec]] = {}
        out = []
        for r in self.runs:
            s = stack_of(r)
            if s not in cache:
                cache[s] = self.tables(z, s)
            out.append(predict(r, cache[s]).predicted_s)
        return np.array(out)

    def residuals(self, z: Sequence[float]) -> np.ndarray:
        return np.log(self.predicted(z) / self.measured)

    def feasible(self, z: Sequence[float]) -> bool:
        """Every table a term touches still reproduces its micro-benchmark rows within tolerance."""
        if not self.rows:
            return True
        for s in {t.stack for t in self.terms}:
            tabs = self.tables(z, s)
            touched = {d for t, zi in zip(self.terms, z, strict=True) if t.stack == s and zi != 0 for d in t.devices}
            if any(violations(tabs[d], self.rows) for d in touched):
                return False
        return True


@dataclass(frozen=True)
class FittedTerm:
    key: str
    name: str
    devices: tuple[str, ...]
    start: dict[str, float]
    value: dict[str, float]
    z: float
    lo: float
    hi: float
    bounded_by: str

    @property
    def at_bound(self) -> str:
        """``lower``/``upper`` when the fit ended on a bound: the runs push past the measured range."""
        span = self.hi - self.lo
        if self.z - self.lo < 1e-3 * span:
            return "lower"
        if self.hi - self.z < 1e-3 * span:
            return "upper"
        return ""

    def to_dict(self) -> dict[str, object]:
        return {
            "term": self.key,
            "name": self.name,
            "devices": list(self.devices),
            "start": self.start,
            "value": self.value,
            "bounded_by": self.bounded_by,
            "at_bound": self.at_bound or None,
        }


@dataclass(frozen=True)
class FitResult:
    problem: Problem
    active: tuple[int, ...]  # indices into problem.terms that were fitted
    z: tuple[float, ...]  # every coordinate (0 for those kept at their prior)
    errors: tuple[float, ...]  # per run, relative step-time error after the fit
    iterations: int
    converged: bool

    def tables(self, stack: str, *, whole_stack: bool = False) -> dict[str, DeviceSpec]:
        return self.problem.tables(self.z, stack, whole_stack=whole_stack)

    @property
    def params(self) -> tuple[FittedTerm, ...]:
        out = []
        for i in self.active:
            t, zi = self.problem.terms[i], self.z[i]
            starts = {d: float(getattr(self.problem.bases[d].runtime, t.name)) for d in t.devices}
            out.append(
                FittedTerm(
                    t.key,
                    t.name,
                    t.devices,
                    starts,
                    {d: t.value(s, zi) for d, s in starts.items()},
                    zi,
                    t.lo,
                    t.hi,
                    t.bounded_by,
                )
            )
        return tuple(out)


def _soft_l1(r: np.ndarray, w: np.ndarray, f: float) -> float:
    return float((w * 2.0 * (np.sqrt(1.0 + (r / f) ** 2) - 1.0)).sum())


def fit(
    problem: Problem,
    active: Sequence[int],
    *,
    max_iter: int = 40,
    f_scale: float = F_SCALE,
    prior_weight: float = PRIOR_WEIGHT,
    progress: Callable[[int, float], None] | None = None,
) -> FitResult:
    """Fit the coordinates ``active`` (indices into ``problem.terms``); the others stay at 0 (the prior)."""
    if not problem.runs:
        raise HapmoeError("no measured runs to fit")
    active = tuple(active)
    terms = [problem.terms[i] for i in active]
    lo = np.array([t.lo for t in terms])
    hi = np.array([t.hi for t in terms])
    sigma = np.array([t.sigma for t in terms])
    w = np.array(problem.weights)
    nz = len(problem.terms)

    def full(x: np.ndarray) -> list[float]:
        z = [0.0] * nz
        for i, xi in zip(active, x, strict=True):
            z[i] = float(xi)
        return z

    def total(r: np.ndarray, x: np.ndarray) -> float:
        return _soft_l1(r, w, f_scale) + prior_weight * float(((x / sigma) ** 2).sum())

    x = np.zeros(len(active))
    r = problem.residuals(full(x))
    if not active:
        return FitResult(problem, (), tuple(full(x)), tuple(float(math.expm1(v)) for v in r), 0, True)
    cost = total(r, x)
    lam = 1e-2
    it = 0
    converged = False
    rel = 1.0
    for it in range(1, max_iter + 1):
        J = np.empty((len(r), len(x)))
        for j in range(len(x)):
            h = 1e-3 * max(sigma[j], 1e-3)
            if x[j] + h > hi[j]:
                h = -h
            xj = x.copy()
            xj[j] += h
            J[:, j] = (problem.residuals(full(xj)) - r) / h
        wi = w / np.sqrt(1.0 + (r / f_scale) ** 2)  # IRLS weights of the soft-L1 loss
        pw = prior_weight * f_scale**2 / sigma**2
        A = (J.T * wi) @ J + np.diag(pw)
        g = (J.T * wi) @ r + pw * x
        improved = False
        while lam < 1e8:
            step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), -g)
            xn = np.clip(x + step, lo, hi)
            for _ in range(8):  # stay inside every micro-benchmark row's tolerance
                if problem.feasible(full(xn)):
                    break
                xn = x + 0.5 * (xn - x)
            else:
                xn = x
            rn = problem.residuals(full(xn))
            cn = total(rn, xn)
            if cn < cost:
                improved = True
                rel = (cost - cn) / max(cost, 1e-12)
                x, r, cost = xn, rn, cn
                lam = max(lam / 3.0, 1e-7)
                break
            lam *= 4.0
        if progress is not None:
            progress(it, cost)
        if not improved or rel < 1e-6:
            converged = True
            break
    return FitResult(problem, active, tuple(full(x)), tuple(float(math.expm1(v)) for v in r), it, converged)
