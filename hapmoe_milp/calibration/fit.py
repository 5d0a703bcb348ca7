"""Fit a device's runtime terms to measured runs: bounded, robust, regularised least squares.

Residuals are log(predicted / measured) step times, so a run twice too slow and one twice too fast
weigh the same and big and small runs count alike. Three choices keep the fit physical:

- **bounds**: every parameter stays in its physical range (:data:`hapmoe_milp.specs.runtime.PARAMS`);
  positive parameters are fitted in log space, fractions linearly, and a step that leaves the box is
  projected back onto it;
- **robust loss**: soft-L1 on the residuals (quadratic below ``f_scale``, linear above), so one odd run
  (another software release, a different recipe) cannot drag every parameter;
- **prior**: each parameter is pulled weakly toward the table it starts from (the datasheet/profiled
  value), so parameters the runs say nothing about stay where the micro-benchmarks put them rather than
  wandering inside their bounds; four runs can calibrate a table without pretending to determine fourteen
  numbers.

The solver is a Levenberg-Marquardt on iteratively reweighted residuals with a forward-difference
Jacobian (a handful of parameters, tens of runs: numpy is enough, no SciPy dependency).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from hapmoe_milp.calibration.fidelity import PreparedRun, predict
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.runtime import PARAM_INFO, ParamInfo

#: Parameters fitted when the caller does not choose: the terms end-to-end runs can see.
DEFAULT_FIT = (
    "launch_us",
    "sync_us",
    "gemm_scale",
    "fp8_gemm_scale",
    "grouped_rows_half",
    "attention_scale",
    "memory_efficiency",
    "a2a_intra_GBps",
    "a2a_inter_GBps",
    "flex_intra_GBps",
    "flex_inter_GBps",
    "ep_overlap",
    "p2p_exposed",
    "dp_overlap",
)
F_SCALE = 0.05  # residual (log-ratio) where the soft-L1 loss turns linear: ~5% error
#: Prior width in the fitted coordinate (log space for positive terms, so 0.2 is about +-20%) by where the
#: starting value came from: a number read off a micro-benchmark is trusted more than an assumption.
PRIOR_SIGMA = {"source": 0.2, "measured": 0.2, "derived": 0.5, "calibrated": 0.5, "assumed": 1.0}
PRIOR_WEIGHT = 1.0  # prior strength, in units of one run off by F_SCALE


@dataclass(frozen=True)
class FittedParam:
    name: str
    unit: str
    start: float
    value: float
    lo: float
    hi: float

    @property
    def at_bound(self) -> str:
        """ "lower"/"upper" when the fit ended on a bound (the runs push past the physical range)."""
        span = _coord(self.hi, self.lo, self.hi) - _coord(self.lo, self.lo, self.hi)
        if _coord(self.value, self.lo, self.hi) - _coord(self.lo, self.lo, self.hi) < 1e-3 * span:
            return "lower"
        if _coord(self.hi, self.lo, self.hi) - _coord(self.value, self.lo, self.hi) < 1e-3 * span:
            return "upper"
        return ""

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "unit": self.unit,
            "start": self.start,
            "value": self.value,
            "bounds": [self.lo, self.hi],
            "at_bound": self.at_bound or None,
        }


@dataclass(frozen=True)
class FitResult:
    device: DeviceSpec  # the input table with the fitted runtime terms
    params: tuple[FittedParam, ...]
    errors: tuple[float, ...]  # per run, relative step-time error after the fit
    iterations: int
    converged: bool


def _log_space(lo: float) -> bool:
    return lo > 0


def _coord(v: float, lo: float, hi: float) -> float:
    return math.log(v) if _log_space(lo) else v


def _value(c: float, lo: float, hi: float) -> float:
    v = math.exp(c) if _log_space(lo) else float(c)
    return float(min(hi, max(lo, v)))


def _device_with(dev: DeviceSpec, names: Sequence[str], values: Sequence[float]) -> DeviceSpec:
    return replace(dev, runtime=dev.runtime.with_values(dict(zip(names, values, strict=True))))


def fit_device(
    runs: Sequence[PreparedRun],
    device: DeviceSpec,
    names: Sequence[str] = DEFAULT_FIT,
    *,
    max_iter: int = 60,
    f_scale: float = F_SCALE,
    prior_weight: float = PRIOR_WEIGHT,
    progress: Callable[[int, float], None] | None = None,
) -> FitResult:
    """Fit ``names`` of ``device.runtime`` so the runs' predicted step times match the measured ones."""
    if not runs:
        raise HapmoeError(f"no measured runs use device {device.id!r}; nothing to calibrate")
    unknown = [n for n in names if n not in PARAM_INFO]
    if unknown:
        raise HapmoeError(f"unknown runtime parameter {unknown[0]!r}; known: {', '.join(PARAM_INFO)}")
    infos: list[ParamInfo] = [PARAM_INFO[n] for n in names]
    start = [float(getattr(device.runtime, n)) for n in names]
    lo = np.array([_coord(p.lo, p.lo, p.hi) for p in infos])
    hi = np.array([_coord(p.hi, p.lo, p.hi) for p in infos])
    x0 = np.array([_coord(v, p.lo, p.hi) for v, p in zip(start, infos, strict=True)])
    # the prior's width by the value's basis; linear (fraction) terms in units of their range
    sigma = np.array(
        [PRIOR_SIGMA[device.runtime_basis(p.name)] * (1.0 if _log_space(p.lo) else p.hi - p.lo) for p in infos]
    )
    measured = np.array([r.measured_s for r in runs])

    def residuals(x: np.ndarray) -> np.ndarray:
        dev = _device_with(device, names, [_value(c, p.lo, p.hi) for c, p in zip(x, infos, strict=True)])
        pred = np.array([predict(r, {device.id: dev}).predicted_s for r in runs])
        return np.log(pred / measured)

    def total(r: np.ndarray, x: np.ndarray) -> float:
        loss = 2.0 * (np.sqrt(1.0 + (r / f_scale) ** 2) - 1.0)
        prior = prior_weight * ((x - x0) / sigma) ** 2
        return float(loss.sum() + prior.sum())

    x = x0.copy()
    r = residuals(x)
    cost = total(r, x)
    lam = 1e-2
    it = 0
    converged = False
    for it in range(1, max_iter + 1):
        # Jacobian by forward differences, stepping inward at an upper bound
        J = np.empty((len(r), len(x)))
        for j in range(len(x)):
            h = 1e-4 * max(1.0, abs(x[j])) if _log_space(infos[j].lo) else 1e-4 * (hi[j] - lo[j])
            if x[j] + h > hi[j]:
                h = -h
            xj = x.copy()
            xj[j] += h
            J[:, j] = (residuals(xj) - r) / h
        # IRLS weights of the soft-L1 loss, plus the prior as extra residuals
        w = 1.0 / np.sqrt(1.0 + (r / f_scale) ** 2)
        pw = prior_weight * f_scale**2 / sigma**2  # matches total(): loss ~ (r/f)^2 near zero
        A = (J.T * w) @ J + np.diag(pw)
        g = (J.T * w) @ r + pw * (x - x0)
        improved = False
        while lam < 1e8:
            step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), -g)
            xn = np.clip(x + step, lo, hi)
            rn = residuals(xn)
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
        if not improved or rel < 1e-7:
            converged = True
            break
    values = [_value(c, p.lo, p.hi) for c, p in zip(x, infos, strict=True)]
    fitted = tuple(FittedParam(p.name, p.unit, s, v, p.lo, p.hi) for p, s, v in zip(infos, start, values, strict=True))
    return FitResult(
        device=_device_with(device, names, values),
        params=fitted,
        errors=tuple(float(math.expm1(v)) for v in r),
        iterations=it,
        converged=converged,
    )


def leave_one_out(
    runs: Sequence[PreparedRun], device: DeviceSpec, names: Sequence[str] = DEFAULT_FIT, **kw: object
) -> list[float]:
    """Each run's error when the table is fitted to the other runs only (its own error if it is alone)."""
    out: list[float] = []
    for i, held in enumerate(runs):
        rest = [r for j, r in enumerate(runs) if j != i]
        dev = fit_device(rest, device, names, **kw).device if rest else device  # type: ignore[arg-type]
        out.append(predict(held, {device.id: dev}).error)
    return out
