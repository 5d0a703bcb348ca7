"""hapmoe-milp: heterogeneity-aware parallelism planning for MoE training.

profile -> model -> search -> export: device tables feed an MoE-aware cost model; a pruned DP, a
CP-SAT model and a PuLP MILP search one shared instance; plans export to Megatron-LM and FlagScale.
"""

from hapmoe_milp.api import estimate_plan, solve
from hapmoe_milp.errors import HapmoeError

__version__ = "0.1.0"
__all__ = ["HapmoeError", "__version__", "estimate_plan", "solve"]
