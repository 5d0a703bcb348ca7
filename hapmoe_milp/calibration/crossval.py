"""Pooled, identifiable fits and their cross-validation by run, by model and by source.

A fitted table is judged on runs it has not seen. Three ways to hold runs out, from kindest to hardest:

- ``run``: each run predicted by a fit to every other run (near-duplicates -- one model's layouts from
  one table -- flatter it);
- ``model``: every run of one model held out at once (the headline: a user's model is usually one the
  shipped set never saw);
- ``source``: every run of one publication held out at once (one software release, one benchmark
  harness).

The whole procedure is cross-validated, not just the last step: in each fold the terms, their
identifiability and the fit are recomputed from the training runs only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hapmoe_milp.calibration.fidelity import PreparedRun, predict
from hapmoe_milp.calibration.fit import FitResult, Problem, fit, stack_of
from hapmoe_milp.calibration.identify import Identification, identify
from hapmoe_milp.calibration.microbench import Row
from hapmoe_milp.calibration.terms import make_terms
from hapmoe_milp.specs.device import DeviceSpec

CV_KINDS = ("run", "model", "source")


def fold_key(kind: str) -> Callable[[PreparedRun], str]:
    if kind == "run":
        return lambda r: r.run.id
    if kind == "model":
        return lambda r: r.model.name
    if kind == "source":
        return lambda r: r.run.source
    raise ValueError(kind)


@dataclass(frozen=True)
class PooledFit:
    problem: Problem
    identification: Identification
    result: FitResult
    skipped: tuple[str, ...]  # terms never candidates, and why (no micro-benchmark range)

    def tables(self, stack: str, *, whole_stack: bool = False) -> dict[str, DeviceSpec]:
        return self.result.tables(stack, whole_stack=whole_stack)

    def report(self) -> list[str]:
        return [*self.identification.report(), *(f"  {s}" for s in self.skipped)]


def stacks_of(runs: Sequence[PreparedRun]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in runs:
        devs = out.setdefault(stack_of(r), [])
        for d in r.devices:
            if d not in devs:
                devs.append(d)
    return out


def table_stack(runs: Sequence[PreparedRun], device: str) -> str:
    """The stack whose terms a device's shipped table carries: the one with most runs on the device (ties: the
    name sorting first). A device measured under an older container too (B200 under NeMo 25.02 and the
    current Megatron-Bridge releases) ships the terms of the stack most of its runs use, never whichever
    run happens to come first in the file."""
    count: dict[str, int] = {}
    for r in runs:
        if device in r.devices:
            count[stack_of(r)] = count.get(stack_of(r), 0) + 1
    if not count:
        raise ValueError(f"no run uses device {device!r}")
    return min(count, key=lambda s: (-count[s], s))


def pooled_fit(
    runs: Sequence[PreparedRun],
    bases: Mapping[str, DeviceSpec],
    rows: Sequence[Row],
    *,
    names: Sequence[str] | None = None,
    cap: int | None = None,
    max_terms: int | None = None,
    prior_weight: float = 1.0,
    only_device: str | None = None,
) -> PooledFit:
    """Identify and fit the runs' terms (``max_terms`` truncates the identified order; ``only_device``
    lets only that device's table move, as a user calibration of one device does)."""
    stacks = stacks_of(runs)
    if only_device is not None:
        stacks = {s: [d for d in devs if d == only_device] for s, devs in stacks.items()}
    terms, skipped = make_terms(stacks, bases, rows, names)
    problem = Problem(tuple(runs), bases, tuple(terms), tuple(rows))
    ident = identify(problem, cap=cap)
    order = ident.order if max_terms is None else ident.order[:max_terms]
    res = fit(problem, order, prior_weight=prior_weight)
    return PooledFit(problem, ident, res, tuple(skipped))


def cross_validate(
    runs: Sequence[PreparedRun],
    bases: Mapping[str, DeviceSpec],
    rows: Sequence[Row],
    kind: str,
    *,
    names: Sequence[str] | None = None,
    max_terms: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[float]:
    """Each run's relative error when predicted by a pooled fit to the runs of the *other* folds."""
    key = fold_key(kind)
    errs: dict[int, float] = {}
    folds: dict[str, list[int]] = {}
    for i, r in enumerate(runs):
        folds.setdefault(key(r), []).append(i)
    for k, held in folds.items():
        if progress is not None:
            progress(k)
        train = [r for i, r in enumerate(runs) if i not in held]
        pf = pooled_fit(train, bases, rows, names=names, max_terms=max_terms) if train else None
        for i in held:
            r = runs[i]
            tabs = pf.tables(stack_of(r), whole_stack=True) if pf is not None else dict(bases)
            errs[i] = predict(r, tabs).error
    return [errs[i] for i in range(len(runs))]
