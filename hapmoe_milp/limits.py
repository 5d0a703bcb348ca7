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
MAX_EXPR_NESTING = 32  # parentheses nested in a moe_layer_freq expression (real ones use 1 or 2)

# cluster
MAX_DEVICES = 65_536  # devices in one cluster (all groups)
MAX_DEVICES_PER_NODE = 128  # devices of one node (scale-up domain of a device table)
MAX_GROUPS = 64  # node groups in one cluster

# run settings and plans
MAX_SEQ_LENGTH = 1 << 24  # tokens per sample
MAX_BATCH = 1 << 24  # global / micro batch size, samples
MAX_VPP = 64  # virtual pipeline chunks per stage
MAX_IMBALANCE = 100.0  # expert load-imbalance factor (1.0 = balanced)
MAX_SIMULATED_OPS = 4_000_000  # forward/backward ops the event-driven 1F1B simulator steps through (~seconds)
MAX_TIME_LIMIT_S = 7 * 24 * 3600.0  # solver time limit
MAX_THREADS = 1_024  # solver worker threads (the largest hosts have a few hundred cores)

# sweeps
MAX_MIX_COUNTS = 4_096  # device counts one --mix range may generate
MAX_SWEEP_CASES = 100_000  # cases (models x clusters x settings) of one sweep

# any other integer field of a spec, plan, preset or runs file: no count the planner reads comes near it, so a
# value above it (2^70 experts) is a typo, refused at the field instead of deep in the cost model
MAX_SPEC_INT = 1 << 40

#: Integer fields the strict readers cap by name, whichever file they are in: Megatron's names and the Hugging
#: Face names of the same quantities (the HF importer gets the caps without listing them).
SPEC_INT_CAPS: dict[str, int] = {
    **dict.fromkeys(("num_layers", "num_hidden_layers", "n_layer", "num_nextn_predict_layers"), MAX_LAYERS),
    **dict.fromkeys(
        (
            "hidden_size",
            "ffn_hidden_size",
            "intermediate_size",
            "moe_ffn_hidden_size",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "moe_shared_expert_intermediate_size",
            "kv_channels",
            "head_dim",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_head_dim",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "qk_pos_emb_head_dim",
            "v_head_dim",
        ),
        MAX_HIDDEN_SIZE,
    ),
    **dict.fromkeys(
        ("num_attention_heads", "num_query_groups", "num_key_value_heads", "n_head", "num_kv_heads"), MAX_HEADS
    ),
    **dict.fromkeys(
        (
            "num_experts",
            "num_local_experts",
            "n_routed_experts",
            "moe_num_experts",
            "num_experts_per_tok",
            "moe_router_topk",
            "moe_topk",
            "n_shared_experts",
            "num_shared_experts",
        ),
        MAX_EXPERTS,
    ),
    **dict.fromkeys(("vocab_size", "padded_vocab_size", "make_vocab_size_divisible_by"), MAX_VOCAB),
    **dict.fromkeys(("seq_length", "max_position_embeddings", "window_size", "sliding_window"), MAX_SEQ_LENGTH),
    **dict.fromkeys(("global_batch_size", "micro_batch_size"), MAX_BATCH),
}

# Physical ranges (lo, hi) of measured and datasheet numbers. A value outside one is a typo or a unit mix-up
# -- or a denormal such as 5e-324, which is "positive" and divides to infinity -- and is refused at its
# field with the range in the message. Wide on purpose: a CPU core to a hundred of today's largest parts.
RANGE_PEAK_TFLOPS = (1e-3, 1e5)  # dense TFLOP/s per device (B200 BF16 is 2.25e3)
RANGE_MEMORY_GIB = (1e-3, 1e5)  # device memory, GiB (MI355X has 288)
RANGE_MEMORY_GBPS = (0.1, 1e5)  # device memory bandwidth, GB/s (B200 8e3)
RANGE_LINK_GBPS = (1e-6, 1e5)  # link or collective bus bandwidth, GB/s (NVLink 5 is 900 per GPU)
RANGE_NIC_GBITPS = (1e-2, 1e5)  # NIC line rate, Gb/s (800G NICs exist)
RANGE_LATENCY_US = (0.0, 1e7)  # link latency, microseconds (0 = negligible; 10 s is no link)
RANGE_EFFICIENCY = (1e-6, 1.0)  # achieved fraction of a peak in a lookup table
RANGE_PRICE_PER_HOUR = (0.0, 1e6)  # price of one device-hour (0 = owned)
RANGE_STEP_TIME_S = (1e-6, 1e7)  # one training iteration, seconds (1 us to ~4 months)
RANGE_TOKENS_PER_S_PER_DEVICE = (1e-6, 1e8)  # a 100M-parameter model on a B200 runs ~4e6
RANGE_TOKENS_PER_S = (1e-6, 1e8 * MAX_DEVICES)  # per cluster
RANGE_PARAMS_B = (1e-6, 1e6)  # published parameter counts, billions

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
    "MAX_THREADS": (MAX_THREADS, "solver threads"),
    "MAX_MIX_COUNTS": (MAX_MIX_COUNTS, "counts one --mix range generates"),
    "MAX_SWEEP_CASES": (MAX_SWEEP_CASES, "cases in one sweep"),
}
