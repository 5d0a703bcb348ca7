"""Megatron's pipeline layout grammar (``--pipeline-model-parallel-layout``), on its own.

A layout string such as ``Et*3|(tt|)*29m|L`` lists every virtual pipeline stage's layers: ``E`` embedding,
``t`` decoder layer, ``m`` MTP layer, ``L`` loss; ``|`` separates virtual stages, ``x*n`` and ``(...)*n``
repeat. The grammar is read in two places -- ``estimate --layout`` builds a plan from it (``knobs.py``) and
the Megatron exporter and its validator write and check it -- so it sits here, below both, and depends on
nothing else in the package. Mirrors Megatron-Core's ``PipelineParallelLayerLayout``
(reference/megatron.md §1.5).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StageLayers:
    """Decoder and MTP layers of one pipeline rank or one of its virtual chunks."""

    decoder: int
    mtp: int

    @property
    def total(self) -> int:
        return self.decoder + self.mtp


LAYOUT_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}
_PAREN_RE = re.compile(r"\(([^)]+)\)\*(\d+)")
_CHAR_RE = re.compile(r"(.)\*(\d+)")
MAX_LAYOUT_EXPANSION = 1_000_000  # characters a layout may expand to (checked before expanding)


def parse_layout(layout: str) -> list[str]:
    """Megatron's ``PipelineParallelLayerLayout.parse_str_to_list``: one string of layer chars per virtual
    stage. Commas are dropped, ``(...)*n`` then ``x*n`` are expanded (no nesting), ``|`` separates stages.
    Raises ValueError on characters other than E, L, t, m (Megatron asserts)."""
    text = layout.replace(",", "")
    if len(text) > MAX_LAYOUT_EXPANSION:
        raise ValueError(f"is longer than {MAX_LAYOUT_EXPANSION:,} characters")

    def expand(rx: re.Pattern[str], s: str) -> str:
        # the size of the whole result is checked before anything is built: many repeats that are each
        # small can still add up to gigabytes (and the second pass multiplies the first)
        size = len(s)
        for mt in rx.finditer(s):
            n = int(mt.group(2)) if len(mt.group(2)) <= 7 else MAX_LAYOUT_EXPANSION + 1
            size += n * len(mt.group(1)) - len(mt.group(0))
            if size > MAX_LAYOUT_EXPANSION:
                raise ValueError(f"expands to more than {MAX_LAYOUT_EXPANSION:,} characters (at {mt.group(0)[:40]!r})")
        return rx.sub(lambda mt: mt.group(1) * int(mt.group(2)), s)

    text = expand(_CHAR_RE, expand(_PAREN_RE, text))
    stages = text.split("|")
    for stage in stages:
        for ch in stage:
            if ch not in LAYOUT_CHARS:
                raise ValueError(f"invalid layer character {ch!r} in stage {stage!r} (known: E, L, t, m)")
    return stages


def layout_grid(stages: Sequence[str], pp: int) -> list[list[str]]:
    """``[pp_rank][vpp_rank]`` from the flat stage list: virtual stage i goes to rank ``i % pp``."""
    vpp = len(stages) // pp
    return [[stages[v * pp + r] for v in range(vpp)] for r in range(pp)]


def layout_problems(layout: str, pp: int, num_layers: int, mtp_num_layers: int) -> list[str]:
    """Everything ``PipelineParallelLayerLayout.__init__`` + ``validate_layer_layout`` would assert."""
    try:
        stages = parse_layout(layout)
    except ValueError as exc:
        return [str(exc)]
    out: list[str] = []
    if len(stages) % pp:
        return [f"{len(stages)} virtual stages are not divisible by pipeline size {pp}"]
    flat = "".join(stages)
    if not flat.startswith("E"):
        out.append("the first layer must be the embedding 'E'")
    if not flat.endswith("L"):
        out.append("the last layer must be the loss 'L'")
    if flat.count("E") != 1:
        out.append(f"embedding 'E' must appear exactly once, found {flat.count('E')}")
    if flat.count("L") != 1:
        out.append(f"loss 'L' must appear exactly once, found {flat.count('L')}")
    if flat.count("t") != num_layers:
        out.append(f"{flat.count('t')} decoder layers 't', the model has num_layers {num_layers}")
    if flat.count("m") != mtp_num_layers:
        out.append(f"{flat.count('m')} MTP layers 'm', the model has mtp_num_layers {mtp_num_layers}")
    if "m" in flat and "t" in flat[flat.index("m") :]:
        out.append("decoder layers must be placed before MTP layers")
    grid = layout_grid(stages, pp)
    for r, row in enumerate(grid):
        if any("m" in chunk for chunk in row[:-1]):
            out.append(f"MTP layers on pp rank {r} must be in its last virtual stage")
        if "m" in row[-1] and row[-1].count("m") != mtp_num_layers:
            out.append("all MTP layers must be in one virtual stage")
    return out


def compress_layout(stages: Sequence[str]) -> str:
    """A short layout string: ``t*n`` inside a stage, ``(s|)*k s`` for runs of identical stages."""

    def stage_str(s: str) -> str:
        return re.sub(r"(t{3,}|m{3,})", lambda mt: f"{mt.group(0)[0]}*{len(mt.group(0))}", s)

    pieces: list[str] = []
    i = 0
    while i < len(stages):
        j = i
        while j + 1 < len(stages) and stages[j + 1] == stages[i]:
            j += 1
        k = j - i + 1
        s = stage_str(stages[i])
        pieces.append(s if k == 1 else f"({s}|)*{k - 1}{s}")
        i = j + 1
    return "|".join(pieces)


def layout_rank_layers(layout: str, pp: int) -> list[StageLayers]:
    """Decoder and MTP layers per pipeline rank (all virtual chunks together)."""
    grid = layout_grid(parse_layout(layout), pp)
    return [StageLayers(decoder=sum(c.count("t") for c in row), mtp=sum(c.count("m") for c in row)) for row in grid]


def layout_chunks(layout: str, pp: int) -> list[list[StageLayers]]:
    grid = layout_grid(parse_layout(layout), pp)
    return [[StageLayers(decoder=c.count("t"), mtp=c.count("m")) for c in row] for row in grid]


__all__ = [
    "LAYOUT_CHARS",
    "MAX_LAYOUT_EXPANSION",
    "StageLayers",
    "compress_layout",
    "layout_chunks",
    "layout_grid",
    "layout_problems",
    "layout_rank_layers",
    "parse_layout",
]
