"""Deployable output: a validated plan written as the launch files of the runtime that runs it
(Megatron-LM, its ROCm fork, MindSpeed-LLM, or FlagScale; :mod:`hapmoe_milp.runtimes`).

The validators live in ``hapmoe_milp.export.validate`` (``validate``, ``check``); the function is not
re-exported here so that the name keeps meaning the module.

``export_plan`` validates first (``validate.check``) and writes nothing for an invalid plan, so a
directory of exported files always describes a plan both our rules and the target framework accept.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from hapmoe_milp.config import Settings
from hapmoe_milp.errors import ExportError, SpecError
from hapmoe_milp.export import flagscale as _fs
from hapmoe_milp.export import megatron as _mg
from hapmoe_milp.export import mindspeed as _ms
from hapmoe_milp.export import rocm as _rocm
from hapmoe_milp.export.common import GENERATED_MARK, TARGETS, RecomputeNote, Target, nearest_expressible_recompute
from hapmoe_milp.export.flagscale import flagscale_config, flagscale_hostfile, flagscale_yaml
from hapmoe_milp.export.megatron import (
    hostfile,
    launch_scripts,
    megatron_args,
    parse_megatron_args,
    plan_from_megatron_args,
)
from hapmoe_milp.export.validate import Violation, check, warnings_for
from hapmoe_milp.fileio import write_files_atomic
from hapmoe_milp.plan import Plan
from hapmoe_milp.specs._fields import check_name
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

log = logging.getLogger(__name__)

__all__ = [
    "TARGETS",
    "RecomputeNote",
    "Target",
    "Violation",
    "check",
    "check_names",
    "export_files",
    "export_plan",
    "flagscale_config",
    "flagscale_hostfile",
    "flagscale_yaml",
    "hostfile",
    "launch_scripts",
    "megatron_args",
    "nearest_expressible_recompute",
    "parse_megatron_args",
    "plan_from_megatron_args",
]


def _stale_scripts(out: Path) -> list[Path]:
    """Launch scripts a previous export wrote (a plan with fewer nodes would leave them behind)."""
    stale = []
    for p in sorted(out.glob("launch_node*.sh")) if out.is_dir() else []:
        try:
            if GENERATED_MARK in p.read_text(encoding="utf-8", errors="replace"):
                stale.append(p)
        except OSError as exc:
            raise ExportError(f"cannot read {p.name}: {exc.strerror or exc}", source=str(out)) from None
    return stale


def check_names(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> None:
    """Every name that reaches a generated file is a safe name (the loaders check them; a plan built in
    Python could still carry anything)."""
    for fld, name in (("model", plan.model), ("cluster", plan.cluster), ("model", model.name)):
        try:
            check_name(name, None, fld)
        except SpecError as exc:
            raise ExportError(exc.detail, field=fld) from None
    for i, st in enumerate(plan.stages):
        try:
            check_name(st.device, None, f"stages[{i}].device")
        except SpecError as exc:
            raise ExportError(exc.detail, field=f"stages[{i}].device") from None
    for did in cluster.device_types:
        try:
            check_name(did, None, "cluster.groups.device")
        except SpecError as exc:
            raise ExportError(exc.detail, field="cluster.groups.device") from None


def export_files(
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    target: Target,
    out_dir: str | Path = ".",
    source: str = "plan",
) -> dict[str, str]:
    """The files of an export, name -> text, after validating ``plan`` for ``target`` (nothing is written)."""
    if target not in TARGETS:
        raise ExportError(f"unknown target {target!r} (expected {', '.join(TARGETS)})", field="target")
    check_names(plan, model, cluster)
    check(plan, model, cluster, target, source=source)
    for w in warnings_for(plan, model, cluster, target):
        log.warning("%s: %s", source, w)
    full = plan.with_specs(model, cluster)
    if full.runtime is None:
        full = full.with_runtime(target)  # validated for it just now
    files: dict[str, str] = {"plan.json": full.to_json() + "\n"}
    if target == "megatron":
        args = megatron_args(plan, model, cluster)
        files |= _launch_files(plan, model, cluster, args, _mg.ARGS_FILE, _mg.MEGATRON_FLAVOR, _mg.readme)
    elif target == "rocm":
        args = _rocm.rocm_args(plan, model, cluster)
        files |= _launch_files(plan, model, cluster, args, _rocm.ARGS_FILE, _rocm.ROCM_FLAVOR, _mg.readme)
    elif target == "mindspeed":
        args = _ms.mindspeed_args(plan, model, cluster)
        files |= _launch_files(plan, model, cluster, args, _ms.ARGS_FILE, _ms.MINDSPEED_FLAVOR, _ms.readme)
    else:
        files[_fs.CONFIG_FILE] = flagscale_yaml(plan, model, cluster)
        files[_fs.EXPERIMENT_FILE] = _fs.experiment_yaml(
            plan, cluster, os.fspath(Path(out_dir).absolute() / "hostfile")
        )
        files["hostfile"] = flagscale_hostfile(plan, cluster)
        files["README.txt"] = _fs.readme(plan, model, cluster)
    return files


def _launch_files(
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    args: list[str],
    args_file: str,
    flavor: _mg.Flavor,
    readme: Callable[[Plan, ModelSpec, ClusterSpec, list[str]], str],
) -> dict[str, str]:
    """What every Megatron-style target launches with: its flags file, a hostfile, one torchrun script per
    launch unit (in the runtime's ``flavor``) and a README; the targets differ in their flags and README."""
    return {
        args_file: _mg.format_args_file(args),
        "hostfile": hostfile(plan, cluster),
        **launch_scripts(plan, cluster, model, flavor=flavor),
        "README.txt": readme(plan, model, cluster, args),
    }


def export_plan(
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    target: Target,
    out_dir: str | Path,
    *,
    settings: Settings | None = None,
    source: str = "plan",
) -> list[Path]:
    """Validate ``plan`` for ``target`` and write its launch files into ``out_dir``; returns the paths.

    megatron, rocm: plan.json, megatron_args.txt, hostfile, launch_node<k>.sh, README.txt.
    mindspeed: plan.json, mindspeed_args.txt, hostfile, launch_node<k>.sh, README.txt.
    flagscale: plan.json, flagscale.yaml, experiment.yaml, hostfile, README.txt.
    The plan is exported under the settings it carries (``settings`` replaces them, batch fields aside).
    Raises PlanError / ExportError naming the first failing rule; nothing is written then. Files are
    written all or nothing (``fileio.write_files_atomic``): a failure leaves a previous export intact.
    """
    if settings is not None:
        plan = plan.with_settings(plan.settings(settings))
    out = Path(out_dir)
    files = export_files(plan, model, cluster, target, out, source)
    scripts = [n for n in files if n.startswith("launch_node")]
    stale = _stale_scripts(out) if target != "flagscale" else []
    written = write_files_atomic(out, files, executable=scripts, remove=stale, field="out_dir")
    log.info("exported %s plan for %s to %s (%d files)", target, plan.model, os.fspath(out), len(written))
    return written
