"""Per-stage parallel configuration and run settings shared by the cost model, the space and the plan.

Parallel folding (Megatron-Core): attention runs on a TP x CP x DP grid and experts on an
ETP x EP x EDP grid over the same ranks, so ``TP*CP*DP == ETP*EP*EDP == devices of the stage``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

RECOMPUTE_LEVELS = ("none", "selective", "full")
Recompute = Literal["none", "selective", "full"]
Family = Literal["megatron", "hetero"]


@dataclass(frozen=True, order=True)
class ParallelConfig:
    tp: int = 1
    cp: int = 1
    dp: int = 1
    ep: int = 1
    etp: int = 1

    @property
    def devices(self) -> int:
        return self.tp * self.cp * self.dp

    @property
    def edp(self) -> int:
        """Expert data-parallel size; 0 when ETP*EP does not divide the stage (an invalid config)."""
        n = self.etp * self.ep
        return self.devices // n if self.devices % n == 0 else 0

    def label(self) -> str:
        return f"TP{self.tp} CP{self.cp} DP{self.dp} EP{self.ep} ETP{self.etp}"


@dataclass(frozen=True)
class Settings:
    """Everything about a run that is not the plan's layout.

    Overlap switches default to what Megatron-LM users normally enable (`--overlap-grad-reduce`,
    `--overlap-param-gather` with the distributed optimizer); EP all-to-all is not overlapped by
    default because Megatron's EP-overlap needs VPP and is opt-in.
    """

    seq_length: int = 4096
    global_batch_size: int = 256
    micro_batch_size: int = 1
    precision: Literal["bf16", "fp8"] = "bf16"
    imbalance: float = 1.0
    dispatcher: str = "alltoall"
    distributed_optimizer: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    overlap_ep_comm: bool = False
    memory_headroom: float = 0.05
    optimizer_offload: bool = False
    # Host side of optimizer offload (HAPMoE offloads FP32 optimizer states for Mixtral-L on its smallest
    # clusters). Assumptions, not measurements: per-device host-link share and CPU Adam rate per rank.
    offload_host_GBps: float = 10.0
    offload_adam_params_per_s: float = 1.0e9

    def with_(self, **kw: object) -> Settings:
        return replace(self, **kw)  # type: ignore[arg-type]
