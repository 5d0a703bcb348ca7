"""What the CLI reads: the shared option aliases, the library-field -> flag table, catalog look-ups.

Values are checked once, by the library's validation layer, which names the Python argument or settings
field (``seq_length``); :func:`flags` relabels such an error with the flag the user typed (``--seq``) from
:data:`FLAGS`, so every command reports the same name for the same value.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from hapmoe_milp.errors import HapmoeError, PlanError, SettingsError
from hapmoe_milp.fileio import OutputError
from hapmoe_milp.specs.catalog import Catalog

log = logging.getLogger("hapmoe_milp")


class _State:
    catalog: Catalog = Catalog()
    verbose: int = 0


STATE = _State()

# Library name -> the flag a user types. The library names a value by its Python argument or settings field
# (``workers``, ``seq_length``); :func:`flags` relabels its errors with the flag the value came from. One
# row per name, whichever command uses it (``backend`` is --backend for both sweep and profile).
FLAGS: dict[str, str] = {
    # run settings (config.Settings fields)
    "seq_length": "--seq",
    "global_batch_size": "--gbs",
    "micro_batch_size": "--mbs",
    "precision": "--precision",
    "imbalance": "--imbalance",
    "dispatcher": "--dispatcher",
    "fp8_recipe": "--fp8-recipe",
    "overlap_ep_comm": "--ep-overlap",
    "cuda_graph_scope": "--cuda-graph-scope",
    "tp_comm_overlap": "--tp-overlap",
    "optimizer_offload": "--optimizer-offload",
    "fsdp": "--fsdp",
    "grad_reduce_in_bf16": "--grad-reduce-in-bf16",
    "fp8_param_gather": "--fp8-param-gather",
    "optimizer_state_dtype": "--optimizer-state-dtype",
    "offload_modules": "--offload-modules",
    "dropout": "--dropout",
    "fused_swiglu": "--fused-swiglu",
    "fused_rope": "--fused-rope",
    "cross_entropy_fusion": "--cross-entropy-fusion",
    "memory_headroom": "--memory-headroom",
    # one plan's layout (knobs.plan_from_knobs)
    "tp": "--tp",
    "pp": "--pp",
    "cp": "--cp",
    "ep": "--ep",
    "etp": "--etp",
    "vpp": "--vpp",
    "recompute": "--recompute",
    "layout": "--layout",
    # search, export, specs (api.solve, export.export_plan, Catalog)
    "time_limit": "--time-limit",
    "family": "--family",
    "solver": "--solver",
    "export": "--export",
    "runtime": "--runtime",
    "target": "--target",
    "out_dir": "--out",
    "model": "--model",
    "cluster": "--cluster",
    "against": "--against",
    # sweeps (sweep.cases_from_*, sweep.run_sweep, sweep.plot_sweep)
    "models": "--model",
    "clusters": "--clusters",
    "mixes": "--mix",
    "budget": "--budget",
    "prices": "--prices",
    "backend": "--backend",
    "workers": "--workers",
    "address": "--address",
    "resume": "--resume",
    "overwrite": "--overwrite",
    "out_jsonl": "--out",
    "out_png": "--plot",
    "x": "--x",
    "devices_dirs": "--devices-dir",
    # profiler (profiler.profile_device, profiler.launch_local_collectives) and calibration
    "device_name": "--device-name",
    "peak_tflops": "--peak-tflops",
    "nproc_per_node": "--nproc",
    "out": "--out",
}

# Arguments the library names as the *place* of an error (a part of an inline cluster spec is the field).
PLACES = frozenset({"cluster"})


# ---------------------------------------------------------------------- shared helpers
@contextlib.contextmanager
def flags(extra: dict[str, str] | None = None) -> Iterator[None]:
    """Relabel an error that names a library argument (``seq_length``) with its flag (``--seq``).

    The field is relabelled when the error has no file of its own (a file's fields keep their names) or is
    about an output path (whose file is that path); an argument named as the place of an error (an inline
    cluster's part: ``cluster: 8xfoo: unknown device``) is relabelled too."""
    names = {**FLAGS, **(extra or {})}
    try:
        yield
    except HapmoeError as exc:
        if exc.source in PLACES:
            raise exc.at(source=names[exc.source], field=exc.field) from None
        if exc.field in names and (exc.source is None or isinstance(exc, OutputError)):
            raise exc.at(source=exc.source, field=names[exc.field]) from None
        raise


def require(value: Any, flag: str, why: str) -> Any:
    if value is None:
        raise SettingsError(f"is required {why}", field=flag)
    return value


def catalog_model(ref: str, flag: str = "--model") -> Any:
    with flags({"model": flag}):
        return STATE.catalog.model(ref)


def catalog_cluster(ref: str, flag: str = "--cluster") -> Any:
    with flags({"cluster": flag}):
        return STATE.catalog.cluster(ref)


def plan_with_specs(plan_path: Path, model: str | None, cluster: str | None) -> tuple[Any, Any, Any]:
    """The plan file and the specs to use with it.

    The plan names its model and cluster and embeds them (format v2), so nothing else is needed. A given
    ``--model``/``--cluster`` must name the same ones (else an error says so); if its content differs from
    what the plan was solved with, the given one wins and a warning says so."""
    from hapmoe_milp.plan import load_plan
    from hapmoe_milp.specs.cluster import cluster_hash
    from hapmoe_milp.specs.model_doc import model_hash

    src = str(plan_path)
    p = load_plan(plan_path, STATE.catalog)
    m = _spec_for_plan("model", model, p.model, p.model_spec, catalog_model, model_hash, src)
    c = _spec_for_plan("cluster", cluster, p.cluster, p.cluster_spec, catalog_cluster, cluster_hash, src)
    return p, m, c


def _spec_for_plan(kind: str, given: str | None, named: str, embedded: Any, lookup: Any, digest: Any, src: str) -> Any:
    """The plan's own spec (embedded, else looked up by its name), or the one ``--model``/``--cluster``
    gives, which must carry the plan's name; a different content wins with a warning."""
    if given is None:
        return embedded if embedded is not None else lookup(named, f"{src}: {kind}")
    spec = lookup(given)
    if spec.name != named:
        raise PlanError(
            f"names {kind} {spec.name!r}, but {src} was solved for {named!r}; drop --{kind} to use the plan's own",
            field=f"--{kind}",
        )
    if embedded is not None and digest(spec) != digest(embedded):
        log.warning("--%s: %s differs from the %s %s was solved with; using --%s's", kind, spec.name, kind, src, kind)
    return spec


# ---------------------------------------------------------------------- option aliases (one help text each)
ModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="Model: catalog name, YAML path or HF config.json.")
]
ClusterOpt = Annotated[
    str | None,
    typer.Option("--cluster", "-c", help="Cluster: catalog name, YAML path or inline (8xh800+16x910b)."),
]
PlanModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="Default: the plan's own model; must name the same one.")
]
PlanClusterOpt = Annotated[
    str | None, typer.Option("--cluster", "-c", help="Default: the plan's own cluster; must name the same one.")
]
GbsOpt = Annotated[int | None, typer.Option("--gbs", help="Global batch size in samples (default: model's).")]
SeqOpt = Annotated[int | None, typer.Option("--seq", help="Sequence length in tokens (default: model's).")]
MbsOpt = Annotated[int | None, typer.Option("--mbs", help="Micro-batch size in samples (default: model's).")]
ImbalanceOpt = Annotated[
    float | None, typer.Option("--imbalance", help="Expert load-imbalance factor, >= 1.0 (1.0 = balanced).")
]
PrecisionOpt = Annotated[str | None, typer.Option("--precision", help="Compute precision: bf16 or fp8.")]
DispatcherOpt = Annotated[
    str | None, typer.Option("--dispatcher", help="MoE token dispatcher: allgather, alltoall or flex.")
]
Fp8RecipeOpt = Annotated[
    str | None,
    typer.Option("--fp8-recipe", help="FP8 scaling recipe with --precision fp8: tensorwise, blockwise or mxfp8."),
]
EpOverlapOpt = Annotated[
    bool | None,
    typer.Option(
        "--ep-overlap/--no-ep-overlap",
        help="Overlap expert-parallel dispatch/combine with computation (--overlap-moe-expert-parallel-comm).",
    ),
]
CudaGraphOpt = Annotated[
    str | None,
    typer.Option(
        "--cuda-graph-scope",
        help="CUDA graphs: none, layer (whole layers) or parts attn,mlp,moe_router,moe_preprocess,mamba.",
    ),
]
TpOverlapOpt = Annotated[
    bool | None,
    typer.Option(
        "--tp-overlap/--no-tp-overlap",
        help="Overlap tensor-parallel collectives with their GEMMs (--tp-comm-overlap; MindSpeed --use-mc2).",
    ),
]
FamilyOpt = Annotated[
    str,
    typer.Option("--family", help="Plans to search: megatron (one mesh shape), hetero (per-stage meshes) or both."),
]
TimeLimitOpt = Annotated[
    float | None,
    typer.Option("--time-limit", help="Seconds for the whole command, model building included, > 0 (default 60)."),
]
OffloadOpt = Annotated[
    str, typer.Option("--optimizer-offload", help="Optimizer states in host memory: auto (if nothing fits), on, off.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print strict JSON on stdout instead of tables.")]
