"""Export validators: one function per Megatron-LM / FlagScale / MindSpeed-LLM rule, named after the rule
it mirrors, registered per runtime (export target) in :mod:`~hapmoe_milp.export.validate.registry`.

Rooms: ``common_rules`` (structure, Megatron's per-mesh rules every runtime inherits), ``runtime_rules``
(what a :class:`~hapmoe_milp.runtimes.Runtime` declares -- vendors, VPP, CP, recompute, the rules between
stages -- read from the same declaration the search filters with), ``megatron_rules`` (one-mesh runtimes
and Megatron-LM's argument checks), ``flagscale_rules``, ``mindspeed_rules``.

Three tiers, run in order:

* structural rules (layers contiguous and complete, known device types, inventory): when one fails the
  rest would only report consequences, so validation stops there;
* plan rules (Megatron's per-mesh divisibility rules, node-locality, batch arithmetic, and each runtime's
  own restrictions);
* artifact rules, run on the exported arguments / config (generated, or handed in by the caller to
  check an edited file): what the runtime's argument parsing would fail on.

Between the plan and artifact tiers, ``rule_plan_invariants`` runs everything ``plan.check_plan`` checks
(what ``estimate`` runs) when no named rule fired, so a plan valid for any target is one ``estimate``
accepts. Rules with ``severity="warning"`` flag a plan that runs, but not as planned; they never fail
``check``.

``validate`` returns every violation; ``check`` raises on the first error (PlanError for a plan that no
target can run, ExportError for one the chosen target cannot express).
"""

from __future__ import annotations

import logging
from typing import Any

from hapmoe_milp.config import Settings
from hapmoe_milp.errors import ExportError, PlanError
from hapmoe_milp.export import artifacts
from hapmoe_milp.export.common import TARGETS, Target
from hapmoe_milp.export.validate import common_rules, flagscale_rules, megatron_rules, mindspeed_rules, runtime_rules
from hapmoe_milp.export.validate.registry import RULES, Context, Rule, Violation, run
from hapmoe_milp.plan import Plan
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

log = logging.getLogger(__name__)

# the rule modules register on import
RULE_MODULES = (common_rules, runtime_rules, megatron_rules, flagscale_rules, mindspeed_rules)


def _artifact_context(
    ctx: Context, args: list[str] | str | None, fs_config: dict[str, Any] | None, settings: Settings | None
) -> Context:
    """The context with the target's artifact (the given one, or what the exporter writes) parsed."""
    p, m, c, t = ctx.plan, ctx.model, ctx.cluster, ctx.target
    if t == "flagscale":
        fs = fs_config if fs_config is not None else artifacts.flagscale_config(p, m, c, settings)
        return Context(p, m, c, t, ctx.settings, fs=fs)
    parse = artifacts.parse_args_of(t)
    raw = args if args is not None else artifacts.command_line(p, m, c, t, settings)
    return Context(p, m, c, t, ctx.settings, args=parse(raw))


def validate(
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    target: Target,
    *,
    settings: Settings | None = None,
    args: list[str] | str | None = None,
    fs_config: dict[str, Any] | None = None,
) -> list[Violation]:
    """Every rule violation of ``plan`` for ``target`` (a runtime name). ``args`` / ``fs_config`` check a
    given (e.g. hand-edited) artifact instead of the one the exporter would write."""
    if target not in TARGETS:
        raise ExportError(f"unknown target {target!r} (expected {', '.join(TARGETS)})", field="target")
    st = plan.settings(settings)
    ctx = Context(plan, model, cluster, target, st)
    mine = [r for r in RULES if target in r.targets]
    out = run((r for r in mine if r.tier == "structure"), ctx)
    if out:
        return out
    out = run((r for r in mine if r.tier == "plan"), ctx)
    if not any(v.severity == "error" for v in out):
        out += run((r for r in mine if r.tier == "invariants"), ctx)
    try:
        actx = _artifact_context(ctx, args, fs_config, settings)
    except ExportError as exc:
        if not any(v.severity == "error" for v in out):
            out.append(Violation("rule_exportable", "plan", exc.detail, "export"))
    else:
        out += run((r for r in mine if r.tier == "artifact"), actx)
    for v in out:
        log.debug("%s", v)
    return out


def check(
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSpec,
    target: Target,
    *,
    settings: Settings | None = None,
    source: str = "plan",
) -> None:
    """Raise on the first error: PlanError for rules any target shares, ExportError for target rules.
    Warnings do not raise (``warnings_for`` lists them)."""
    found = [v for v in validate(plan, model, cluster, target, settings=settings) if v.severity == "error"]
    if not found:
        return
    v = found[0]
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    msg = f"[{v.rule}] {v.message}{more}"
    if v.kind == "plan":
        raise PlanError(msg, source=source, field=v.field)
    raise ExportError(f"{target}: {msg}", source=source, field=v.field)


def warnings_for(
    plan: Plan, model: ModelSpec, cluster: ClusterSpec, target: Target, *, settings: Settings | None = None
) -> list[Violation]:
    """The warning-level violations of ``plan`` for ``target`` (a plan that runs, but not as planned)."""
    return [v for v in validate(plan, model, cluster, target, settings=settings) if v.severity == "warning"]


def rule_names(target: Target | None = None) -> list[str]:
    return [r.name for r in RULES if target is None or target in r.targets]


__all__ = ["RULES", "Context", "Rule", "Violation", "check", "rule_names", "validate", "warnings_for"]
