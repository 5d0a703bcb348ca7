"""Calibration: measured runs in, fitted device tables and fidelity reports out.

``load_runs`` reads a runs file, ``prepare`` resolves each run once, ``predict`` prices it,
``pooled_fit`` identifies and fits runtime terms across devices and stacks, ``cross_validate`` judges
that procedure on held-out runs, models or sources, and ``calibrate`` does the user workflow that
``hapmoe-milp calibrate`` runs (identify, choose how many terms by cross-validation, fit, write).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hapmoe_milp.calibration.crossval import CV_KINDS, PooledFit, cross_validate, pooled_fit, stacks_of, table_stack
from hapmoe_milp.calibration.fidelity import PreparedRun, RunResult, Summary, predict, prepare, summarize
from hapmoe_milp.calibration.fit import FitResult, FittedTerm, Problem, fit
from hapmoe_milp.calibration.identify import INFORM_MIN, Identification, identify
from hapmoe_milp.calibration.microbench import Row, load_rows
from hapmoe_milp.calibration.runs import MeasuredRun, load_runs, runs_path
from hapmoe_milp.calibration.table import CALIBRATED_DIR, calibrated_document, write_document
from hapmoe_milp.calibration.terms import KERNEL_TERMS, STACK_TERMS
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.specs.catalog import Catalog
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.runtime import PARAM_INFO

USER_METHOD = (
    "identifiable terms only (pivoted sensitivity, at most one per two runs), kernel terms inside their "
    "micro-benchmark tolerance, number of terms chosen by leave-one-run-out error (never worse than none); "
    "soft-L1 least squares on log step-time ratios with a weak prior toward the base table"
)


@dataclass(frozen=True)
class Calibration:
    device: str
    base: DeviceSpec
    runs: tuple[PreparedRun, ...]
    before: tuple[RunResult, ...]
    pooled: PooledFit  # identification and the fit with the chosen number of terms
    cv: dict[int, tuple[float, ...]]  # number of terms -> leave-one-run-out errors (empty with one run)
    chosen: int
    notes: tuple[str, ...]
    path: Path | None

    @property
    def fit(self) -> FitResult:
        return self.pooled.result

    @property
    def table(self) -> DeviceSpec:
        return self.pooled.tables(table_stack(self.runs, self.device))[self.device]

    def summary_before(self) -> Summary:
        return summarize(self.before)

    def summary_cv(self) -> Summary | None:
        if not self.cv:
            return None
        return summarize(self.before, self.cv[self.chosen])

    def summary_cv_uncalibrated(self) -> Summary | None:
        return summarize(self.before) if self.cv else None

    def to_dict(self) -> dict[str, Any]:
        """The calibration as JSON: the terms fitted and why, each run's error (base table, in-sample, and
        left out when cross-validated), the summaries and the notes."""
        loo = self.cv.get(self.chosen)
        cv = self.summary_cv()
        return {
            "device": self.device,
            "base": f"{self.base.id} ({self.base.provenance})",
            "path": str(self.path) if self.path else None,
            "parameters": [p.to_dict() for p in self.fit.params],
            "identifiability": self.pooled.identification.to_dict(),
            "notes": list(self.notes),
            "chosen_terms": self.chosen,
            "cross_validation": {str(k): sum(abs(e) for e in v) / len(v) for k, v in self.cv.items()},
            "runs": [
                {**b.to_dict(), "error_after": e, **({"error_loo": loo[i]} if loo else {})}
                for i, (b, e) in enumerate(zip(self.before, self.fit.errors, strict=True))
            ],
            "before": self.summary_before().to_dict(),
            "leave_one_out": cv.to_dict() if cv else None,
        }


def runs_for(device: str, runs: Sequence[PreparedRun]) -> list[PreparedRun]:
    return [r for r in runs if device in r.devices]


def base_table(cat: Catalog, device: str) -> DeviceSpec:
    """Where a user calibration starts: the table the planner uses, if it is the shipped public fit (the
    best prior there is); never an earlier user fit (refitting a fit compounds it), so then the
    uncalibrated (profiled or shipped) table."""
    dev = cat.device(device)
    if dev.provenance == "calibrated" and dev.calibration.get("scope") != "public":
        return replace(cat, use_calibrated=False).device(device)
    return dev


def _mape(errs: Sequence[float]) -> float:
    return sum(abs(e) for e in errs) / len(errs)


def calibrate(
    runs: str | Path,
    device: str,
    *,
    catalog: Catalog | None = None,
    params: Sequence[str] | None = None,
    out: Path | None = None,
    force: bool = False,
    version: str = "",
) -> Calibration:
    """Fit ``device``'s identifiable runtime terms to the runs that use it.

    The number of terms comes from the runs: identifiability gives an order and a cap, then every prefix
    (0 terms = the base table) is scored by leave-one-run-out error and the best is kept, so the written
    table is never worse cross-validated than the base. With one run there is nothing to cross-validate:
    at most one term is fitted, and the report says so. ``force`` fits every identified term regardless.
    """
    cat = catalog or Catalog()
    base = base_table(cat, device)
    path = runs_path(runs, cat.root)
    unknown = [n for n in params or () if n not in PARAM_INFO]
    if unknown:
        raise HapmoeError(f"unknown runtime parameter {unknown[0]!r}; known: {', '.join(PARAM_INFO)}", field="--params")
    mine = runs_for(base.id, [prepare(r, cat) for r in load_runs(path)])
    if not mine:
        raise HapmoeError(f"no run in the file uses device {base.id!r}", source=str(path), field="cluster")
    # other device types in the runs keep their tables; only this one may move
    bases = {d: (base if d == base.id else cat.device(d)) for r in mine for d in r.devices}
    rows = load_rows(cat.root)
    names = list(params or (*STACK_TERMS, *KERNEL_TERMS))
    before = tuple(predict(r, bases) for r in mine)
    full = pooled_fit(mine, bases, rows, names=names, max_terms=0, only_device=base.id)
    order = full.identification.order
    notes: list[str] = []
    cv: dict[int, tuple[float, ...]] = {}
    if len(mine) == 1:
        chosen = min(1, len(order))
        notes.append("one run: nothing to cross-validate; at most one term fitted")
    elif force:
        chosen = len(order)
        notes.append("--force: every identified term fitted, whatever the cross-validated error")
    else:
        for k in range(len(order) + 1):
            cv[k] = tuple(_loo(mine, bases, rows, names, k, base.id))
        chosen = min(cv, key=lambda k: (round(_mape(cv[k]), 6), k))
        if chosen < len(order):
            notes.append(
                f"{chosen} of {len(order)} identified terms kept: more did not lower the leave-one-run-out error "
                f"({', '.join(f'{k}: {_mape(v):.1%}' for k, v in cv.items())})"
            )
    pooled = pooled_fit(mine, bases, rows, names=names, max_terms=chosen, only_device=base.id)
    written = None
    if out is not None and (chosen > 0 or force):
        table = pooled.tables(table_stack(mine, base.id))[base.id]
        doc = calibrated_document(
            base, table, pooled.result.params, mine, before, pooled.result.errors,
            scope="user", method=USER_METHOD, identification=full.identification.to_dict(),
            cross_validation={"leave_one_run_out": {str(k): round(_mape(v), 4) for k, v in cv.items()},
                              "chosen_terms": chosen} if cv else None,
            rows=rows, version=version,
        )  # fmt: skip
        written = write_document(doc, out / f"{base.id}.yaml")
    elif out is not None:
        notes.append("nothing written: no fitted term lowers the cross-validated error (use --force to fit anyway)")
    return Calibration(base.id, base, tuple(mine), before, pooled, cv, chosen, tuple(notes), written)


def _loo(
    runs: Sequence[PreparedRun],
    bases: dict[str, DeviceSpec],
    rows: Sequence[Row],
    names: Sequence[str],
    k: int,
    did: str,
) -> list[float]:
    out = []
    for i, held in enumerate(runs):
        rest = [r for j, r in enumerate(runs) if j != i]
        pf = pooled_fit(rest, bases, rows, names=names, max_terms=k, only_device=did)
        out.append(predict(held, pf.tables(held.run.stack)).error)
    return out


__all__ = [
    "CALIBRATED_DIR",
    "CV_KINDS",
    "INFORM_MIN",
    "Calibration",
    "FitResult",
    "FittedTerm",
    "Identification",
    "MeasuredRun",
    "PooledFit",
    "PreparedRun",
    "Problem",
    "Row",
    "RunResult",
    "Summary",
    "base_table",
    "calibrate",
    "calibrated_document",
    "cross_validate",
    "fit",
    "identify",
    "load_rows",
    "load_runs",
    "pooled_fit",
    "predict",
    "prepare",
    "runs_for",
    "runs_path",
    "stacks_of",
    "summarize",
    "table_stack",
    "write_document",
]
