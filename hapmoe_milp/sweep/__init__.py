"""Batch sweeps: solve one model on many cluster mixes, locally or on a Ray cluster, into a JSONL file.

The question a sweep answers is *which mix to buy or rent*: for every cluster (named, or generated from
``DEVICE:MIN-MAX:STEP`` ranges) it runs the solver and records throughput, per-device throughput and,
when prices are known, tokens per dollar.

Why the design is what it is:

* **Results stream to JSONL** — one line per finished case, written with a single ``write`` and
  ``fsync``ed, so a sweep killed at any point keeps every case it finished. A truncated trailing line
  (the only damage a kill can do) is repaired on resume.
* **Stable case ids** — a hash of (model, cluster spec, settings), independent of order and of the run,
  so ``resume=True`` skips exactly the cases already in the file (successful or failed) and never
  duplicates one.
* **Specs are resolved on the driver** and shipped to workers as values, so Ray workers need the package
  but not the catalog folders, and a bad name becomes an error row instead of a crashed worker.
* **A failing case is a row, not an abort** — infeasible mixes are an expected answer in a sweep.

The rooms: :mod:`.cases` (what to solve), :mod:`.results` (one row per case, the JSONL file),
:mod:`.runners` (local process pool, Ray) and :mod:`.report` (best table, Pareto front, plot).
"""

from __future__ import annotations

from hapmoe_milp.sweep.cases import (
    Budget,
    MixRange,
    SweepCase,
    cases_from_clusters,
    cases_from_mix,
    mix_clusters,
    parse_budget,
    parse_mix,
    parse_prices,
)
from hapmoe_milp.sweep.report import best_table, pareto_front, plot_sweep
from hapmoe_milp.sweep.results import read_results, run_case
from hapmoe_milp.sweep.runners import SweepSummary, run_sweep

__all__ = [
    "Budget",
    "MixRange",
    "SweepCase",
    "SweepSummary",
    "best_table",
    "cases_from_clusters",
    "cases_from_mix",
    "mix_clusters",
    "pareto_front",
    "parse_budget",
    "parse_mix",
    "parse_prices",
    "plot_sweep",
    "read_results",
    "run_case",
    "run_sweep",
]
