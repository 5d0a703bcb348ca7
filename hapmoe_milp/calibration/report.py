"""Fidelity of the cost model on measured runs: in-sample and cross-validated, per device and overall.

One evaluation serves ``hapmoe-milp fidelity`` and ``bench/fidelity.py``:

- **uncalibrated**: the datasheet / micro-benchmark (or profiled) tables predict every run;
- **planner tables**: the tables the planner uses now (calibrated where a calibrated table exists). A run
  that table was fitted to is marked **in-sample**: its error says how well the fit reproduces its own
  data, not how well it predicts;
- **cross-validated** (``run``, ``model``, ``source``): every run predicted by a pooled, identifiable fit
  to the runs outside its fold, starting from the uncalibrated tables
  (:func:`hapmoe_milp.calibration.crossval.cross_validate`).

The report is a list of named error columns over one list of runs, so other columns (memory, say) slot
in beside the time columns without changing the summaries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hapmoe_milp.calibration.crossval import CV_KINDS, cross_validate
from hapmoe_milp.calibration.fidelity import PreparedRun, RunResult, Summary, predict, summarize
from hapmoe_milp.calibration.microbench import load_rows
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.specs.catalog import Catalog

#: Column labels, in report order.
LABELS = {
    "uncalibrated": "uncalibrated",
    "planner": "planner tables",
    "run": "leave-one-run-out",
    "model": "leave-one-model-out",
    "source": "leave-one-source-out",
}


@dataclass(frozen=True)
class Evaluation:
    runs: tuple[PreparedRun, ...]
    results: tuple[RunResult, ...]  # uncalibrated predictions (breakdowns, memory)
    columns: dict[str, tuple[float, ...]]  # label -> per-run relative step-time error
    in_sample: tuple[bool, ...]  # per run: a planner table was fitted to it

    def summary(self, column: str) -> Summary:
        return summarize(self.results, self.columns[column])

    def summaries(self) -> dict[str, Summary]:
        return {c: self.summary(c) for c in self.columns}

    def to_dict(self) -> dict[str, Any]:
        runs = []
        for i, (pr, res) in enumerate(zip(self.runs, self.results, strict=True)):
            d = res.to_dict()
            d["stack"] = pr.run.stack
            d["errors"] = {c: v[i] for c, v in self.columns.items()}
            d["in_sample"] = self.in_sample[i]
            runs.append(d)
        return {
            "runs": runs,
            "summary": {c: s.to_dict() for c, s in self.summaries().items()},
            "columns": {c: LABELS.get(c, c) for c in self.columns},
        }


def parse_kinds(text: str | None) -> list[str]:
    """``run``, ``model``, ``source`` or a comma-separated list of them (``all`` for every kind)."""
    if not text:
        return []
    kinds = list(CV_KINDS) if text.strip() == "all" else [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in CV_KINDS]
    if bad:
        raise HapmoeError(
            f"unknown cross-validation {bad[0]!r}; use run, model, source or all", field="--cross-validate"
        )
    return list(dict.fromkeys(kinds))


def evaluate(
    runs: Sequence[PreparedRun],
    catalog: Catalog,
    kinds: Sequence[str] = (),
    *,
    progress: Callable[[str], None] | None = None,
) -> Evaluation:
    """Predict every run with the uncalibrated and the planner tables, and cross-validate by ``kinds``."""
    raw = replace(catalog, use_calibrated=False)
    devices = sorted({d for r in runs for d in r.devices})
    bases = {d: raw.device(d) for d in devices}
    planner = {d: catalog.device(d) for d in devices}
    results = tuple(predict(r, bases) for r in runs)
    columns: dict[str, tuple[float, ...]] = {"uncalibrated": tuple(r.error for r in results)}
    columns["planner"] = tuple(predict(r, planner).error for r in runs)
    fitted_ids = {d: {str(x.get("id")) for x in (planner[d].calibration.get("runs") or [])} for d in devices}
    in_sample = tuple(any(r.run.id in fitted_ids[d] for d in r.devices) for r in runs)
    rows = load_rows(catalog.root)
    for k in kinds:
        if progress is not None:
            progress(k)
        columns[k] = tuple(cross_validate(runs, bases, rows, k))
    return Evaluation(tuple(runs), results, columns, in_sample)


def per_device(ev: Evaluation, column: str) -> dict[str, Summary]:
    """Summaries of one column per device type (runs spanning several types count for their combination)."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(ev.results):
        groups.setdefault("+".join(r.devices), []).append(i)
    return {
        d: summarize([ev.results[i] for i in idx], [ev.columns[column][i] for i in idx])
        for d, idx in sorted(groups.items())
    }
