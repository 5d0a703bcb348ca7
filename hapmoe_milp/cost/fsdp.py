"""Megatron-FSDP's communication (``--use-megatron-fsdp --data-parallel-sharding-strategy ...``).

With sharded gradients (``optim_grads``) every micro-batch's backward reduce-scatters each layer's
gradients into the shard; with sharded parameters (``optim_grads_params``) every micro-batch also
all-gathers each layer's parameters before its forward and again before its backward. Both run per layer
on the DP x CP group (dense parameters) and the expert-DP group (experts), on the link class the group
spans, prefetched beside the neighbouring layer's computation: a share ``dp_overlap`` of the layer's own
compute hides them (the same overlap term the distributed optimizer's sync uses). ``optim`` shards only
the optimizer state and syncs like the distributed optimizer, once per iteration. Memory is in
:mod:`hapmoe_milp.cost.memory`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hapmoe_milp.config import ParallelConfig, Settings
from hapmoe_milp.cost.primitives import BF16, FP32
from hapmoe_milp.specs.device import DeviceSpec

if TYPE_CHECKING:
    from hapmoe_milp.cost.model import CostModel


def fsdp_comm(
    cm: CostModel, dev: DeviceSpec, did: str, cfg: ParallelConfig, dense_local: float, exp_local: float
) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's FSDP collectives per micro-batch, before overlap."""
    st = cm.settings
    if st.fsdp not in ("optim_grads", "optim_grads_params"):
        return 0.0, 0.0
    grad_b = BF16 if st.grad_reduce_in_bf16 else FP32
    param_b = 1.0 if st.fp8_param_gather else BF16
    fwd = bwd = 0.0
    for params, n in ((dense_local, cfg.dp * cfg.cp), (exp_local, cfg.edp or 1)):
        if params <= 0 or n <= 1:
            continue
        bwd += cm.collective(dev, did, "reduce_scatter", grad_b * params, n, cfg.devices)
        if st.fsdp == "optim_grads_params":
            ag = cm.collective(dev, did, "all_gather", param_b * params, n, cfg.devices)
            fwd += ag
            bwd += ag
    return fwd, bwd


def fsdp_exposed(
    cm: CostModel,
    dev: DeviceSpec,
    did: str,
    cfg: ParallelConfig,
    dense_local: float,
    exp_local: float,
    f_comp: float,
    b_comp: float,
) -> tuple[float, float]:
    """What the layer's FSDP collectives add to its forward and backward after overlap."""
    f, b = fsdp_comm(cm, dev, did, cfg, dense_local, exp_local)
    if f == 0.0 and b == 0.0:
        return 0.0, 0.0
    k = dev.runtime.dp_overlap
    return max(0.0, f - k * f_comp), max(0.0, b - k * b_comp)


def fsdp_sync(st: Settings, rs: float, ag: float) -> tuple[float, float]:
    """The once-per-iteration gradient reduce-scatter and parameter all-gather left under FSDP: sharded
    gradients were reduced every micro-batch; sharded parameters are gathered every micro-batch instead."""
    if st.fsdp == "optim_grads":
        return 0.0, ag
    if st.fsdp == "optim_grads_params":
        return 0.0, 0.0
    return rs, ag
