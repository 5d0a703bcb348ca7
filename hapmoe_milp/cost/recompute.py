"""Time of activation recompute by Megatron module, and of fine-grained activation offload.

Megatron recomputes in backward what ``--recompute-modules`` names (selective) or whole layers (full);
each module re-runs a known slice of the layer's forward, which :meth:`CostModel._layer` prices once and
passes here by name (``fparts``). Memory (what each module stops storing) is in :mod:`hapmoe_milp.cost.memory`.

Why the search walks the ladder ``none < selective < sel-mlp < sel-moe < full`` (config.RECOMPUTE_LEVELS) and not
all 2^7 module sets: recompute trades memory for time, so a module set is worth searching only when no
cheaper set saves as much. Per byte saved, element-wise modules (``layernorm``, ``moe_act``) cost only
memory passes -- always first; GEMM-only modules (``mlp``, ``shared_experts``, ``mla_up_proj``) cost
GEMMs but no expert-parallel traffic -- next; ``moe`` repeats the dispatch and combine -- next; ``full``
repeats attention too. ``core_attn`` is off the ladder: with fused (flash) attention its inputs Q, K, V
are kept anyway and, in BF16, its output is also the projection's input, so it frees nothing (FP8: the
BF16 output only) while re-running the attention core. Any set can still be estimated and exported.
"""

from __future__ import annotations

from collections.abc import Mapping

from hapmoe_milp.config import RecomputeSpec, Settings
from hapmoe_milp.cost.memory import ActTerm, offloaded_bytes
from hapmoe_milp.specs.device import DeviceSpec


def recompute_forward(spec: RecomputeSpec, fparts: Mapping[str, float]) -> tuple[float, float, float, float]:
    """Extra forward seconds in backward, and of those the TP, CP and EP communication repeated.

    ``fparts`` holds the layer's forward pieces: ``compute``, ``tp``, ``cp``, ``ep`` (the whole forward),
    and per module ``layernorm``, ``moe_act``, ``core_attn``, ``mlp`` (+ ``tp_mlp``, its TP all-gather),
    ``shared_experts``, ``mla_up_proj``, ``moe`` (router, permute, experts and shared experts)."""
    if spec.granularity == "none":
        return 0.0, 0.0, 0.0, 0.0
    if spec.granularity == "full":
        tp, cp, ep = fparts["tp"], fparts["cp"], fparts["ep"]
        return fparts["compute"] + tp + cp + ep, tp, cp, ep
    mods = set(spec.modules)
    rec = tp = cp = ep = 0.0
    for name in ("layernorm", "mla_up_proj"):
        if name in mods:
            rec += fparts[name]
    if "core_attn" in mods:
        rec += fparts["core_attn"] + fparts["cp"]
        cp += fparts["cp"]
    if "mlp" in mods and fparts["mlp"] > 0:
        rec += fparts["mlp"] + fparts["tp_mlp"]
        tp += fparts["tp_mlp"]
    if "moe" in mods:
        rec += fparts["moe"] + fparts["ep"]
        ep += fparts["ep"]
    else:
        rec += fparts["moe_act"] if "moe_act" in mods else 0.0
        rec += fparts["shared_experts"] if "shared_experts" in mods else 0.0
    return rec, tp, cp, ep


def offload_time(
    dev: DeviceSpec, st: Settings, terms: tuple[ActTerm, ...], spec: RecomputeSpec, f_comp: float
) -> float:
    """Exposed seconds of fine-grained activation offload per layer and micro-batch: the offloaded bytes
    go to the host during forward and come back before backward over the host link
    (``offload_host_GBps``), each overlapped with the layer's forward computation at best."""
    nbytes = offloaded_bytes(terms, spec, st.offload_modules)
    if nbytes <= 0:
        return 0.0
    del dev  # the host link is a run setting, not a device-table term
    one_way = nbytes / (st.offload_host_GBps * 1e9)
    return 2 * max(0.0, one_way - f_comp)
