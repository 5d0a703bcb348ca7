"""Attention-core time by the span each layer attends and the key length its kernel loops over.

Causal attention: each query sees S/2 keys on average; :meth:`ModelSpec.attention_span` says how many fewer
under a sliding window or chunked attention. A windowed (chunked) layer does the work of its span *and runs
like a W- (C-) token attention*: each query block meets at most a tile or two of keys, so the kernel's
efficiency is the one the device's table gives at that length, not at S -- the prologue, softmax rescaling
and epilogue are not amortised over a long key loop. That is what makes alternating 128-token windows
(GPT-OSS) cost more than their FLOPs at long-sequence efficiency suggest.

Context parallelism prices the same way. Megatron's ring attention (Transformer Engine's p2p context
parallel) keeps S/CP queries on each rank and, at each of the CP ring steps, calls the flash-attention
kernel on the local queries against one S/CP block of keys and values (half a block on the steps where
the load-balanced split halves it). The work summed over the steps is the layer's, but no kernel call
loops over more than S/CP keys, so it runs at the table's efficiency at S/CP at best; it is read there.
"""

from __future__ import annotations

from collections import Counter

from hapmoe_milp.cost.primitives import attention_time
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.model import ModelSpec


def kernel_length(m: ModelSpec, layer: int, seq: int) -> int:
    """Key length the attention kernel of ``layer`` loops over: the window, the chunk, or the sequence (the
    same conditions as :meth:`ModelSpec.attention_span`)."""
    w, c = m.window_size, m.attention_chunk_size
    if w and w < seq and not (m.window_attn_skip_freq and (layer + 1) % m.window_attn_skip_freq == 0):
        return w
    if c and c < seq and not (m.no_rope_freq and (layer + 1) % m.no_rope_freq == 0):
        return c
    return seq


def layer_groups(m: ModelSpec, seq: int) -> tuple[tuple[tuple[int, int], int], ...]:
    """The model's attention layers grouped by (span, kernel length), with their counts: a property of the
    model and sequence alone, so a cost model computes it once (a 94-layer model prices ~30,000 options)."""
    layers = [i for i, mx in enumerate(m.mixer_pattern) if mx == "attention"] or [0]
    groups = Counter((m.attention_span(i, seq), kernel_length(m, i, seq)) for i in layers)
    return tuple(sorted(groups.items()))


def core_time(
    m: ModelSpec,
    dev: DeviceSpec,
    flops_per_key: float,
    seq: int,
    groups: tuple[tuple[tuple[int, int], int], ...] | None = None,
    cp: int = 1,
) -> tuple[float, float]:
    """Forward and backward time of the flash-attention core, averaged over the model's attention layers;
    ``flops_per_key * seq`` is a full causal layer's forward FLOPs. Layers are grouped by (span, kernel
    length) (``groups``: :func:`layer_groups`, computed here when not given) and priced apart; the backward
    does 2.5x the forward's FLOPs at the backward table. Under context parallelism ``cp`` no kernel call
    loops over more than S/CP keys (the ring's blocks), which caps the length the efficiency is read at."""
    full = flops_per_key * seq
    groups = layer_groups(m, seq) if groups is None else groups
    n_layers = sum(n for _, n in groups)
    fwd = bwd = 0.0
    block = max(1, seq // cp)
    for (span, length), n in groups:
        fwd += n * attention_time(dev, full * span, min(length, block), backward=False)
        bwd += n * attention_time(dev, 2.5 * full * span, min(length, block), backward=True)
    return fwd / n_layers, bwd / n_layers
