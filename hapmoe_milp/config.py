"""Per-stage parallel configuration and run settings shared by the cost model, the space and the plan.

Parallel folding (Megatron-Core): attention runs on a TP x CP x DP grid and experts on an
ETP x EP x EDP grid over the same ranks, so ``TP*CP*DP == ETP*EP*EDP == devices of the stage``.

This module is also the one validation layer for run values: :class:`Settings` and
:class:`ParallelConfig` check every field when they are built (``dataclasses.replace`` included), and
raise :class:`~hapmoe_milp.errors.SettingsError` naming the field. Front ends (CLI flags, plan files,
YAML presets, the Python API) never re-check a value; they re-raise the same error under their own
name for it (``err.at(field="--seq")``), so a bad value reads the same wherever it came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, Protocol

from hapmoe_milp.errors import SettingsError
from hapmoe_milp.limits import (
    MAX_BATCH,
    MAX_DEVICES,
    MAX_IMBALANCE,
    MAX_SEQ_LENGTH,
    MAX_THREADS,
    MAX_TIME_LIMIT_S,
)

#: Megatron's ``--recompute-modules`` choices (TransformerConfig at core_v0.16.1); exports list them in this order.
RECOMPUTE_MODULES: tuple[str, ...] = (
    "core_attn",
    "moe_act",
    "layernorm",
    "mla_up_proj",
    "mlp",
    "moe",
    "shared_experts",
)
#: The recompute ladder the search walks, cheapest first (cost/recompute.py argues why these bundles).
#: ``selective`` is ``layernorm`` + ``moe_act``; ``sel-mlp`` adds the GEMM-only modules (dense MLP, shared
#: experts, MLA up-projections); ``sel-moe`` recomputes whole MoE blocks (dispatch included); ``full`` whole
#: layers. Besides these a stage may name any module set (``"core_attn,mlp"``), block recompute of its
#: first K layers per chunk (``"full:K"``) or uniform groups of N layers (``"uniform:N"``).
RECOMPUTE_LEVELS = ("none", "selective", "sel-mlp", "sel-moe", "full")
LADDER_MODULES: dict[str, tuple[str, ...]] = {
    "selective": ("layernorm", "moe_act"),
    "sel-mlp": ("layernorm", "moe_act", "mla_up_proj", "mlp", "shared_experts"),
    "sel-moe": ("layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"),
}
Recompute = str
FSDP_STRATEGIES: tuple[str, ...] = ("none", "optim", "optim_grads", "optim_grads_params")
OFFLOAD_MODULES: tuple[str, ...] = (
    "attn_norm",
    "qkv_linear",
    "core_attn",
    "attn_proj",
    "mlp_norm",
    "expert_fc1",
    "moe_act",
)
STATE_DTYPES: tuple[str, ...] = ("fp32", "bf16")
MAIN_PARAM_DTYPES: tuple[str, ...] = ("fp32", "fp16")
Family = Literal["megatron", "hetero"]
FAMILIES: tuple[str, ...] = ("megatron", "hetero")
PRECISIONS: tuple[str, ...] = ("bf16", "fp8")
#: Megatron's --fp8-recipe values the planner prices and exports: per-tensor scaling computed each step
#: (tensorwise), 1x128/128x128 blocks (blockwise, Hopper DeepSeek-style), 32-element MX blocks (mxfp8,
#: Blackwell). Delayed scaling is left out: Megatron rejects it with the selective recompute we export.
FP8_RECIPES: tuple[str, ...] = ("tensorwise", "blockwise", "mxfp8")
DISPATCHERS: tuple[str, ...] = ("allgather", "alltoall", "flex")
#: CUDA-graph capture scopes (Megatron ``--cuda-graph-scope`` with ``--cuda-graph-impl transformer_engine``);
#: ``layer`` is Megatron's local whole-layer capture (``--cuda-graph-impl local``, no scope), ``none`` eager.
CUDA_GRAPH_PARTS: tuple[str, ...] = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
CUDA_GRAPH_WHOLE: tuple[str, ...] = ("none", "layer")
#: The searches a user can ask for by name: the pruned DP, and the exact backends (``auto`` lets the
#: exact front end pick and chain them). Written once; the API, presets, sweeps and the CLI check against it.
EXACT_SOLVERS: tuple[str, ...] = ("cpsat", "milp", "auto")
SOLVERS: tuple[str, ...] = ("dp", *EXACT_SOLVERS)
#: Optimizer offload as every front end spells it: ``auto`` (offload only if nothing fits otherwise), ``on``
#: or ``off``; :func:`offload_choice` turns it into what ``api.solve`` takes (``"auto"``, True, False).
OFFLOAD_WORDS: tuple[str, ...] = ("auto", "on", "off")
# Search time is a product feature: unless told otherwise, stop after a minute and return the best plan
# found (status "timeout" with its certificate) rather than keep the user waiting.
DEFAULT_TIME_LIMIT = 60.0


# ---------------------------------------------------------------------- value checks (one place)
def check_int(name: str, v: Any, lo: int = 1, hi: int | None = None) -> int:
    """An integer in ``[lo, hi]`` (bools are not integers here)."""
    if type(v) is not int:
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise SettingsError(f"must be an integer, got {_show(v)}", field=name)
        else:
            v = int(v.__index__())
    if v < lo or (hi is not None and v > hi):
        if hi is None:
            word = "a positive integer" if lo == 1 else f"an integer >= {lo}"
        else:
            word = f"an integer from {lo} to {hi:,}"
        got = (
            str(v) if abs(v) < 10**18 else ("a number with more than 18 digits" if v > 0 else "a huge negative number")
        )
        raise SettingsError(f"must be {word}, got {got}", field=name)
    return v


def _show(v: Any) -> str:
    text = repr(v) if not isinstance(v, str | bytes | list | dict | tuple) or len(v) < 40 else f"<{type(v).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def check_float(name: str, v: Any, lo: float, hi: float, *, lo_open: bool = False, what: str = "a number") -> float:
    """A finite number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    if isinstance(v, bool | str | bytes):
        raise SettingsError(f"must be {what}, got {_show(v)}", field=name)
    if not isinstance(v, int | float):
        try:
            v = float(v)  # numpy scalars
        except (TypeError, ValueError):
            raise SettingsError(f"must be {what}, got {_show(v)}", field=name) from None
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise SettingsError(f"must be a finite number, got {f}", field=name)
    if f < lo or (lo_open and f == lo) or f > hi:
        left = "(" if lo_open else "["
        raise SettingsError(f"must be in {left}{lo:g}, {hi:g}], got {f:g}", field=name)
    return f


