"""Deployable output: a validated plan written as Megatron-LM or FlagScale launch files.

The validators live in ``hapmoe_milp.export.validate`` (``validate``, ``check``); the function is not
re-exported here so that the name keeps meaning the module.

``export_plan`` validates first (``validate.check``) and writes nothing for an invalid plan, so a
directory of exported files always describes a plan both our rules and the target framework accept.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from hapmoe_milp.config import Settings
from hapmoe_milp.errors import ExportError
from hapmoe_milp.export import flagscale as _fs
from hapmoe_milp.export import megatron as _mg
from hapmoe_milp.export.common import GENERATED_MARK, TARGETS, RecomputeNote, Target, nearest_expressible_recompute
from hapmoe_milp.export.flagscale import flagscale_config, flagscale_hostfile, flagscale_yaml
from hapmoe_milp.export.megatron import (
    hostfile,
    launch_scripts,
    megatron_args,
    parse_megatron_args,
    plan_from_megatron_args,
)
from hapmoe_milp.export.validate import Violation, check
from hapmoe_milp.plan import Plan
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

log = logging.getLogger(__name__)

__all__ = [
    "TARGETS",
    "RecomputeNote",
    "Target",
    "Violation",
    "check",
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


def _remove_stale_scripts(out: Path) -> None:
    """Drop launch scripts a previous export wrote (a plan with fewer nodes would leave them behind)."""
    for p in out.glob("launch_node*.sh"):
        try:
            if GENERATED_MARK in p.read_text(encoding="utf-8", errors="replace"):
                p.unlink()
        except OSError as exc:
            raise ExportError(f"cannot remove stale {p.name}: {exc}", source=str(out)) from None


def export_plan(
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    target: Target,
    out_dir: str | Path,
    *,
    settings: Settings | None = None,
) -> list[Path]:
    """Validate ``plan`` for ``target`` and write its launch files into ``out_dir``; returns the paths.

    megatron: plan.json, megatron_args.txt, hostfile, launch_node<k>.sh, README.txt.
    flagscale: plan.json, flagscale.yaml, hostfile, README.txt.
    Raises PlanError / ExportError naming the first failing rule; nothing is written then.
    """
    if target not in TARGETS:
        raise ExportError(f"unknown target {target!r} (expected {' or '.join(TARGETS)})", field="--target")
    check(plan, model, cluster, target, settings=settings)
    files: dict[str, str] = {"plan.json": plan.to_json() + "\n"}
    if target == "megatron":
        args = megatron_args(plan, model, cluster, settings)
        files[_mg.ARGS_FILE] = _mg.format_args_file(args)
        files["hostfile"] = hostfile(plan, cluster)
        scripts = launch_scripts(plan, cluster, model, settings)
        files.update(scripts)
        files["README.txt"] = _mg.readme(plan, model, cluster, args)
    else:
        files[_fs.CONFIG_FILE] = flagscale_yaml(plan, model, cluster, settings)
        files["hostfile"] = flagscale_hostfile(plan, cluster)
        files["README.txt"] = _fs.readme(plan, model, cluster)
        scripts = {}
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create the output directory: {exc}", source=str(out)) from None
    if target == "megatron":
        _remove_stale_scripts(out)
    written: list[Path] = []
    for name, text in files.items():
        p = out / name
        try:
            p.write_text(text, encoding="utf-8")
            if name in scripts:
                p.chmod(p.stat().st_mode | 0o111)
        except OSError as exc:
            raise ExportError(f"cannot write {name}: {exc}", source=str(out)) from None
        written.append(p)
    log.info("exported %s plan for %s to %s (%d files)", target, plan.model, os.fspath(out), len(written))
    return written
