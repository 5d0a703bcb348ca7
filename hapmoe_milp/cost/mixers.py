"""Pricing of the token mixers that are not softmax attention: gated DeltaNet and Mamba (-1 and -2).

Kept apart from :mod:`hapmoe_milp.cost.model` (which prices attention and the MLPs) so each mixer's
time, kernels and context-parallel exchange are one function each; ``CostModel`` calls them for layers
whose kind has such a mixer. What a mixer keeps for its backward is priced with every other stored
tensor in :mod:`hapmoe_milp.cost.memory` (``_mixer_terms``, Mamba-2's fused-scan accounting), from the
widths :func:`mixer_widths` gives.

Per rank and micro-batch, ``t`` tokens of the CP shard run through the TP-sharded mixer:

- projections: the in-projection (``in_proj_out / TP`` columns) and the out-projection (``inner / TP``
  rows) as GEMMs;
- the chunked scan -- Mamba-2's SSD, gated DeltaNet's delta rule -- at the device's measured efficiency for
  that kernel (:func:`~hapmoe_milp.cost.primitives.scan_time`), read off published timings of the Triton
  kernels Megatron-Core runs (``bench/calibration/microbenchmarks.yaml``, kinds ``ssd`` and ``gdn``): 3-13%
  of the BF16 peak, an order below flash attention's. Backward: the delta rule's is 3.1x its forward's time
  (``GDN_BWD_FACTOR``, measured); the SSD's is taken as 2.5x (the FLOP ratio used for attention; no public
  backward timing of the SSD kernels was found: an assumption);
- convolution, gates and norms as memory-bound passes over the conv channels (``MIXER_PASSES``).

Mamba-1's selective scan is not a chunked matmul kernel; we price it as tensor-core work at the device's
attention-kernel efficiency (a stated simplification; no kernel timing held).
Context parallelism for these mixers (Megatron's ``mamba_context_parallel.py``) switches the sequence
shard for a head shard and back with all-to-alls: two of the mixer's input per direction.
"""

from __future__ import annotations

from dataclasses import dataclass

from hapmoe_milp.cost.primitives import BF16, attention_time, gemm_time, memory_time, scan_time
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.mixers import GatedDeltaNetShape, Mamba1Shape, Mamba2Shape
from hapmoe_milp.specs.model import ModelSpec

# Read + write passes over the conv channels per forward: the causal convolution, its activation, the
# gate/decay computations and the gated output norm (an assumption, as ELEMENTWISE_PASSES_H in layer.py).
MIXER_PASSES = 8
# Backward / forward time of Mamba-2's SSD scan: the attention FLOP ratio, assumed (module docstring).
SSD_BWD_FACTOR = 2.5
# Backward / forward time of the delta rule, measured: flash-linear-attention's Triton chunk_gated_delta_rule at
# Qwen3.5-35B-A3B's (= Qwen3-Next's) shape, 1 x 8192 and 1 x 32768 tokens, 3.06 and 3.01 on H200, 3.22 and 3.36 on
# GB200 (QwenLM/FlashQLA benchmark/benchmark_results_{H200,GB200}.txt @c18a4860).
GDN_BWD_FACTOR = 3.1
# Kernels per forward (estimates of Megatron-Core's layers with their fused kernels), of which GEMMs:
# gated DeltaNet: norm, in-projection, conv, split/activation (2), q/k L2 norm (2), gates (2), the chunked
# delta rule (6 kernels in flash-linear-attention), gated norm, out-projection, bias-dropout-add.
GDN_KERNELS = (17, 2)
# Mamba-2: norm, in-projection, conv, the SSD chunk scan (5 kernels), gated norm, out-projection, add.
MAMBA2_KERNELS = (11, 2)
# Mamba-1 (Jamba): norm, in-projection, conv, x_proj, dt_proj, three norms, selective scan, out-proj, add.
MAMBA1_KERNELS = (11, 4)


@dataclass(frozen=True)
class MixerCost:
    """Forward and backward compute seconds and kernels (fwd, of which GEMMs); stored bytes are
    :mod:`hapmoe_milp.cost.memory`'s."""

    fwd: float
    bwd: float
    kernels: tuple[int, int]


def _shape(m: ModelSpec, mixer: str) -> GatedDeltaNetShape | Mamba1Shape | Mamba2Shape:
    return m.gdn_shape if mixer == "gdn" else m.mamba_shape


def _widths(shape: GatedDeltaNetShape | Mamba1Shape | Mamba2Shape) -> tuple[float, float, float]:
    """(in-projection outputs, conv channels, inner width) of a mixer."""
    if isinstance(shape, GatedDeltaNetShape):
        return shape.in_proj_out, shape.conv_dim, shape.v
    if isinstance(shape, Mamba2Shape):
        return shape.in_proj_out, shape.conv_dim, shape.inner
    return 2 * shape.inner, shape.inner, shape.inner


def mixer_widths(m: ModelSpec, mixer: str) -> tuple[float, float, float]:
    """(in-projection outputs, conv channels, inner width) of a model's gated-DeltaNet or Mamba mixer."""
    return _widths(_shape(m, mixer))


def mixer_cost(m: ModelSpec, dev: DeviceSpec, mixer: str, t: float, tp: int, seq: int, prec: str) -> MixerCost:
    """One gated-DeltaNet or Mamba mixer on one rank: ``t`` tokens, TP-sharded widths."""
    shape = _shape(m, mixer)
    h = m.hidden_size
    in_out, conv, inner = _widths(shape)
    gemm_f = gemm_time(dev, t, in_out / tp, h, prec) + gemm_time(dev, t, h, inner / tp, prec)
    if isinstance(shape, Mamba1Shape):
        small = shape.dt_rank + 2 * shape.state
        gemm_f += gemm_time(dev, t, small / tp, inner, prec) + gemm_time(dev, t, inner / tp, shape.dt_rank, prec)
    scan_flops = 2 * t * shape.scan_macs() / tp
    if isinstance(shape, Mamba2Shape):
        scan_f = scan_time(dev, scan_flops, "ssd")
        scan_b = SSD_BWD_FACTOR * scan_f
    elif isinstance(shape, GatedDeltaNetShape):
        scan_f = scan_time(dev, scan_flops, "gdn")
        scan_b = GDN_BWD_FACTOR * scan_f
    else:
        scan_f = attention_time(dev, scan_flops, seq, backward=False)
        scan_b = attention_time(dev, 2.5 * scan_flops, seq, backward=True)
    elem = memory_time(dev, MIXER_PASSES * t * conv / tp * BF16)
    fwd = gemm_f + scan_f + elem
    bwd = 2 * gemm_f + scan_b + 2 * elem
    kernels = GDN_KERNELS if mixer == "gdn" else (MAMBA1_KERNELS if isinstance(shape, Mamba1Shape) else MAMBA2_KERNELS)
    return MixerCost(fwd=fwd, bwd=bwd, kernels=kernels)


def mixer_cp_bytes(m: ModelSpec, mixer: str, t: float, tp: int) -> float:
    """Bytes per rank one all-to-all moves when CP re-shards the mixer input (sequence <-> heads)."""
    in_out, _, _ = _widths(_shape(m, mixer))
    return t * in_out / tp * BF16


def mixer_out_width(m: ModelSpec, mixer: str | None) -> float:
    """Width of the mixer's out-projection input (what FP8 quantises besides the layer input)."""
    if mixer == "gdn":
        return m.gdn_shape.v
    if mixer == "mamba":
        return m.mamba_shape.inner
    return m.q_dim
