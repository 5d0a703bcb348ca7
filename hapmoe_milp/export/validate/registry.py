"""The rule registry every validator module registers into: violations, the context rules read, tiers.

A rule is a function of a :class:`Context` that yields :class:`Violation` s; ``@rule(...)`` registers it
under its function name for the runtimes (export targets) it applies to, with a kind (``plan``: no
runtime can run the plan; ``export``: the chosen runtime cannot), a tier and a severity. The driver
(:func:`run`) stamps the registered name, kind and severity on what a rule yields, so a rule states
only where and what (:func:`violation`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from hapmoe_milp.config import Settings
from hapmoe_milp.export.common import TARGETS, Target
from hapmoe_milp.plan import Plan
from hapmoe_milp.runtimes import RUNTIMES, Runtime
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

Kind = Literal["plan", "export"]
Tier = Literal["structure", "plan", "invariants", "artifact"]
Severity = Literal["error", "warning"]

#: the runtimes that run one mesh shape for every stage (Megatron-LM and its derivatives)
ONE_MESH: tuple[Target, ...] = tuple(t for t in TARGETS if RUNTIMES[t].family == "megatron")
#: the runtimes that take Megatron-LM's own command line (``pretrain_gpt.py`` arguments)
MEGATRON_ARGS: tuple[Target, ...] = ("megatron", "rocm")


@dataclass(frozen=True)
class Violation:
    """One broken rule. ``severity="warning"`` marks a plan that runs but not as planned (it does not
    fail ``check`` or ``validate``'s exit status; the CLI prints it)."""

    rule: str
    field: str
    message: str
    kind: Kind = "export"
    severity: Severity = "error"

    def __str__(self) -> str:
        return f"{self.field}: {self.message} [{self.rule}]"


@dataclass(frozen=True)
class Context:
    plan: Plan
    model: ModelSpec
    cluster: ClusterSpec
    target: Target
    settings: Settings
    args: dict[str, Any] | None = None  # parsed Megatron / MindSpeed-LLM arguments
    fs: dict[str, Any] | None = None  # FlagScale config

    @property
    def world(self) -> int:
        return self.plan.devices_used

    @property
    def runtime(self) -> Runtime:
        return RUNTIMES[self.target]

    def parsed_args(self) -> dict[str, Any]:
        """The parsed command line (artifact rules of the Megatron-style runtimes run only with it)."""
        assert self.args is not None
        return self.args

    def hetero(self) -> dict[str, Any]:
        """FlagScale's ``system.hetero`` block (artifact rules of FlagScale run only with a config)."""
        assert self.fs is not None
        return dict(self.fs.get("system", {}).get("hetero", {}))


RuleFn = Callable[[Context], Iterable[Violation]]


@dataclass(frozen=True)
class Rule:
    name: str
    fn: RuleFn
    targets: tuple[Target, ...]
    kind: Kind
    tier: Tier
    severity: Severity = "error"


RULES: list[Rule] = []


def rule(
    *targets: Target, kind: Kind = "export", tier: Tier = "plan", severity: Severity = "error"
) -> Callable[[RuleFn], RuleFn]:
    """Register a rule for ``targets`` (all runtimes when none are named)."""

    def deco(fn: RuleFn) -> RuleFn:
        RULES.append(Rule(fn.__name__, fn, targets or TARGETS, kind, tier, severity))
        return fn

    return deco


def violation(fld: str, msg: str) -> Violation:
    """A violation at ``fld``; :func:`run` stamps the registered rule's name, kind and severity on it."""
    return Violation(rule="", field=fld, message=msg)


def run(rules: Iterable[Rule], ctx: Context) -> list[Violation]:
    out: list[Violation] = []
    for r in rules:
        for v in r.fn(ctx):
            out.append(Violation(rule=r.name, field=v.field, message=v.message, kind=r.kind, severity=r.severity))
    return out
