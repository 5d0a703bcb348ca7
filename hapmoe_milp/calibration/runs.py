"""Measured training runs: what a user (or a public benchmark) ran, on what, and how fast it went.

A runs file is YAML (``runs:`` list of mappings) or CSV (one run per row, same column names). Each run
names a model and a cluster as everywhere else (catalog name, path, or inline ``16xh100``), the Megatron
launch knobs, the settings that differ from the model's defaults, and one measurement: the step time, or
tokens per second (per device or in total). Everything is checked here, once, with the file and the
field in the message.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hapmoe_milp.config import BOOL_SETTINGS, DISPATCHERS, FP8_RECIPES, check_graph_scope, check_recompute
from hapmoe_milp.errors import HapmoeError, SettingsError, SpecError
from hapmoe_milp.limits import (
    RANGE_MEMORY_GIB,
    RANGE_STEP_TIME_S,
    RANGE_TOKENS_PER_S,
    RANGE_TOKENS_PER_S_PER_DEVICE,
)
from hapmoe_milp.specs._fields import Fields, load_document

PRECISIONS = ("bf16", "fp8")
#: Software stack of runs that do not name one: a user's own runs share one stack unless they say otherwise.
DEFAULT_STACK = "user"
MEASURES = ("step_time_s", "tokens_per_s_per_device", "tokens_per_s")
KNOBS = ("tp", "pp", "cp", "ep", "etp", "vpp")
# physical range of each measurement (limits.py): 1e-300 tokens/s is "positive" but divides to infinity
MEASURE_RANGES = {
    "step_time_s": RANGE_STEP_TIME_S,
    "tokens_per_s_per_device": RANGE_TOKENS_PER_S_PER_DEVICE,
    "tokens_per_s": RANGE_TOKENS_PER_S,
}
#: Model fields (Megatron names) a run may set where its launch differs from the catalog model: the flags a
#: script leaves at Megatron's defaults (FlagPerf's LLaMA-3 launches tie the embeddings, keep linear biases and
#: learned absolute position embeddings)
MODEL_BOOLS = ("untie_embeddings_and_output_weights", "add_bias_linear", "learned_absolute_position_embedding")
#: numeric settings a run may state (checked by config.Settings like every other setting)
SETTING_FLOATS = ("gshard_capacity_factor",)
# memory-related settings a run may state (checked by config.Settings like every other setting)
SETTING_STRS = ("optimizer_state_dtype", "main_params_dtype", "fsdp", "offload_modules")
#: What a measured peak is: live tensors (torch max_memory_allocated), the caching allocator's reserved peak,
#: or device-level use (nvidia-smi / NVML: reserved plus context and communication buffers).
MEMORY_KINDS = ("allocated", "reserved", "device")
#: Which rank a measured peak is: ``hottest`` (the most loaded rank, or the one the source names, which is
#: the hottest stage in every row so marked), ``any`` (the source does not say which GPU or which summary
#: over GPUs the figure is: comparable with a per-rank prediction only where every rank holds the same).
MEMORY_RANKS = ("hottest", "any")


@dataclass(frozen=True)
class MeasuredRun:
    id: str
    source: str
    model: str
    cluster: str
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int | None
    vpp: int
    layout: str | None
    recompute: str
    seq_length: int
    global_batch_size: int
    micro_batch_size: int
    precision: str
    dispatcher: str | None
    measure: str  # which of MEASURES was given
    value: float
    flags: dict[str, Any] = field(default_factory=dict)
    peak_memory_gib: float | None = None
    notes: str = ""
    origin: str = ""
    stack: str = DEFAULT_STACK
    fp8_recipe: str | None = None
    peak_memory_kind: str = "allocated"
    peak_memory_rank: str = "hottest"
    cuda_graph_scope: str | None = None
    model_fields: dict[str, bool] = field(default_factory=dict)  # MODEL_BOOLS the run sets (catalog model else)

    @property
    def has_time(self) -> bool:
        """False for memory-only rows (``peak_memory_gib`` without a step-time measurement)."""
        return bool(self.measure)

    def step_time_s(self, world_size: int) -> float:
        """The measurement as seconds per iteration (tokens/s are converted with GBS x sequence)."""
        if not self.measure:
            return math.nan
        tokens = self.global_batch_size * self.seq_length
        if self.measure == "step_time_s":
            return self.value
        if self.measure == "tokens_per_s":
            return tokens / self.value
        return tokens / (self.value * world_size)

    def settings_kw(self) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "seq_length": self.seq_length,
            "global_batch_size": self.global_batch_size,
            "micro_batch_size": self.micro_batch_size,
            "precision": self.precision,
            **self.flags,
        }
        if self.dispatcher is not None:
            kw["dispatcher"] = self.dispatcher
        if self.fp8_recipe is not None:
            kw["fp8_recipe"] = self.fp8_recipe
        if self.cuda_graph_scope is not None:
            kw["cuda_graph_scope"] = self.cuda_graph_scope
        return kw


def _run_from_fields(f: Fields) -> MeasuredRun:
    rid = f.str_("id")
    source = f.str_("source")
    if not source.startswith(("http://", "https://", "file:", "local:")):
        raise f.err("source", f"must be a URL (or file:/local: for your own runs), got {source!r}")
    knobs = {k: f.int_(k, 1) for k in KNOBS if k != "etp"}
    etp = f.int_("etp", None)
    measures = [m for m in MEASURES if f.has(m)]
    memory_only = not measures and f.has("peak_memory_gib")
    if len(measures) != 1 and not memory_only:
        raise f.err(
            "step_time_s",
            f"give exactly one measurement of {', '.join(MEASURES)} (got {', '.join(measures) or 'none'}), "
            "or a peak_memory_gib alone",
        )
    value = math.nan if memory_only else f.float_(measures[0], within=MEASURE_RANGES[measures[0]])
    layout = f.str_("layout", None)
    flags: dict[str, Any] = {k: f.bool_(k) for k in BOOL_SETTINGS if f.has(k)}
    for k in SETTING_FLOATS:
        if f.has(k):
            flags[k] = f.float_(k, allow_zero=True)
    for k in SETTING_STRS:
        if f.has(k):
            v = f.raw(k)
            flags[k] = tuple(v) if isinstance(v, list) else v
    dispatcher = f.choice("dispatcher", DISPATCHERS) if f.has("dispatcher") else None
    model_fields = {k: f.bool_(k) for k in MODEL_BOOLS if f.has(k)}
    graphs = None
    if f.has("cuda_graph_scope"):
        try:
            graphs = check_graph_scope(f.str_("cuda_graph_scope"))
        except SettingsError as exc:
            raise f.err("cuda_graph_scope", exc.detail) from None
    run = MeasuredRun(
        id=rid,
        source=source,
        model=f.str_("model"),
        cluster=f.str_("cluster"),
        tp=knobs["tp"],
        pp=knobs["pp"],
        cp=knobs["cp"],
        ep=knobs["ep"],
        etp=etp,
        vpp=knobs["vpp"],
        layout=layout or None,
        recompute=_recompute(f),
        seq_length=f.int_("seq_length"),
        global_batch_size=f.int_("global_batch_size"),
        micro_batch_size=f.int_("micro_batch_size", 1),
        precision=f.choice("precision", PRECISIONS, "bf16"),
        dispatcher=dispatcher,
        measure="" if memory_only else measures[0],
        value=value,
        flags=flags,
        peak_memory_gib=f.float_("peak_memory_gib", None, within=RANGE_MEMORY_GIB, unit="GiB"),
        peak_memory_kind=f.choice("peak_memory_kind", MEMORY_KINDS, "allocated"),
        peak_memory_rank=f.choice("peak_memory_rank", MEMORY_RANKS, "hottest"),
        notes=f.str_("notes", ""),
        origin=f.source,
        stack=f.str_("stack", DEFAULT_STACK),
        fp8_recipe=f.choice("fp8_recipe", FP8_RECIPES) if f.has("fp8_recipe") else None,
        cuda_graph_scope=graphs,
        model_fields=model_fields,
    )
    f.reject_unknown()
    return run


def _recompute(f: Fields) -> str:
    try:
        return check_recompute(f.raw("recompute", "none"))
    except HapmoeError as exc:
        raise f.err("recompute", exc.detail) from None


def _csv_rows(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8-sig")  # spreadsheets write a byte-order mark first
    except FileNotFoundError:
        raise SpecError("file not found", source=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read: {exc}", source=str(path)) from None
    reader = csv.DictReader(line for line in text.splitlines() if line.strip() and not line.startswith("#"))
    rows: list[dict[str, Any]] = []
    for raw in reader:
        row: dict[str, Any] = {}
        for k, v in raw.items():
            if k is None:
                raise SpecError("a row has more values than the header has columns", source=str(path))
            v = (v or "").strip()
            if v == "":
                continue
            row[k.strip()] = _csv_value(k.strip(), v)
        rows.append(row)
    return rows


def _csv_value(key: str, v: str) -> Any:
    if key in (*BOOL_SETTINGS, *MODEL_BOOLS):
        low = v.lower()
        if low in ("true", "yes", "1"):
            return True
        if low in ("false", "no", "0"):
            return False
        return v
    try:
        num = float(v)
    except ValueError:
        return v
    if key in (*KNOBS, "seq_length", "global_batch_size", "micro_batch_size") and math.isfinite(num):
        return int(num) if num.is_integer() else num
    return num if key in (*MEASURES, "peak_memory_gib") else v


PUBLIC = "public"  # the shipped public calibration set, bench/calibration/runs.yaml under the catalog root


def runs_path(ref: str | Path, root: Path) -> Path:
    """A runs file by path, or ``public`` for the calibration set the shipped tables were fitted to."""
    p = Path(ref)
    if str(ref) == PUBLIC and not p.exists():
        return root / "bench" / "calibration" / "runs.yaml"
    return p


def load_runs(path: str | Path) -> list[MeasuredRun]:
    p = Path(path)
    if p.suffix.lower() == ".csv":
        docs = _csv_rows(p)
        runs = [_run_from_fields(Fields(d, str(p), f"row {i + 2}")) for i, d in enumerate(docs)]
    else:
        doc = load_document(p)
        f = Fields(doc, str(p))
        items = f.list_("runs")
        f.reject_unknown(
            allowed_extra=("description", "notes", "sources", "excluded", "held_out_policy", "allocator_pairs")
        )
        runs = [_run_from_fields(Fields(d, str(p), f"runs[{i}]")) for i, d in enumerate(items)]
    if not runs:
        raise SpecError("contains no runs", source=str(p))
    seen: set[str] = set()
    for r in runs:
        if r.id in seen:
            raise SpecError(f"duplicate run id {r.id!r}", source=str(p), field="id")
        seen.add(r.id)
    return runs
