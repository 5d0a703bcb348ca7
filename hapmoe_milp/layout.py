"""Megatron's ``--pipeline-model-parallel-layout`` grammar, parsed and written without Megatron.

Rules (Megatron-Core ``PipelineParallelLayerLayout``, reference/megatron.md §1.5): commas are ignored;
``(...)*n`` repeats a group (no nesting); ``x*n`` repeats one character; ``|`` separates virtual
stages; ``E`` embedding, ``t`` decoder layer, ``m`` MTP layer, ``L`` loss. Virtual stage ``i`` runs on
pipeline rank ``i mod PP``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hapmoe_milp.errors import PlanError

_GROUP = re.compile(r"\(([^()]+)\)\*(\d+)")
_CHAR = re.compile(r"(.)\*(\d+)")


@dataclass(frozen=True)
class Layout:
    stages: tuple[str, ...]  # one string of E/t/m/L per virtual stage
    pp: int

    @property
    def vpp(self) -> int:
        return len(self.stages) // self.pp

    def decoder_layers_per_rank(self) -> list[int]:
        """t + m layers held by each pipeline rank (all of its virtual stages)."""
        out = [0] * self.pp
        for i, st in enumerate(self.stages):
            out[i % self.pp] += st.count("t") + st.count("m")
        return out

    def layers_per_virtual_stage(self) -> list[int]:
        return [st.count("t") + st.count("m") for st in self.stages]


def expand(text: str) -> str:
    s = text.replace(",", "").replace(" ", "")
    s = _GROUP.sub(lambda m: m.group(1) * int(m.group(2)), s)
    if "(" in s or ")" in s:
        raise PlanError(f"layout {text!r}: unbalanced or nested parentheses", field="--layout")
    return _CHAR.sub(lambda m: m.group(1) * int(m.group(2)), s)


def parse_layout(text: str, pp: int, num_layers: int, mtp_layers: int = 0) -> Layout:
    flat = expand(text)
    bad = set(flat) - set("Etm|L")
    if bad:
        raise PlanError(f"layout {text!r}: unknown character {sorted(bad)[0]!r} (use E, t, m, L, |)", field="--layout")
    stages = tuple(flat.split("|"))
    if pp < 1 or len(stages) % pp:
        raise PlanError(f"layout {text!r} has {len(stages)} stages, not a multiple of pp={pp}", field="--layout")
    joined = "".join(stages)
    if joined.count("E") != 1 or not stages[0].startswith("E"):
        raise PlanError(f"layout {text!r}: exactly one E, at the start of the first stage", field="--layout")
    if joined.count("L") != 1 or not stages[-1].endswith("L"):
        raise PlanError(f"layout {text!r}: exactly one L, at the end of the last stage", field="--layout")
    if joined.count("t") != num_layers:
        raise PlanError(
            f"layout {text!r} places {joined.count('t')} decoder layers, the model has {num_layers}", field="--layout"
        )
    if joined.count("m") != mtp_layers:
        raise PlanError(
            f"layout {text!r} places {joined.count('m')} MTP layers, model has {mtp_layers}", field="--layout"
        )
    if "m" in joined and joined.rfind("t") > joined.find("m"):
        raise PlanError(f"layout {text!r}: MTP layers must come after every decoder layer", field="--layout")
    return Layout(stages, pp)


def format_layout(per_stage: list[list[str]]) -> str:
    """Compact string from per-virtual-stage lists of E/t/m/L, using ``t*n`` runs."""
    parts = []
    for st in per_stage:
        out = ""
        i = 0
        while i < len(st):
            j = i
            while j < len(st) and st[j] == st[i]:
                j += 1
            run = j - i
            out += st[i] + (f"*{run}" if run > 2 else st[i] * (run - 1))
            i = j
        parts.append(out)
    return "|".join(parts)
