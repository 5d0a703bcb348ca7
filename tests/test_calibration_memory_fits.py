"""Every calibration run that really ran is predicted to fit under its own settings (issue 23).

These runs trained on their hardware (bench/calibration/runs.yaml, each with its source), so a plan the
memory model rejects is a memory model that over-counts; the run's settings are taken as recorded.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hapmoe_milp.calibration import load_runs, prepare
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.specs import Catalog

ROOT = Path(__file__).resolve().parents[1]


def test_every_calibration_run_that_ran_is_predicted_to_fit():
    cat = Catalog(root=ROOT, use_calibrated=False)
    runs = [prepare(r, cat) for r in load_runs(ROOT / "bench" / "calibration" / "runs.yaml")]
    assert len(runs) >= 30
    not_fit = [pr.run.id for pr in runs if not estimate(pr.model, pr.cluster, pr.plan, pr.settings).fits]
    assert not_fit == []


def test_the_flagperf_layout_that_ran_out_of_memory_is_predicted_not_to_fit():
    """The other side: FlagPerf's A800 Llama-3-8B ablation lists PP1DP8TP1 as "OOM" (README at FlagPerf
    e203e1a4, same script and settings as the a800-llama3-8b rows of runs.yaml); a memory model that
    under-counts would call it feasible."""
    cat = Catalog(root=ROOT, use_calibrated=False)
    ran = next(
        r for r in load_runs(ROOT / "bench" / "calibration" / "runs.yaml") if r.id == "a800-llama3-8b-pp8-flagperf-bf16"
    )
    pr = prepare(replace(ran, id="a800-llama3-8b-dp8-flagperf-oom", pp=1, tp=1), cat)
    assert not estimate(pr.model, pr.cluster, pr.plan, pr.settings).fits
