"""Which terms do the runs inform? Sensitivity, rank and a pivoted choice, before any fitting.

The sensitivity matrix ``S[r, j]`` is the change of run ``r``'s log step time when term ``j`` moves by
one prior width (its micro-benchmark tolerance, or its prior sigma), weighted like the fit. Its singular
values say how many independent directions the runs can see; a pivoted Gram-Schmidt turns that into a
list of *terms* a user can read: at each step the term with the largest part of its column not already
explained by the terms chosen before it. A term is fitted only if that independent part moves the runs
by at least :data:`INFORM_MIN` (RMS over runs) per prior width, and at most one term per two runs is
fitted (with fewer, a fit can interpolate its runs and prove nothing). Everything else keeps its prior,
and the report says which rule kept it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hapmoe_milp.calibration.fit import Problem

#: Smallest independent RMS change of the runs' log step times per prior width for a term to be fitted:
#: below ~2% the runs' own spread (software versions, measurement windows) is larger than the signal.
INFORM_MIN = 0.02
#: A singular value below this fraction of the largest is a direction the runs cannot resolve.
RANK_RTOL = 0.05


def term_cap(n_runs: int) -> int:
    """At most one fitted term per two runs (one term for a single run)."""
    return max(1, n_runs // 2)


@dataclass(frozen=True)
class Identification:
    keys: tuple[str, ...]  # every candidate term, in problem order
    sensitivity: tuple[float, ...]  # per term: RMS change of log step time per prior width
    singular: tuple[float, ...]  # singular values of the sensitivity matrix (RMS-normalised)
    rank: int  # singular values above RANK_RTOL of the largest and above INFORM_MIN
    order: tuple[int, ...]  # terms chosen to fit, most informative first
    independent: tuple[float, ...]  # their independent part when chosen
    reasons: tuple[str, ...]  # per term: why it is fitted or kept
    cap: int

    def report(self) -> list[str]:
        sv = ", ".join(f"{s:.3g}" for s in self.singular[:8])
        lines = [
            f"identifiability: {len(self.keys)} candidate terms, rank {self.rank} (singular values {sv}); "
            f"fitting {len(self.order)} (at most {self.cap}: one per two runs)"
        ]
        lines += [f"  {k}: {why}" for k, why in zip(self.keys, self.reasons, strict=True)]
        return lines

    def to_dict(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "singular_values": [round(s, 5) for s in self.singular],
            "cap": self.cap,
            "fitted": [self.keys[i] for i in self.order],
            "terms": {
                k: {"sensitivity": round(s, 5), "why": why}
                for k, s, why in zip(self.keys, self.sensitivity, self.reasons, strict=True)
            },
        }


def sensitivity_matrix(problem: Problem) -> np.ndarray:
    """Weighted change of each run's log step time per prior width of each term (forward differences)."""
    nz = len(problem.terms)
    r0 = problem.residuals([0.0] * nz)
    S = np.zeros((len(r0), nz))
    sw = np.sqrt(np.array(problem.weights))
    for j, t in enumerate(problem.terms):
        h = 0.25 * t.sigma
        if h > t.hi:
            h = -min(h, -t.lo) if t.lo < 0 else 0.0
        if h == 0.0:
            continue
        z = [0.0] * nz
        z[j] = h
        S[:, j] = sw * (problem.residuals(z) - r0) / h * t.sigma
    return S


def _reach(problem: Problem, term: object) -> float:
    """Summed weight of the runs a term can move (its stack, one of its devices)."""
    return float(
        sum(
            w
            for r, w in zip(problem.runs, problem.weights, strict=True)
            if r.run.stack == term.stack and set(r.devices) & set(term.devices)  # type: ignore[attr-defined]
        )
    )


def identify(problem: Problem, *, cap: int | None = None, inform_min: float = INFORM_MIN) -> Identification:
    S = sensitivity_matrix(problem)
    n, k = S.shape
    cap = term_cap(n) if cap is None else cap
    norm = np.sqrt(max(n, 1))
    # RMS over the runs a term can touch (its stack's runs on its devices), not over every run in the set
    reach = np.array([max(1.0, _reach(problem, t)) for t in problem.terms]) if k else np.ones(0)
    sens = np.linalg.norm(S, axis=0) / np.sqrt(reach)
    sv = np.linalg.svd(S / norm, compute_uv=False) if k and n else np.zeros(0)
    rank = int(((sv > RANK_RTOL * (sv[0] if len(sv) else 0)) & (sv >= inform_min)).sum()) if len(sv) else 0
    reasons = [""] * k
    order: list[int] = []
    indep: list[float] = []
    R = S.copy()
    for _ in range(k):
        left = [j for j in range(k) if j not in order]
        if not left:
            break
        norms = np.linalg.norm(R[:, left], axis=0) / np.sqrt(reach[left])
        jbest = left[int(np.argmax(norms))]
        best = float(norms.max())
        if best < inform_min:
            break
        if len(order) >= cap:
            break
        order.append(jbest)
        indep.append(best)
        q = R[:, jbest] / np.linalg.norm(R[:, jbest])
        R = R - np.outer(q, q @ R)
    keys = [t.key for t in problem.terms]
    for pos, (j, v) in enumerate(zip(order, indep, strict=True)):
        reasons[j] = f"fitted (#{pos + 1}): moves the runs {v:.1%} per prior width beyond the terms before it"
    resid = np.linalg.norm(R, axis=0) / np.sqrt(reach)
    for j in range(k):
        if reasons[j]:
            continue
        if sens[j] < inform_min:
            reasons[j] = f"kept at prior: the runs barely see it ({sens[j]:.2%} per prior width)"
        elif resid[j] < inform_min:
            reasons[j] = (
                f"kept at prior: what the runs see of it ({sens[j]:.1%}) is explained by terms already fitted "
                f"(independent part {resid[j]:.2%})"
            )
        else:
            reasons[j] = f"kept at prior: informed ({resid[j]:.1%} independent) but the cap of {cap} terms is reached"
    return Identification(
        keys=tuple(keys),
        sensitivity=tuple(float(s) for s in sens),
        singular=tuple(float(s) for s in sv),
        rank=rank,
        order=tuple(order),
        independent=tuple(indep),
        reasons=tuple(reasons),
        cap=cap,
    )
