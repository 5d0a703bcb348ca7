"""Write a calibrated device table: the base table with fitted runtime terms and the record of the fit.

The file keeps the base table's schema (so it loads wherever a shipped or profiled table does), says
``provenance: calibrated``, and carries under ``calibration`` what it was fitted to: the runs with their
sources, each run's residual before and after, the fitted parameters with their bounds (and whether a
fit ended on one), and the leave-one-out error. Output is deterministic (no timestamps) and written
atomically.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from hapmoe_milp.calibration.fidelity import PreparedRun, RunResult
from hapmoe_milp.calibration.fit import FitResult
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.fileio import write_text_atomic
from hapmoe_milp.specs._fields import load_document
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.runtime import PARAMS

CALIBRATED_DIR = Path("clusters") / "devices-calibrated"


def calibrated_document(
    base: DeviceSpec,
    fit: FitResult,
    runs: Sequence[PreparedRun],
    before: Sequence[RunResult],
    loo: Sequence[float] | None,
    version: str,
) -> dict[str, Any]:
    if not base.origin:
        raise HapmoeError(f"device {base.id!r} has no source file to calibrate from")
    doc = copy.deepcopy(load_document(base.origin))
    doc["provenance"] = "calibrated"
    rt = fit.device.runtime.to_dict()
    doc["runtime"] = {
        "note": "fitted by hapmoe-milp calibrate; see calibration",
        **{p.name: rt[p.name] for p in PARAMS},
    }
    sources = list(doc.get("sources") or [])
    for r in runs:
        if r.run.source not in sources:
            sources.append(r.run.source)
    doc["sources"] = sources
    rows = []
    for pr, b, err in zip(runs, before, fit.errors, strict=True):
        rows.append(
            {
                "id": pr.run.id,
                "source": pr.run.source,
                "model": pr.model.name,
                "cluster": pr.cluster.name,
                "measured_step_s": round(pr.measured_s, 6),
                "error_before": round(b.error, 4),
                "error_after": round(err, 4),
            }
        )
    record: dict[str, Any] = {
        "tool": f"hapmoe-milp {version} calibrate",
        "base": f"{base.origin} ({base.provenance})",
        "method": "bounded soft-L1 least squares on log step-time ratios, weak prior toward the base table",
        "parameters": [p.to_dict() for p in fit.params],
        "runs": rows,
        "mape_after": round(sum(abs(e) for e in fit.errors) / len(fit.errors), 4),
    }
    if loo is not None:
        record["leave_one_out"] = {
            "mape": round(sum(abs(e) for e in loo) / len(loo), 4),
            "worst": round(max(abs(e) for e in loo), 4),
            "errors": {pr.run.id: round(e, 4) for pr, e in zip(runs, loo, strict=True)},
        }
    doc["calibration"] = record
    return doc


def write_document(doc: dict[str, Any], path: Path) -> Path:
    """Write the table as YAML (a YAML emitter, never string formatting), atomically."""
    text = (
        "# Calibrated by `hapmoe-milp calibrate` from a base device table and measured runs; re-run it to refresh.\n"
        + yaml.safe_dump(doc, sort_keys=False, width=110, allow_unicode=False)
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HapmoeError(f"cannot create the folder: {exc.strerror or exc}", source=str(path.parent)) from None
    return write_text_atomic(path, text, field="out")
