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
from hapmoe_milp.specs.catalog import Catalog

log = logging.getLogger("hapmoe_milp")


class _State:
    catalog: Catalog = Catalog()
    verbose: int = 0


STATE = _State()

# Library field name -> the flag a user types; errors from the validation layer are relabelled with it.
FLAGS: dict[str, str] = {
    "seq_length": "--seq",
    "global_batch_size": "--gbs",
    "micro_batch_size": "--mbs",
    "precision": "--precision",
    "imbalance": "--imbalance",
    "dispatcher": "--dispatcher",
    "optimizer_offload": "--optimizer-offload",
    "tp": "--tp",
    "pp": "--pp",
    "cp": "--cp",
    "ep": "--ep",
    "etp": "--etp",
    "vpp": "--vpp",
    "recompute": "--recompute",
    "layout": "--layout",
    "time_limit": "--time-limit",
    "family": "--family",
    "solver": "--solver",
    "export": "--export",
    "runtime": "--runtime",
    "target": "--target",
    "model": "--model",
    "cluster": "--cluster",
    "x": "--x",
}


# ---------------------------------------------------------------------- shared helpers
@contextlib.contextmanager
def flags(extra: dict[str, str] | None = None) -> Iterator[None]:
    """Relabel a validation error that names a library field (``seq_length``) with its flag (``--seq``)."""
    names = {**FLAGS, **(extra or {})}
    try:
        yield
    except HapmoeError as exc:
        if exc.source is None and exc.field in names:
            raise exc.at(field=names[exc.field]) from None
        raise


def require(value: Any, flag: str, why: str) -> Any:
    if value is None:
        raise SettingsError(f"is required {why}", field=flag)
    return value


def catalog_model(ref: str, flag: str = "--model") -> Any:
    with flags({"model": flag, "--model": flag}):
        return STATE.catalog.model(ref)


def catalog_cluster(ref: str, flag: str = "--cluster") -> Any:
    with flags({"cluster": flag, "--cluster": flag}):
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
    if model is None:
        m = p.model_spec if p.model_spec is not None else catalog_model(p.model, f"{src}: model")
    else:
        m = catalog_model(model)
        if m.name != p.model:
            raise PlanError(
                f"names model {m.name!r}, but {src} was solved for {p.model!r}; drop --model to use the plan's own",
                field="--model",
            )
        if p.model_spec is not None and model_hash(m) != model_hash(p.model_spec):
            log.warning("--model: %s differs from the spec %s was solved with; using --model's", m.name, src)
    if cluster is None:
        c = p.cluster_spec if p.cluster_spec is not None else catalog_cluster(p.cluster, f"{src}: cluster")
    else:
        c = catalog_cluster(cluster)
        if c.name != p.cluster:
            raise PlanError(
                f"names cluster {c.name!r}, but {src} was solved for {p.cluster!r}; drop --cluster to use the "
                "plan's own",
                field="--cluster",
            )
        if p.cluster_spec is not None and cluster_hash(c) != cluster_hash(p.cluster_spec):
            log.warning("--cluster: %s differs from the cluster %s was solved for; using --cluster's", c.name, src)
    return p, m, c


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
FamilyOpt = Annotated[
    str,
    typer.Option("--family", help="Plans to search: megatron (one mesh shape), hetero (per-stage meshes) or both."),
]
TimeLimitOpt = Annotated[
    float | None, typer.Option("--time-limit", help="Search time limit in seconds, > 0 (default 60).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print strict JSON on stdout instead of tables.")]
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
