"""Token mixers other than softmax attention: their weights and their multiply-accumulates per token.

Pure functions of integers, so the model spec, the cost model and the tests share one formula each
and nothing here depends on :class:`ModelSpec`. Shapes follow the layers as Megatron-Core builds them
(megatron/core/ssm/mamba_mixer.py, megatron/core/ssm/gated_delta_net.py at megatron-core 0.16.1) and,
for Mamba-1 (which Megatron does not implement), Hugging Face's ``JambaMambaMixer``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mamba2Shape:
    """A Mamba-2 (SSD) mixer: ``heads x head_dim`` inner channels, ``groups`` B/C groups of ``state``."""

    hidden: int
    heads: int
    head_dim: int
    groups: int
    state: int
    conv: int = 4

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels the causal convolution runs over: x, B and C."""
        return self.inner + 2 * self.groups * self.state

    @property
    def in_proj_out(self) -> int:
        """z (gate), x, B, C and one dt per head."""
        return 2 * self.inner + 2 * self.groups * self.state + self.heads

    def params(self) -> int:
        """in_proj + conv (weight and bias) + dt_bias, A_log, D + gated RMSNorm + out_proj."""
        return (
            self.hidden * self.in_proj_out
            + self.conv_dim * (self.conv + 1)
            + 3 * self.heads
            + self.inner
            + self.inner * self.hidden
        )

    def gemm_macs(self) -> int:
        """Multiply-accumulates per token in the two projections (what runs on tensor cores)."""
        return self.hidden * self.in_proj_out + self.inner * self.hidden

    def scan_macs(self, chunk: int = 128) -> float:
        """Per token in the chunked SSD scan: the intra-chunk quadratic part (``chunk/2`` keys per query on
        ``state`` and ``head_dim``) and the state update/readout (``2 * state * head_dim``), per head."""
        return self.heads * (chunk / 2 * (self.state + self.head_dim) + 2 * self.state * self.head_dim)


@dataclass(frozen=True)
class Mamba1Shape:
    """A Mamba-1 (selective scan) mixer as Jamba uses it: inner = expand * hidden, a ``dt_rank`` low-rank dt,
    and Jamba's RMSNorms on dt, B and C."""

    hidden: int
    inner: int
    state: int
    dt_rank: int
    conv: int = 4
    conv_bias: bool = True
    proj_bias: bool = False
    bcdt_norms: bool = True

    def params(self) -> int:
        d, n, r = self.inner, self.state, self.dt_rank
        p = self.hidden * 2 * d  # in_proj: x and the gate z
        p += d * self.conv + (d if self.conv_bias else 0)
        p += d * (r + 2 * n)  # x_proj -> dt, B, C
        p += r * d + d  # dt_proj with its bias
        p += d * n + d  # A_log, D
        p += d * self.hidden  # out_proj
        if self.proj_bias:
            p += 2 * d + self.hidden
        if self.bcdt_norms:
            p += r + 2 * n
        return p

    def gemm_macs(self) -> int:
        d = self.inner
        return self.hidden * 2 * d + d * (self.dt_rank + 2 * self.state) + self.dt_rank * d + d * self.hidden

    def scan_macs(self) -> float:
        """Per token: the recurrent update and readout of a ``state``-wide state per inner channel."""
        return 3.0 * self.inner * self.state


@dataclass(frozen=True)
class GatedDeltaNetShape:
    """Gated DeltaNet linear attention (Qwen3-Next; Megatron ``experimental_attention_variant``)."""

    hidden: int
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv: int = 4
    conv_bias: bool = False

    @property
    def qk(self) -> int:
        return self.key_heads * self.key_dim

    @property
    def v(self) -> int:
        return self.value_heads * self.value_dim

    @property
    def in_proj_out(self) -> int:
        """q, k, v, the output gate z, and per value head the beta and the decay a."""
        return 2 * self.qk + 2 * self.v + 2 * self.value_heads

    @property
    def conv_dim(self) -> int:
        return 2 * self.qk + self.v

    def params(self) -> int:
        """in_proj + conv + dt_bias and A_log + the per-head-dim output norm + out_proj."""
        conv = self.conv_dim * self.conv + (self.conv_dim if self.conv_bias else 0)
        return self.hidden * self.in_proj_out + conv + 2 * self.value_heads + self.value_dim + self.v * self.hidden

    def gemm_macs(self) -> int:
        return self.hidden * self.in_proj_out + self.v * self.hidden

    def scan_macs(self, chunk: int = 64) -> float:
        """Per token in the chunked delta rule: within a chunk ``chunk/2`` keys per query for the scores and
        the outputs, and the state (``key_dim x value_dim`` per value head) read, updated and corrected."""
        per_head = chunk / 2 * (self.key_dim + self.value_dim) + 3 * self.key_dim * self.value_dim
        return self.value_heads * per_head