def check_choice(name: str, v: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(v, str) or v not in choices:
        raise SettingsError(f"must be one of {', '.join(choices)}, got {_show(v)}", field=name)
    return v


def check_graph_scope(v: Any) -> str:
    """``none``, ``layer``, or captured parts (comma-separated, any order); returned in canonical order."""
    if not isinstance(v, str) or not v.strip():
        raise SettingsError(
            f"must be none, layer or a comma-separated list of {', '.join(CUDA_GRAPH_PARTS)}, got {_show(v)}",
            field="cuda_graph_scope",
        )
    parts = [p.strip() for p in v.split(",") if p.strip()]
    if len(parts) == 1 and parts[0] in CUDA_GRAPH_WHOLE:
        return parts[0]
    bad = [p for p in parts if p not in CUDA_GRAPH_PARTS]
    if bad:
        raise SettingsError(
            f"unknown scope {bad[0]!r}: use none, layer or parts of {', '.join(CUDA_GRAPH_PARTS)}",
            field="cuda_graph_scope",
        )
    # Megatron-Core's own scope rules (core_v0.16.0 (3bec9aa97d), transformer_config.py __post_init__)
    if "moe" in parts:
        # Megatron captures the whole MoE block only for drop-and-pad MoE (static shapes); the planner's MoE is
        # dropless, whose token counts reach the host every layer, so only the router and preprocess can be
        # captured (and moe with moe_router is refused there too)
        raise SettingsError(
            "moe (the whole MoE block) is captured by Megatron only for drop-and-pad MoE, and the planned MoE is "
            "dropless: use moe_router,moe_preprocess",
            field="cuda_graph_scope",
        )
    if "moe_preprocess" in parts and "moe_router" not in parts:
        raise SettingsError(
            "moe_preprocess is captured only together with moe_router: add moe_router", field="cuda_graph_scope"
        )
    return ",".join(p for p in CUDA_GRAPH_PARTS if p in parts)


def graph_parts(scope: str) -> frozenset[str]:
    """The captured parts of a checked scope (``layer`` captures every part)."""
    if scope == "none":
        return frozenset()
    if scope == "layer":
        return frozenset(CUDA_GRAPH_PARTS)
    return frozenset(scope.split(","))


def check_bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise SettingsError(f"must be true or false, got {_show(v)}", field=name)
    return v


def offload_choice(v: Any, choices: tuple[str, ...] = OFFLOAD_WORDS) -> bool | Literal["auto"]:
    """``auto``/``on``/``off`` (a subset where ``auto`` means nothing, e.g. one fixed plan) -> "auto"/True/False."""
    word = check_choice("optimizer_offload", v, choices)
    return "auto" if word == "auto" else word == "on"


def check_time_limit(v: Any, name: str = "time_limit") -> float:
    """A solver time limit: positive and finite (0 is not 'no limit'; leave it unset for the default)."""
    return check_float(name, v, 0.0, MAX_TIME_LIMIT_S, lo_open=True, what="a number of seconds")


#: Exact-solver options a preset or the Python API may set: ``backend`` names the exact model for ``auto``
#: (cpsat, milp) or the MILP library (highs, cbc).
SOLVER_BACKENDS: tuple[str, ...] = ("cpsat", "milp", "highs", "cbc")


def check_solver_options(opts: Any) -> dict[str, Any]:
    """``threads``, ``relative_gap`` and ``backend`` checked; other keys (backend tuning such as
    ``resolution_s``) pass through to the solver untouched."""
    if not isinstance(opts, dict):
        raise SettingsError(f"must be a mapping of option: value, got {type(opts).__name__}", field="solver_options")
    out = dict(opts)
    if out.get("threads") is not None:
        out["threads"] = check_int("threads", out["threads"], 1, MAX_THREADS)
    if out.get("relative_gap") is not None:
        out["relative_gap"] = check_float("relative_gap", out["relative_gap"], 0.0, 1.0, what="a fraction")
    if out.get("backend") is not None:
        out["backend"] = check_choice("backend", out["backend"], SOLVER_BACKENDS)
    return out


# ---------------------------------------------------------------------- recompute
@dataclass(frozen=True)
class RecomputeSpec:
    """One stage's activation recompute, as Megatron expresses it.

    ``granularity`` none / selective / full; ``modules`` for selective (Megatron's names); ``method``
    (``block`` or ``uniform``) and ``num_layers`` for full: block recomputes the first ``num_layers`` layers
    of every model chunk (0 = all of them, what ``full`` means), uniform checkpoints groups of
    ``num_layers`` layers."""

    name: str
    granularity: str
    modules: tuple[str, ...] = ()
    method: str = "block"
    num_layers: int = 0

    @property
    def full_layers(self) -> bool:
        """Every layer is recomputed whole (plain ``full``, or uniform groups)."""
        return self.granularity == "full" and (self.method == "uniform" or self.num_layers == 0)


def parse_recompute(value: Any, name: str = "recompute") -> RecomputeSpec:
    """A recompute value: a ladder level (``none, selective, sel-mlp, sel-moe, full``), ``full:K`` (block, first K
    layers per chunk), ``uniform:N``, or a comma-separated set of Megatron recompute modules."""
    if not isinstance(value, str) or not value:
        raise SettingsError(f"must be a recompute level or module list, got {_show(value)}", field=name)
    if value == "none":
        return RecomputeSpec("none", "none")
    if value == "full":
        return RecomputeSpec("full", "full")
    if value in LADDER_MODULES:
        return RecomputeSpec(value, "selective", LADDER_MODULES[value])
    head, sep, tail = value.partition(":")
    if sep and head in ("full", "uniform"):
        k = check_int(name, int(tail) if tail.isdigit() else tail, 1, 1_000_000)
        return RecomputeSpec(f"{head}:{k}", "full", method="block" if head == "full" else "uniform", num_layers=k)
    mods = [m.strip() for m in value.split(",")]
    bad = [m for m in mods if m not in RECOMPUTE_MODULES]
    if bad or not mods:
        raise SettingsError(
            f"must be one of {', '.join(RECOMPUTE_LEVELS)}, full:K, uniform:N or modules from "
            f"{', '.join(RECOMPUTE_MODULES)}; got {_show(value)}",
            field=name,
        )
    canon = tuple(m for m in RECOMPUTE_MODULES if m in mods)
    for level, ms in LADDER_MODULES.items():
        if tuple(sorted(ms)) == tuple(sorted(canon)):
            return RecomputeSpec(level, "selective", ms)
    return RecomputeSpec(",".join(canon), "selective", canon)


def check_recompute(value: Any, name: str = "recompute") -> str:
    """The canonical spelling of a recompute value (raises SettingsError naming ``name``)."""
    return parse_recompute(value, name).name


# ---------------------------------------------------------------------- parallel config
@dataclass(frozen=True, order=True)
class ParallelConfig:
    tp: int = 1
    cp: int = 1
    dp: int = 1
    ep: int = 1
    etp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "dp", "ep", "etp"):
            v = getattr(self, name)
            if type(v) is not int or v < 1 or v > MAX_DEVICES:
                object.__setattr__(self, name, check_int(name, v, 1, MAX_DEVICES))

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


