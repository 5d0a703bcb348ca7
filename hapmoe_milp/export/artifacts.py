"""Each runtime's launch artifact, the one the validators check: a command line for the Megatron-style
runtimes (Megatron-LM, its ROCm fork, MindSpeed-LLM) and FlagScale's train config."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hapmoe_milp.config import Settings
from hapmoe_milp.export.flagscale import flagscale_config
from hapmoe_milp.export.megatron import megatron_args, parse_megatron_args
from hapmoe_milp.export.mindspeed import mindspeed_args, parse_mindspeed_args
from hapmoe_milp.export.rocm import rocm_args
from hapmoe_milp.plan import Plan
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

_ARGS: dict[str, Callable[[Plan, ModelSpec, ClusterSpec, Settings | None], list[str]]] = {
    "megatron": megatron_args,
    "rocm": rocm_args,
    "mindspeed": mindspeed_args,
}
_PARSE: dict[str, Callable[[Sequence[str] | str], dict[str, Any]]] = {
    "megatron": parse_megatron_args,
    "rocm": parse_megatron_args,
    "mindspeed": parse_mindspeed_args,
}


def command_line(
    plan: Plan, model: ModelSpec, cluster: ClusterSpec, target: str, settings: Settings | None
) -> list[str]:
    return _ARGS[target](plan, model, cluster, settings)


def parse_args_of(target: str) -> Callable[[Sequence[str] | str], dict[str, Any]]:
    return _PARSE[target]


__all__ = ["command_line", "flagscale_config", "parse_args_of"]