# memory levers (config.Settings checks them; cost/memory.py prices them)
FsdpOpt = Annotated[
    str | None,
    typer.Option("--fsdp", help="Megatron-FSDP sharding: none, optim, optim_grads or optim_grads_params."),
]
GradBf16Opt = Annotated[
    bool | None,
    typer.Option(
        "--grad-reduce-in-bf16/--grad-reduce-in-fp32",
        help="Main grads and their data-parallel reduction in BF16 (the NeMo recipes) or FP32 (Megatron's default).",
    ),
]
Fp8ParamOpt = Annotated[
    bool | None,
    typer.Option(
        "--fp8-param-gather/--no-fp8-param-gather", help="FP8 params, gathered in FP8 (needs --precision fp8)."
    ),
]
StateDtypeOpt = Annotated[
    str | None, typer.Option("--optimizer-state-dtype", help="Adam moments: fp32 or bf16 (precision-aware).")
]
OffloadModulesOpt = Annotated[
    str | None, typer.Option("--offload-modules", help="Fine-grained activation offload, comma-separated modules.")
]
DropoutOpt = Annotated[bool | None, typer.Option("--dropout/--no-dropout", help="Hidden/attention dropout 0.1.")]
FusedSwigluOpt = Annotated[
    bool | None,
    typer.Option("--fused-swiglu/--no-fused-swiglu", help="SwiGLU as one fused kernel (default) or element-wise ops."),
]
FusedRopeOpt = Annotated[
    bool | None,
    typer.Option(
        "--fused-rope/--no-fused-rope", help="Rotary embedding as one fused kernel (default) or element-wise."
    ),
]
CeFusionOpt = Annotated[
    bool | None,
    typer.Option(
        "--cross-entropy-fusion/--no-cross-entropy-fusion",
        help="Fused vocab-parallel cross-entropy (Megatron's default is unfused, on FP32 logits).",
    ),
]
HeadroomOpt = Annotated[
    float | None, typer.Option("--memory-headroom", help="Share of device memory kept free (default 0.0).")
]
TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target", help="Runtime: megatron, rocm, mindspeed or flagscale (default: the runtime the plan names)."
    ),
]
RuntimeOpt = Annotated[
    str,
    typer.Option(
        "--runtime",
        help="auto (every runtime that runs the cluster's vendors; the plan names its own), megatron, rocm, "
        "mindspeed, flagscale, or any (the what-if space: plans no single runtime is known to run).",
    ),
]


def settings_kw(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}