# ---------------------------------------------------------------------- run settings
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
    fp8_recipe: str = "tensorwise"
    imbalance: float = 1.0
    dispatcher: str = "alltoall"
    distributed_optimizer: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    overlap_ep_comm: bool = False
    # TP all-gather/reduce-scatter overlapped with the GEMMs they feed (Megatron --tp-comm-overlap with
    # Transformer Engine userbuffers; MindSpeed --use-mc2 fuses them into the matmul kernels)
    tp_comm_overlap: bool = False
    # CUDA graphs: "none", "layer" (whole layers) or a comma-separated list of CUDA_GRAPH_PARTS
    cuda_graph_scope: str = "none"
    # The capacity rule: a rank fits when allocated * (1 + fragmentation) + context + buffers <= capacity *
    # (1 - memory_headroom) (cost/memory.py). Default 0: fragmentation, context and DeepEP buffers are named
    # device terms, and public runs used up to 99.4% of the visible memory (GLM-5.2 on H100, device-level peak
    # 79.10 of ~79.6 GiB; FlagPerf Llama3-8B PP2DP4 on A800 76/80 GiB), so any reserve above 0.6% would call
    # runs that really ran infeasible. Raise it to plan with a safety margin.
    memory_headroom: float = 0.0
    optimizer_offload: bool = False
    # Model-state precision (Megatron: --grad-reduce-in-bf16, --fp8-param-gather, the precision-aware
    # optimizer's --exp-avg-dtype/--exp-avg-sq-dtype and --main-params-dtype); cost/memory.py prices them.
    grad_reduce_in_bf16: bool = False
    fp8_param_gather: bool = False
    optimizer_state_dtype: str = "fp32"
    main_params_dtype: str = "fp32"
    # Megatron-FSDP (--use-megatron-fsdp --data-parallel-sharding-strategy ...); "none" = DDP/distributed optimizer
    fsdp: str = "none"
    # Fine-grained activation offloading (--fine-grained-activation-offloading --offload-modules ...)
    offload_modules: tuple[str, ...] = ()
    # Hidden and attention dropout on (Megatron's default 0.1: dropout masks are stored) or off (0.0)
    dropout: bool = False
    # Megatron-LM's pre-Core GPT (``megatron/model``, the default before ``--use-mcore-models``; FlagScale's
    # 2023-24 LLaMA): it keeps more per layer than Megatron-Core with Transformer Engine (cost/memory.py,
    # ``_legacy_terms``). For judging measurements of such runs; no exporter writes it (Megatron-Core only).
    legacy_model: bool = False
    # The gated MLP activation and the rotary embedding as single fused kernels (Megatron-Core's fused SwiGLU and
    # apply_rotary_pos_emb fusion; MindSpeed-LLM's --use-fused-swiglu / --use-fused-rotary-pos-emb, torch_npu
    # npu_swiglu / npu_rotary_mul), or as chains of element-wise torch ops (MindSpeed-LLM without those flags,
    # and its GeGLU always): priced in cost/layer.py (UNFUSED_GLU_PASSES, UNFUSED_ROPE_PASSES).
    fused_swiglu: bool = True
    fused_rope: bool = True
    # Megatron's --cross-entropy-loss-fusion (off by default in Megatron-LM; on in the Megatron-Bridge and NeMo 2
    # model providers): the fused vocabulary-parallel cross-entropy, or the unfused one on FP32 logits
    # (cost/model.py CE_BYTES, CE_FUSED_BYTES)
    cross_entropy_fusion: bool = False
    # ModelLink's legacy GShard MoE layer (MindSpeed ``ascendspeed/components/moe`` @224ae35e, DeepSpeed-style,
    # run by MindSpeed-LLM's non-Mcore Mixtral) with this training capacity factor (``--moe-train-capacity-factor``);
    # 0 = Megatron-Core's dropless MoE. Priced in cost/layer.py and CostModel._ep_comm; for judging measurements of
    # such runs: no exporter writes it.
    gshard_capacity_factor: float = 0.0
    # Host side of optimizer offload (HAPMoE offloads FP32 optimizer states for Mixtral-L on its smallest
    # clusters). Assumptions, not measurements: per-device host-link share and CPU Adam rate per rank.
    offload_host_GBps: float = 10.0
    offload_adam_params_per_s: float = 1.0e9

    def __post_init__(self) -> None:
        for name, v in _checked(self).items():
            if v is not getattr(self, name):
                object.__setattr__(self, name, v)

    @property
    def expert_rows_factor(self) -> float:
        """Routed rows each expert runs, relative to its balanced share: the GShard layer pads every expert to
        its capacity (tokens past it are dropped), so the capacity factor; dropless Megatron-Core the
        load-imbalance factor."""
        return self.gshard_capacity_factor or self.imbalance

    def with_(self, **kw: object) -> Settings:
        return replace(self, **kw)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """Field -> value, JSON-shaped (tuples as lists), so it equals what a plan file reads back."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}


#: The on/off settings: every ``bool`` field of :class:`Settings` (a runs file may set each of them too).
BOOL_SETTINGS: tuple[str, ...] = tuple(f.name for f in fields(Settings) if f.type == "bool")


def _jsonable(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _checked(s: Settings) -> dict[str, Any]:
    """Every field of ``s`` checked (and normalised: numpy scalars to int/float); raises SettingsError."""
    out: dict[str, Any] = {
        "seq_length": check_int("seq_length", s.seq_length, 1, MAX_SEQ_LENGTH),
        "global_batch_size": check_int("global_batch_size", s.global_batch_size, 1, MAX_BATCH),
        "micro_batch_size": check_int("micro_batch_size", s.micro_batch_size, 1, MAX_BATCH),
        "precision": check_choice("precision", s.precision, PRECISIONS),
        "fp8_recipe": check_choice("fp8_recipe", s.fp8_recipe, FP8_RECIPES),
        "imbalance": check_float("imbalance", s.imbalance, 1.0, MAX_IMBALANCE),
        "gshard_capacity_factor": check_float("gshard_capacity_factor", s.gshard_capacity_factor, 0.0, MAX_IMBALANCE),
        "dispatcher": check_choice("dispatcher", s.dispatcher, DISPATCHERS),
        "memory_headroom": check_float("memory_headroom", s.memory_headroom, 0.0, 0.9),
        "offload_host_GBps": check_float("offload_host_GBps", s.offload_host_GBps, 0.0, 1e6, lo_open=True),
        "offload_adam_params_per_s": check_float(
            "offload_adam_params_per_s", s.offload_adam_params_per_s, 0.0, 1e15, lo_open=True
        ),
    }
    out["cuda_graph_scope"] = check_graph_scope(s.cuda_graph_scope)
    for name in BOOL_SETTINGS:
        out[name] = check_bool(name, getattr(s, name))
    out["optimizer_state_dtype"] = check_choice("optimizer_state_dtype", s.optimizer_state_dtype, STATE_DTYPES)
    out["main_params_dtype"] = check_choice("main_params_dtype", s.main_params_dtype, MAIN_PARAM_DTYPES)
    out["fsdp"] = check_choice("fsdp", s.fsdp, FSDP_STRATEGIES)
    out["offload_modules"] = check_offload_modules(s.offload_modules)
    if out["fp8_param_gather"] and out["precision"] != "fp8":
        raise SettingsError("needs precision fp8", field="fp8_param_gather")
    if out["legacy_model"] and out["precision"] != "bf16":
        raise SettingsError("the pre-Core model is priced in BF16 only", field="legacy_model")
    if 0.0 < out["gshard_capacity_factor"] < 1.0:
        raise SettingsError(
            "a GShard capacity factor below 1 drops tokens of a balanced load; give 0 (dropless) or >= 1",
            field="gshard_capacity_factor",
        )
    if out["fsdp"] != "none" and out["optimizer_offload"]:
        raise SettingsError("Megatron-FSDP and optimizer CPU offload are not combined here", field="fsdp")
    if (out["optimizer_state_dtype"] != "fp32" or out["main_params_dtype"] != "fp32") and not out[
        "distributed_optimizer"
    ]:
        raise SettingsError(
            "the precision-aware optimizer needs the distributed optimizer", field="optimizer_state_dtype"
        )
    if out["global_batch_size"] % out["micro_batch_size"]:
        raise SettingsError(
            f"{out['micro_batch_size']} does not divide the global batch size {out['global_batch_size']}",
            field="micro_batch_size",
        )
    return out


def check_offload_modules(v: Any, name: str = "offload_modules") -> tuple[str, ...]:
    """Megatron's fine-grained activation offload modules, canonical order; ``attn_proj`` needs ``core_attn``
    (TransformerConfig rejects it alone)."""
    if isinstance(v, str):
        v = tuple(x.strip() for x in v.split(",") if x.strip())
    if not isinstance(v, list | tuple) or not all(isinstance(x, str) for x in v):
        raise SettingsError(f"must be a list of module names, got {_show(v)}", field=name)
    bad = [x for x in v if x not in OFFLOAD_MODULES]
    if bad:
        raise SettingsError(f"must be modules from {', '.join(OFFLOAD_MODULES)}, got {bad[0]!r}", field=name)
    out = tuple(m for m in OFFLOAD_MODULES if m in v)
    if "attn_proj" in out and "core_attn" not in out:
        raise SettingsError("attn_proj can only be offloaded together with core_attn", field=name)
    return out


SETTINGS_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Settings))


def settings_from_dict(d: dict[str, Any], base: Settings | None = None) -> Settings:
    """Settings from a mapping of field -> value (unknown keys raise, missing keys keep ``base``'s)."""
    unknown = sorted(set(map(str, d)) - set(SETTINGS_FIELDS))
    if unknown:
        raise SettingsError(f"unknown setting; known: {', '.join(SETTINGS_FIELDS)}", field=unknown[0])
    return replace(base or Settings(), **d)


class ModelDefaults(Protocol):
    """What :func:`make_settings` reads of a model entry's ``defaults`` (``specs.model.TrainingDefaults``); a
    protocol, because the specs layer sits above this module and imports it."""

    seq_length: int
    global_batch_size: int
    micro_batch_size: int
    moe_token_dispatcher_type: str


class HasDefaults(Protocol):
    @property
    def defaults(self) -> ModelDefaults: ...


def make_settings(model: HasDefaults, base: Settings | None = None, **kw: Any) -> Settings:
    """Settings with the model entry's defaults (sequence, global batch, dispatcher) where not given.

    ``kw`` are Settings fields; None means "not given" (so front ends can pass their optional flags as they
    are), an unknown name raises naming it."""
    d = model.defaults
    s = base or Settings(
        seq_length=d.seq_length,
        global_batch_size=d.global_batch_size,
        micro_batch_size=d.micro_batch_size,
        dispatcher=d.moe_token_dispatcher_type,
    )
    clean = {k: v for k, v in kw.items() if v is not None}
    unknown = sorted(set(clean) - set(Settings.__dataclass_fields__))
    if unknown:
        raise SettingsError("unknown setting", field=unknown[0])
    return replace(s, **clean) if clean else s
