"""Caps on the size of what the planner accepts, so that no input can make it work without end.

Every cap is far above any real training set-up (the largest catalog cluster has 2,048 devices, the
deepest model 94 layers) and well below the sizes where building the plan space, enumerating a sweep or
expanding a list would take minutes or run out of memory. An input above a cap is refused at load time
with a one-line error naming the field and the cap; the README lists them.
"""

from __future__ import annotations

# model
# decoder + MTP layers of a model: the deepest catalog model has 94; at 1,024 the plan space of a 16-device
# cluster takes ~0.5 GB and seconds to build (10,000 took 4 GB and 40 s on a busy 2-core machine)
MAX_LAYERS = 1_024
MAX_HIDDEN_SIZE = 1 << 20  # hidden / FFN / expert widths
MAX_HEADS = 1 << 16  # attention heads and query groups
MAX_EXPERTS = 1 << 16  # routed experts
MAX_VOCAB = 1 << 25  # vocabulary entries
MAX_FREQ_EXPR_LEN = 100_000  # entries a moe_layer_freq list expression may expand to

# cluster
MAX_DEVICES = 65_536  # devices in one cluster (all groups)
MAX_DEVICES_PER_NODE = 128  # devices of one node (scale-up domain of a device table)
MAX_GROUPS = 64  # node groups in one cluster

# run settings and plans
MAX_SEQ_LENGTH = 1 << 24  # tokens per sample
MAX_BATCH = 1 << 24  # global / micro batch size, samples
MAX_VPP = 64  # virtual pipeline chunks per stage
MAX_IMBALANCE = 100.0  # expert load-imbalance factor (1.0 = balanced)
MAX_TIME_LIMIT_S = 7 * 24 * 3600.0  # solver time limit

# sweeps
MAX_MIX_COUNTS = 4_096  # device counts one --mix range may generate
MAX_SWEEP_CASES = 100_000  # cases (models x clusters x settings) of one sweep

# names that reach generated launch files (model, cluster, device ids): letters, digits, '._+-'
SAFE_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}"

CAPS: dict[str, tuple[int | float, str]] = {
    "MAX_LAYERS": (MAX_LAYERS, "decoder + MTP layers of a model"),
    "MAX_HIDDEN_SIZE": (MAX_HIDDEN_SIZE, "hidden, FFN and expert widths"),
    "MAX_HEADS": (MAX_HEADS, "attention heads and query groups"),
    "MAX_EXPERTS": (MAX_EXPERTS, "routed experts"),
    "MAX_VOCAB": (MAX_VOCAB, "vocabulary size"),
    "MAX_DEVICES": (MAX_DEVICES, "devices in one cluster"),
    "MAX_DEVICES_PER_NODE": (MAX_DEVICES_PER_NODE, "devices per node"),
    "MAX_GROUPS": (MAX_GROUPS, "node groups in one cluster"),
    "MAX_SEQ_LENGTH": (MAX_SEQ_LENGTH, "sequence length"),
    "MAX_BATCH": (MAX_BATCH, "global and micro batch size"),
    "MAX_VPP": (MAX_VPP, "virtual pipeline chunks per stage"),
    "MAX_IMBALANCE": (MAX_IMBALANCE, "expert load-imbalance factor"),
    "MAX_TIME_LIMIT_S": (MAX_TIME_LIMIT_S, "solver time limit in seconds"),
    "MAX_MIX_COUNTS": (MAX_MIX_COUNTS, "counts one --mix range generates"),
    "MAX_SWEEP_CASES": (MAX_SWEEP_CASES, "cases in one sweep"),
}
