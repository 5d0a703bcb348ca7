"""AMD-only plans on the ROCm fork of Megatron-LM: what it shares with upstream, and what we write
differently.

Shared: every model and parallelism flag. The fork's ``megatron/training/arguments.py``
(ROCm/Megatron-LM @ :data:`~hapmoe_milp.runtimes.ROCM_COMMIT`) carries upstream's argument set, its
``validate_args`` and the ``--pipeline-model-parallel-layout`` grammar, so ``megatron_args`` and every
Megatron rule of :mod:`hapmoe_milp.export.validate` apply unchanged.

Different (ROCm/Megatron-LM @ :data:`~hapmoe_milp.runtimes.ROCM_EXAMPLE`,
``examples/mixtral/train_mixtral_moe.sh``):

* ``--no-gradient-accumulation-fusion``: the fused weight-gradient accumulation is an APEX/CUDA kernel
  the ROCm build does not ship; the fork's MoE example always disables it;
* the environment its examples export on AMD GPUs (``HSA_NO_SCRATCH_RECLAIM``, ``GPU_MAX_HW_QUEUES``,
  ``TORCH_NCCL_HIGH_PRIORITY``, ``NCCL_CHECKS_DISABLE``; RCCL reads the ``NCCL_*`` names);
* a launch unit that shares a node restricts itself with ``HIP_VISIBLE_DEVICES``;
* no ``flex`` dispatcher (DeepEP is a CUDA library): the runtime does not list it, so the search never
  picks it and ``validate`` refuses it.
"""

from __future__ import annotations

from hapmoe_milp.config import Settings
from hapmoe_milp.export.megatron import Flavor, megatron_args
from hapmoe_milp.plan import Plan
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

ARGS_FILE = "megatron_args.txt"
ROCM_ONLY_ARGS: tuple[str, ...] = ("--no-gradient-accumulation-fusion",)
ROCM_ENV: tuple[tuple[str, str, str], ...] = (
    ("HSA_NO_SCRATCH_RECLAIM", "1", "ROCm fork examples: keep scratch memory between kernels"),
    ("GPU_MAX_HW_QUEUES", "2", "ROCm fork examples"),
    ("TORCH_NCCL_HIGH_PRIORITY", "1", "ROCm fork examples: RCCL streams at high priority"),
    ("NCCL_CHECKS_DISABLE", "1", "ROCm fork examples (RCCL reads NCCL_* variables)"),
)
ROCM_FLAVOR = Flavor("rocm", "MEGATRON_LM", "your ROCm/Megatron-LM checkout", ARGS_FILE, ROCM_ENV)


def rocm_args(plan: Plan, model: ModelSpec, cluster: ClusterSpec, settings: Settings | None = None) -> list[str]:
    """Upstream Megatron-LM's arguments plus what the ROCm build needs (see the module doc)."""
    return megatron_args(plan, model, cluster, settings) + list(ROCM_ONLY_ARGS)
