"""Calibration: measured runs in, fitted device tables and fidelity reports out.

``load_runs`` reads a runs file, ``prepare`` resolves each run once, ``predict`` prices it,
``fit_device`` fits a device's runtime terms, ``calibrate`` does the whole user workflow (fit,
leave-one-out check, calibrated table) that ``hapmoe-milp calibrate`` runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hapmoe_milp.calibration.fidelity import PreparedRun, RunResult, Summary, predict, prepare, summarize
from hapmoe_milp.calibration.fit import DEFAULT_FIT, FitResult, fit_device, leave_one_out
from hapmoe_milp.calibration.runs import MeasuredRun, load_runs, runs_path
from hapmoe_milp.calibration.table import CALIBRATED_DIR, calibrated_document, write_document
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.specs.catalog import Catalog


@dataclass(frozen=True)
class Calibration:
    device: str
    runs: tuple[PreparedRun, ...]
    before: tuple[RunResult, ...]
    fit: FitResult
    loo: tuple[float, ...] | None
    path: Path | None

    def summary_before(self) -> Summary:
        return summarize(self.before)

    def summary_after(self) -> Summary:
        return summarize(self.before, self.fit.errors)

    def summary_loo(self) -> Summary | None:
        if self.loo is None:
            return None
        return summarize(self.before, self.loo)

    def to_dict(self) -> dict[str, Any]:
        """The fit as JSON: fitted terms, each run's error before/after (and left out), the three summaries."""
        loo = self.summary_loo()
        return {
            "device": self.device,
            "path": str(self.path) if self.path else None,
            "parameters": [p.to_dict() for p in self.fit.params],
            "runs": [
                {**b.to_dict(), "error_after": e, **({"error_loo": lo} if self.loo else {})}
                for b, e, lo in zip(self.before, self.fit.errors, self.loo or self.fit.errors, strict=True)
            ],
            "before": self.summary_before().to_dict(),
            "after": self.summary_after().to_dict(),
            "leave_one_out": loo.to_dict() if loo else None,
        }


def runs_for(device: str, runs: Sequence[PreparedRun]) -> list[PreparedRun]:
    return [r for r in runs if device in r.devices]


def calibrate(
    runs: str | Path,
    device: str,
    *,
    catalog: Catalog | None = None,
    params: Sequence[str] = DEFAULT_FIT,
    out: Path | None = None,
    loo: bool = True,
    version: str = "",
) -> Calibration:
    cat = catalog or Catalog()
    # fit from the table a calibration would replace (profiled or shipped), never from an earlier fit
    base = replace(cat, use_calibrated=False).device(device)
    path = runs_path(runs, cat.root)
    prepared = [prepare(r, cat) for r in load_runs(path)]
    mine = runs_for(base.id, prepared)
    if not mine:
        raise HapmoeError(f"no run in the file uses device {base.id!r}", source=str(path), field="cluster")
    before = tuple(predict(r, {base.id: base}) for r in mine)  # from where the fit starts
    fit = fit_device(mine, base, params)
    errs = tuple(leave_one_out(mine, base, params)) if loo and len(mine) > 1 else None
    path = None
    if out is not None:
        doc = calibrated_document(base, fit, mine, before, errs, version)
        path = write_document(doc, out / f"{base.id}.yaml")
    return Calibration(base.id, tuple(mine), before, fit, errs, path)


__all__ = [
    "CALIBRATED_DIR",
    "DEFAULT_FIT",
    "Calibration",
    "FitResult",
    "MeasuredRun",
    "PreparedRun",
    "RunResult",
    "Summary",
    "calibrate",
    "fit_device",
    "leave_one_out",
    "load_runs",
    "predict",
    "prepare",
    "runs_for",
    "runs_path",
    "summarize",
]
