"""Write a calibrated device table: the base table with fitted runtime terms and the record of the fit.

The file keeps the base table's schema (so it loads wherever a shipped or profiled table does), says
``provenance: calibrated``, and carries under ``calibration`` what it was fitted to: the runs with their
sources, each run's error before and after, the terms fitted (with the micro-benchmark rows that bound
them), the identifiability report, the cross-validated errors, and the table's own check against every
applicable micro-benchmark row. ``scope`` says whose fit it is: ``public`` (the shipped fit to
bench/calibration/runs.yaml) or ``user``. Output is deterministic (no timestamps) and written atomically.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hapmoe_milp.calibration.fidelity import PreparedRun, RunResult
from hapmoe_milp.calibration.fit import FittedTerm
from hapmoe_milp.calibration.microbench import Row, table_rows_report
from hapmoe_milp.calibration.terms import STACK_TERMS
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.fileio import write_text_atomic
from hapmoe_milp.specs._fields import load_document
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.runtime import PARAMS

CALIBRATED_DIR = Path("clusters") / "devices-calibrated"
SCOPES = ("public", "user")


def _mape(errs: Sequence[float]) -> float:
    return round(sum(abs(e) for e in errs) / len(errs), 4) if errs else 0.0


def _applies(p: FittedTerm, stack: str | None) -> bool:
    """Whether fitted term ``p`` is one the table for ``stack`` carries (kernel terms always are)."""
    return stack is None or p.name not in STACK_TERMS or p.key == f"{p.name}@{stack}"


def calibrated_document(
    base: DeviceSpec,
    fitted: DeviceSpec,
    params: Sequence[FittedTerm],
    runs: Sequence[PreparedRun],
    before: Sequence[RunResult],
    after: Sequence[float],
    *,
    scope: str,
    method: str,
    identification: Mapping[str, Any] | None = None,
    cross_validation: Mapping[str, Any] | None = None,
    rows: Sequence[Row] = (),
    version: str = "",
    stack: str | None = None,
) -> dict[str, Any]:
    """The table document. ``stack``: the software stack whose host/overlap terms the table carries; fitted
    stack terms of other stacks on the same device (B200 under an older container) are then left out of
    ``parameters``, which lists only what the table's values come from."""
    if not base.origin:
        raise HapmoeError(f"device {base.id!r} has no source file to calibrate from")
    doc = copy.deepcopy(load_document(base.origin))
    doc["provenance"] = "calibrated"
    rt = fitted.runtime.to_dict()
    doc["runtime"] = {
        "note": "fitted by hapmoe-milp calibrate; see calibration",
        **{p.name: rt[p.name] for p in PARAMS},
    }
    sources = list(doc.get("sources") or [])
    for r in runs:
        if r.run.source not in sources:
            sources.append(r.run.source)
    doc["sources"] = sources
    doc.pop("calibration", None)
    record: dict[str, Any] = {
        "scope": scope,
        "tool": f"hapmoe-milp {version} calibrate".replace("  ", " "),
        "base": f"{Path(base.origin).name} ({base.provenance})",
        "method": method,
        "parameters": [
            {
                "name": p.name,
                "term": p.key,
                "start": p.start[base.id],
                "value": p.value[base.id],
                "bounded_by": p.bounded_by,
                "at_bound": p.at_bound or None,
            }
            for p in params
            if base.id in p.value and _applies(p, stack)
        ],
        "runs": [
            {
                "id": pr.run.id,
                "source": pr.run.source,
                "stack": pr.run.stack,
                "model": pr.model.name,
                "cluster": pr.cluster.name,
                "measured_step_s": round(pr.measured_s, 6),
                "error_before": round(b.error, 4),
                "error_after": round(a, 4),
            }
            for pr, b, a in zip(runs, before, after, strict=True)
        ],
        "mape_before": _mape([b.error for b in before]),
        "mape_after_in_sample": _mape(after),
    }
    if stack is not None:
        record["stack"] = stack
    if identification is not None:
        record["identifiability"] = dict(identification)
    if cross_validation is not None:
        record["cross_validation"] = dict(cross_validation)
    if rows:
        record["micro_benchmarks"] = table_rows_report(fitted, rows)
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
