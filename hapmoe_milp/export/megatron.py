"""Megatron-LM export: ``pretrain_gpt.py`` arguments, pipeline layout, hostfile and torchrun scripts.

Upstream Megatron has one mesh shape for every pipeline stage, so only plans whose stages share one
(TP, CP, DP, EP, ETP) are exportable; device types enter only through rank order (PP is the outermost
dimension of ``tp-cp-ep-dp-pp``, so pipeline stage ``i`` owns global ranks ``[i*g, (i+1)*g)``) and the
hostfile/launch scripts put those ranks on the stage's device type.

Layer placement, in order of preference (all reproduce the plan's per-rank counts exactly):

1. nothing, when every rank has ``num_layers / PP`` decoder layers (MTP on the last rank);
2. ``--decoder-first/last-pipeline-num-layers`` when only the first and/or last rank differ;
3. ``--pipeline-model-parallel-layout`` otherwise (reference/megatron.md §1.5 grammar).

With VPP > 1 each rank's layers are split into its chunks as evenly as possible (``common.rank_chunks``)
and a flag set is only used when Megatron's own chunking gives exactly that split.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hapmoe_milp.config import ParallelConfig, Recompute, Settings
from hapmoe_milp.errors import ExportError
from hapmoe_milp.export.common import (
    GENERATED_MARK,
    VISIBLE_DEVICES_ENV,
    StageLayers,
    device_of_host,
    launch_units,
    moe_layer_freq_arg,
    nearest_expressible_recompute,
    plan_chunks,
    recompute_flag_args,
    recompute_from_flags,
)
from hapmoe_milp.export.megatron_arch import ENTRY_GPT, entry_script, feature_args, megatron_gaps, position_embedding

# The layout grammar lives below the exporters (knobs.py reads it too); re-exported for export's own users.
from hapmoe_milp.layout import (  # noqa: F401
    LAYOUT_CHARS,
    MAX_LAYOUT_EXPANSION,
    compress_layout,
    layout_chunks,
    layout_grid,
    layout_problems,
    layout_rank_layers,
    parse_layout,
)
from hapmoe_milp.plan import Plan, Stage
from hapmoe_milp.specs.cluster import ClusterSpec
from hapmoe_milp.specs.model import ModelSpec

ARGS_FILE = "megatron_args.txt"


def build_layout(plan: Plan, model: ModelSpec) -> str:
    """The layout string for the plan's canonical chunking (``common.plan_chunks``)."""
    chunks = plan_chunks(plan, model)
    pp, vpp = plan.pp, max(1, plan.vpp)
    n = pp * vpp
    stages: list[str] = []
    for j in range(n):
        v, r = divmod(j, pp)
        c = chunks[r][v]
        stages.append(("E" if j == 0 else "") + "t" * c.decoder + "m" * c.mtp + ("L" if j == n - 1 else ""))
    return compress_layout(stages)


# ---------------------------------------------------------------------- choosing the split flags
@dataclass(frozen=True)
class PipelineSplit:
    """How the layer split is expressed: at most one of layout / first-last / nothing."""

    layout: str | None = None
    first: int | None = None
    last: int | None = None
    vpp: int | None = None  # --num-virtual-stages-per-pipeline-rank (only without a layout)


def megatron_chunks(
    pp: int, num_layers: int, mtp: int, vpp: int, first: int | None, last: int | None
) -> list[list[StageLayers]] | None:
    """Megatron's own split for the first/last flags (or an even split when both are None), or None when
    Megatron would reject those flags (TransformerConfig / get_num_layers_to_build)."""
    rest, left = num_layers, pp
    if first is not None:
        rest, left = rest - first, left - 1
    if last is not None:
        rest, left = rest - last, left - 1
    if left < 0 or bool(rest) != bool(left) or (left and rest % left):
        return None
    mid = rest // left if left else 0
    counts = [mid] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    if any(c <= 0 for c in counts) or any(c % vpp for c in counts):
        return None
    out = [[StageLayers(decoder=c // vpp, mtp=0) for _ in range(vpp)] for c in counts]
    if mtp:
        lc = out[-1][-1]
        out[-1][-1] = StageLayers(decoder=lc.decoder, mtp=mtp)
    return out


def pipeline_split(plan: Plan, model: ModelSpec) -> PipelineSplit:
    pp, vpp = plan.pp, max(1, plan.vpp)
    if pp == 1:
        return PipelineSplit()
    want = plan_chunks(plan, model)
    counts = [sum(c.decoder for c in row) for row in want]
    vflag = vpp if vpp > 1 else None
    for first, last in ((None, None), (counts[0], None), (None, counts[-1]), (counts[0], counts[-1])):
        if megatron_chunks(pp, model.num_layers, model.mtp_num_layers, vpp, first, last) == want:
            return PipelineSplit(first=first, last=last, vpp=vflag)
    return PipelineSplit(layout=build_layout(plan, model))


# ---------------------------------------------------------------------- arguments
def _mesh(plan: Plan) -> ParallelConfig:
    cfgs = {s.cfg for s in plan.stages}
    if len(cfgs) != 1:
        labels = ", ".join(sorted(c.label() for c in cfgs))
        raise ExportError(
            f"[rule_uniform_mesh] Megatron-LM needs one mesh shape for every stage; this plan has {labels} "
            "(export it with --target flagscale)",
            field="stages",
        )
    return plan.stages[0].cfg


def recompute_args(plan: Plan, model: ModelSpec) -> list[str]:
    levels = {s.recompute for s in plan.stages}
    if len(levels) > 1:
        _, note = nearest_expressible_recompute(plan, "megatron")
        raise ExportError(
            f"[rule_uniform_recompute] {note}; call nearest_expressible_recompute(plan) and re-price it",
            field="stages.recompute",
        )
    level: Recompute = levels.pop()
    # block recomputes the first K layers of every model chunk; K = the largest chunk covers them all
    k = max(c.decoder for row in plan_chunks(plan, model) for c in row)
    return recompute_flag_args(level, model, k)


def model_args(model: ModelSpec) -> list[str]:
    """Model shape and MoE flags (Megatron names, reference/megatron.md §1.3).

    Position embeddings are RoPE unless the model has a learned absolute table (``position_embedding``). The vocabulary
    size is not an architecture flag in Megatron: it comes from the tokenizer (see ``tokenizer_args``).
    """
    m = model
    a = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size)]
    a += ["--ffn-hidden-size", str(m.ffn), "--num-attention-heads", str(m.num_attention_heads)]
    if m.multi_latent_attention:
        a += ["--multi-latent-attention"]
        if m.q_lora_rank:
            a += ["--q-lora-rank", str(m.q_lora_rank)]
        a += ["--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim", str(m.qk_head_dim)]
        a += ["--qk-pos-emb-head-dim", str(m.qk_pos_emb_head_dim), "--v-head-dim", str(m.v_head_dim)]
    else:
        if m.groups != m.num_attention_heads:
            a += ["--group-query-attention", "--num-query-groups", str(m.groups)]
        if m.kv_channels:
            a += ["--kv-channels", str(m.kv_channels)]
    if m.swiglu:
        a += ["--swiglu"]
    a += ["--normalization", m.normalization, "--position-embedding-type", position_embedding(m)]
    if m.untie_embeddings_and_output_weights:
        a += ["--untie-embeddings-and-output-weights"]
    if not m.add_bias_linear:
        a += ["--disable-bias-linear"]
    if m.add_qkv_bias:
        a += ["--add-qkv-bias"]
    if m.qk_layernorm:
        a += ["--qk-layernorm"]
    if m.make_vocab_size_divisible_by != 128:
        a += ["--make-vocab-size-divisible-by", str(m.make_vocab_size_divisible_by)]
    if m.mtp_num_layers:
        a += ["--mtp-num-layers", str(m.mtp_num_layers)]
    if m.is_moe:
        a += ["--num-experts", str(m.num_experts), "--moe-router-topk", str(m.moe_router_topk)]
        a += ["--moe-ffn-hidden-size", str(m.expert_ffn)]
        if not m.is_hybrid:  # a hybrid model's MoE layers are the E's of its pattern
            a += ["--moe-layer-freq", moe_layer_freq_arg(m)]
        if m.moe_shared_expert_intermediate_size:
            a += ["--moe-shared-expert-intermediate-size", str(m.moe_shared_expert_intermediate_size)]
            if m.moe_shared_expert_gate:
                a += ["--moe-shared-expert-gate"]
        if m.moe_router_topk == 1:
            a += ["--moe-router-pre-softmax"]  # TransformerConfig rejects top-1 softmax routing without it
        if m.moe_router_bias:
            # a per-expert router bias is DeepSeek's aux-free balancing; Megatron allows it only with sigmoid
            a += ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias"]
    return a + feature_args(m)


def offload_args(st: Settings) -> list[str]:
    """Optimizer states in host memory, as the cost model prices it (all FP32 master weights and Adam
    moments offloaded: fraction 1.0). Megatron requires the precision-aware optimizer for it
    (``validate_args``), which in turn needs the distributed optimizer (``OptimizerConfig``)."""
    if not st.optimizer_offload:
        return []
    return [
        "--optimizer-cpu-offload",
        "--use-precision-aware-optimizer",
        "--optimizer-offload-fraction",
        OFFLOAD_FRACTION,
    ]


OFFLOAD_FRACTION = "1.0"


def memory_args(st: Settings) -> list[str]:
    """The memory levers the cost model priced (cost/memory.py), as Megatron flags (names at core_v0.16.1):
    gradient and state precision, FP8 parameters, Megatron-FSDP (which validate_args allows only with the
    fsdp_dtensor checkpoint format), fine-grained activation offload, and dropout off unless asked for."""
    a: list[str] = []
    if st.grad_reduce_in_bf16:
        a += ["--grad-reduce-in-bf16"]
    if st.fp8_param_gather:
        a += ["--fp8-param-gather"]
    if (st.optimizer_state_dtype != "fp32" or st.main_params_dtype != "fp32") and not st.optimizer_offload:
        a += ["--use-precision-aware-optimizer"]  # optimizer offload already emits it
    if st.optimizer_state_dtype != "fp32":
        a += ["--exp-avg-dtype", st.optimizer_state_dtype, "--exp-avg-sq-dtype", st.optimizer_state_dtype]
    if st.main_params_dtype != "fp32":
        a += ["--main-params-dtype", st.main_params_dtype]
    if st.fsdp != "none":
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", st.fsdp, "--ckpt-format", "fsdp_dtensor"]
    if st.offload_modules:
        a += ["--fine-grained-activation-offloading", "--offload-modules", *st.offload_modules]
    if not st.dropout:
        a += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    return a


def null_tokenizer_vocab_arg(vocab_size: int, adds_eod: bool) -> int:
    """``--vocab-size`` for Megatron's NullTokenizer to have exactly ``vocab_size`` tokens.

    Up to Megatron-Core 0.17 the NullTokenizer adds one EOD token to ``--vocab-size`` (both the legacy
    ``_NullTokenizer`` and ``megatron/core/tokenizers/.../null_tokenizer.py``); from 0.18 it uses the value as
    is, with EOD = vocab_size - 1. The launch scripts find out which at run time (``NULL_VOCAB_PROBE``)."""
    return vocab_size - 1 if adds_eod else vocab_size


# Run by the launch scripts with the Megatron checkout and the wanted vocabulary: prints the --vocab-size
# that makes the checkout's NullTokenizer report exactly that many tokens. It loads the tokenizer file on
# its own (no package import, so no GPU or torch needed); without that file the checkout predates the core
# tokenizers and uses the legacy one, which adds an EOD token.
NULL_VOCAB_PROBE = """\
import importlib.util, pathlib, sys
root, want = pathlib.Path(sys.argv[1]), int(sys.argv[2])
f = root / "megatron" / "core" / "tokenizers" / "text" / "libraries" / "null_tokenizer.py"
if not f.is_file():
    print(want - 1)
else:
    spec = importlib.util.spec_from_file_location("_hapmoe_null_tokenizer", f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    print(want - (mod.NullTokenizer(want).vocab_size - want))
"""


def tokenizer_args(model: ModelSpec, vocab_arg: int | str | None = None) -> list[str]:
    """Synthetic-data tokenizer flags. ``vocab_arg`` is the ``--vocab-size`` value (the launch scripts pass
    ``$NULL_VOCAB``, found by ``NULL_VOCAB_PROBE``); by default Megatron-Core <= 0.17's convention. Real runs
    replace these with their own tokenizer and data flags."""
    v = vocab_arg if vocab_arg is not None else null_tokenizer_vocab_arg(model.vocab_size, adds_eod=True)
    return ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(v)]


def megatron_args(plan: Plan, model: ModelSpec, cluster: ClusterSpec, settings: Settings | None = None) -> list[str]:
    """The exact ``pretrain_gpt.py`` arguments for ``plan`` (tokens, argv style).

    Raises ExportError when Megatron cannot express the plan (different meshes per stage, different
    recompute levels per stage); ``validate.check`` runs every other rule.
    """
    del cluster  # the mesh and layout do not depend on it; placement is in hostfile()/launch_scripts()
    st = plan.settings(settings)
    for gap in megatron_gaps(model):
        if gap.blocking:
            raise ExportError(
                f"[rule_megatron_architecture] Megatron-LM cannot build {model.name}: {gap.feature}; "
                f"it runs under {gap.runtime}",
                field="model",
            )
    cfg = _mesh(plan)
    a = ["--tensor-model-parallel-size", str(cfg.tp), "--pipeline-model-parallel-size", str(plan.pp)]
    a += ["--context-parallel-size", str(cfg.cp)]
    if model.is_moe:
        a += ["--expert-model-parallel-size", str(cfg.ep), "--expert-tensor-parallel-size", str(cfg.etp)]
    if cfg.tp > 1:
        a += ["--sequence-parallel"]  # required for MoE with TP>1 (MoELayer raises at runtime otherwise)
    split = pipeline_split(plan, model)
    if model.is_hybrid and (split.layout is not None or split.vpp is not None):
        raise ExportError(
            "[rule_hybrid_pipeline_split] Megatron's hybrid (Mamba) stack splits layers evenly or with "
            "--decoder-first/last-pipeline-num-layers only, without virtual stages (MambaStack); "
            f"this plan needs {'virtual stages' if split.vpp else 'a layout'}",
            field="stages",
        )
    if split.layout is not None:
        a += ["--pipeline-model-parallel-layout", split.layout]
    if split.first is not None:
        a += ["--decoder-first-pipeline-num-layers", str(split.first)]
    if split.last is not None:
        a += ["--decoder-last-pipeline-num-layers", str(split.last)]
    if split.vpp is not None:
        a += ["--num-virtual-stages-per-pipeline-rank", str(split.vpp)]
    a += ["--micro-batch-size", str(plan.micro_batch_size), "--global-batch-size", str(plan.global_batch_size)]
    a += ["--seq-length", str(plan.seq_length), "--max-position-embeddings", str(plan.seq_length)]
    a += model_args(model)
    if model.is_moe:
        a += ["--moe-token-dispatcher-type", plan.dispatcher, "--moe-grouped-gemm"]
        if st.overlap_ep_comm:
            a += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    a += recompute_args(plan, model)
    if st.distributed_optimizer:
        a += ["--use-distributed-optimizer"]
    a += offload_args(st)
    a += memory_args(st)
    if st.overlap_grad_reduce:
        a += ["--overlap-grad-reduce"]
    if st.overlap_param_gather and st.distributed_optimizer and st.overlap_grad_reduce:
        a += ["--overlap-param-gather"]
    a += ["--bf16"]
    if plan.precision == "fp8":
        # the plan's recipe (tensorwise, blockwise or mxfp8; never delayed scaling, which rejects the
        # layernorm/moe_act selective recompute we emit)
        a += ["--fp8-format", "hybrid", "--fp8-recipe", st.fp8_recipe]
    if st.tp_comm_overlap and plan.stages[0].cfg.tp > 1:
        a += ["--tp-comm-overlap"]
    a += cuda_graph_args(st.cuda_graph_scope)
    a += fusion_args(st, model)
    return a


def fusion_args(st: Settings, model: ModelSpec) -> list[str]:
    """The element-wise fusions the cost model priced (cost/layer.py, cost/model.py), as Megatron flags
    (core_v0.16.1 megatron/training/arguments.py ``--no-bias-swiglu-fusion``, ``--no-rope-fusion``; the
    ``cross_entropy_loss_fusion`` field of ModelParallelConfig, a flag through ArgumentGroupFactory). Megatron's
    defaults are the SwiGLU and rotary fusions on and the cross-entropy fusion off, so only a departure is
    written."""
    a: list[str] = []
    if not st.fused_swiglu and model.swiglu:
        a += ["--no-bias-swiglu-fusion"]
    if not st.fused_rope and position_embedding(model) == "rope" and not model.multi_latent_attention:
        a += ["--no-rope-fusion"]
    if st.cross_entropy_fusion:
        a += ["--cross-entropy-loss-fusion"]
    return a


def cuda_graph_args(scope: str) -> list[str]:
    """Megatron's CUDA-graph flags: whole layers with the local implementation, named parts with
    Transformer Engine's (``--cuda-graph-impl`` / ``--cuda-graph-scope``, megatron/training/arguments.py)."""
    if scope == "none":
        return []
    if scope == "layer":
        return ["--cuda-graph-impl", "local"]
    return ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", *scope.split(",")]


def format_args_file(args: Sequence[str]) -> str:
    """One flag per line with its values; the launch scripts read it with globbing off (layouts hold ``*``)."""
    lines: list[list[str]] = []
    for tok in args:
        if tok.startswith("--") or not lines:
            lines.append([tok])
        else:
            lines[-1].append(tok)
    return "".join(" ".join(line) + "\n" for line in lines)


# ---------------------------------------------------------------------- parsing our own output back
def parse_megatron_args(args: Sequence[str] | str) -> dict[str, Any]:
    """Flags to ``{dest: value}`` like argparse (``--foo-bar`` -> ``foo_bar``): bare flags are True, one
    value is an int when it looks like one, several values are a list. Accepts the token list or the text
    of ``megatron_args.txt`` (whitespace-separated, ``#`` comments ignored)."""
    if isinstance(args, str):
        tokens = [t for line in args.splitlines() for t in line.split("#", 1)[0].split()]
    else:
        tokens = list(args)
    out: dict[str, Any] = {}
    key: str | None = None
    vals: list[Any] = []

    def flush() -> None:
        if key is None:
            return
        if key in out:
            raise ExportError(f"flag --{key.replace('_', '-')} is given twice", field=ARGS_FILE)
        out[key] = True if not vals else (vals[0] if len(vals) == 1 else list(vals))

    for tok in tokens:
        if tok.startswith("--"):
            flush()
            key, vals = tok[2:].replace("-", "_"), []
        elif key is None:
            raise ExportError(f"expected a --flag first, got {tok!r}", field=ARGS_FILE)
        else:
            vals.append(int(tok) if re.fullmatch(r"-?\d+", tok) else tok)
    flush()
    return out


def parse_hostfile(text: str) -> list[tuple[str, int]]:
    """``(host, slots)`` per line, in order; comments and blank lines skipped."""
    out = []
    for i, raw in enumerate(text.splitlines()):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        mt = re.fullmatch(r"(\S+)\s+slots=(\d+)(?:\s+type=(\S+))?", line)
        if mt is None:
            raise ExportError(f"line {i + 1}: expected 'HOST slots=N', got {raw!r}", field="hostfile")
        out.append((mt.group(1), int(mt.group(2))))
    return out


def plan_from_megatron_args(
    args: Sequence[str] | str | dict[str, Any],
    hostfile_text: str,
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    family: str = "megatron",
) -> Plan:
    """Rebuild the plan from exported arguments and hostfile (the round-trip check of the exporter).

    Device types come from the hostfile's rank order (host names ``<type>-node<k>``); layer counts from
    the layout, the first/last flags or the even split; recompute from the recompute flags.
    """
    p = args if isinstance(args, dict) else parse_megatron_args(args)
    tp = int(p.get("tensor_model_parallel_size", 1))
    pp = int(p.get("pipeline_model_parallel_size", 1))
    cp = int(p.get("context_parallel_size", 1))
    ep = int(p.get("expert_model_parallel_size", 1))
    etp = int(p.get("expert_tensor_parallel_size", tp if model.is_moe else 1))
    ranks: list[str] = []
    for host, slots in parse_hostfile(hostfile_text):
        ranks += [device_of_host(host)] * slots
    world = len(ranks)
    if world % (tp * pp * cp):
        raise ExportError(f"world size {world} is not divisible by TP*PP*CP = {tp * pp * cp}", field="hostfile")
    dp = world // (tp * pp * cp)
    cfg = ParallelConfig(tp=tp, cp=cp, dp=dp, ep=ep, etp=etp)
    g = cfg.devices
    vpp = int(p.get("num_virtual_stages_per_pipeline_rank", 1))
    mtp = int(p.get("mtp_num_layers", 0))
    layout = p.get("pipeline_model_parallel_layout")
    ch: list[list[StageLayers]] | None = None
    if layout is not None:
        stages = parse_layout(str(layout))
        vpp = len(stages) // pp
        per_rank = [c.total for c in layout_rank_layers(str(layout), pp)]
    else:
        ch = megatron_chunks(
            pp,
            int(p["num_layers"]),
            mtp,
            vpp,
            p.get("decoder_first_pipeline_num_layers"),
            p.get("decoder_last_pipeline_num_layers"),
        )
        if ch is None:
            raise ExportError("the layer-split flags do not give a valid Megatron split", field=ARGS_FILE)
        per_rank = [sum(c.total for c in row) for row in ch]
    biggest = 1
    if layout is not None:
        biggest = max(c.decoder for row in layout_chunks(str(layout), pp) for c in row)
    elif ch is not None:
        biggest = max(c.decoder for row in ch for c in row)
    level: Recompute = recompute_from_flags(
        p.get("recompute_granularity"),
        p.get("recompute_method"),
        p.get("recompute_num_layers"),
        p.get("recompute_modules"),
        biggest,
    )
    out_stages = []
    pos = 0
    for i in range(pp):
        types = set(ranks[i * g : (i + 1) * g])
        if len(types) != 1:
            raise ExportError(f"pipeline stage {i} spans device types {sorted(types)}", field="hostfile")
        out_stages.append(Stage(types.pop(), cfg, pos, pos + per_rank[i], level))
        pos += per_rank[i]
    return Plan(
        model=model.name,
        cluster=cluster.name,
        family=family,  # type: ignore[arg-type]
        stages=tuple(out_stages),
        global_batch_size=int(p["global_batch_size"]),
        seq_length=int(p["seq_length"]),
        micro_batch_size=int(p["micro_batch_size"]),
        vpp=vpp,
        precision="fp8" if "fp8_format" in p else "bf16",
        dispatcher=str(p.get("moe_token_dispatcher_type", "alltoall")),
    )


# ---------------------------------------------------------------------- hostfile and launch scripts
def hostfile(plan: Plan, cluster: ClusterSpec) -> str:
    """``HOST slots=N`` per launch unit in global-rank order, so rank order puts every stage on its type.

    Host names are placeholders (``<type>-node<k>``). A host listed twice is a node split into two
    launch units (see ``launch_units``)."""
    lines = [f"# {GENERATED_MARK}: hosts in global rank order (pipeline stage i = ranks i*g .. i*g+g-1)"]
    for u in launch_units(plan, cluster):
        stages = ",".join(str(s) for s in u.stages)
        lines.append(f"# ranks {u.first_rank}-{u.last_rank}: stage {stages} on {u.device}")
        lines.append(f"{u.host} slots={u.nproc}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Flavor:
    """What a Megatron-style runtime's launch scripts differ in: the checkout they run from, the file
    the flags live in, the environment they export, and how the synthetic-data vocabulary is found
    (``probe_vocab``: ask the checkout, ``NULL_VOCAB_PROBE``; else its NullTokenizer adds an EOD)."""

    name: str
    checkout_var: str
    checkout_what: str
    args_file: str
    env: tuple[tuple[str, str, str], ...] = ()
    probe_vocab: bool = True


MEGATRON_FLAVOR = Flavor("megatron", "MEGATRON_LM", "your Megatron-LM checkout", ARGS_FILE)


def launch_scripts(
    plan: Plan,
    cluster: ClusterSpec,
    model: ModelSpec | None = None,
    settings: Settings | None = None,
    flavor: Flavor = MEGATRON_FLAVOR,
) -> dict[str, str]:
    """One torchrun script per launch unit (normally per node): ``launch_node<k>.sh``.

    Uses torchrun's static rendezvous (``--node-rank``), so node k's ranks are exactly the ones the
    hostfile assigns; MASTER_ADDR must be the address of the host of ``launch_node0.sh``. Nothing from the
    plan reaches the shell unquoted: values are integers or ``shlex.quote``d, names only appear in comments
    (and are safe names besides, checked by ``export_plan``).
    """
    del settings  # the flags are in megatron_args.txt; the scripts only place and start the processes
    units = launch_units(plan, cluster)
    entry = entry_script(model) if model is not None else ENTRY_GPT
    cfg_tp_cp = any(s.cfg.tp > 1 or s.cfg.cp > 1 for s in plan.stages)
    out: dict[str, str] = {}
    for u in units:
        lines = [
            "#!/usr/bin/env bash",
            comment(f"{GENERATED_MARK} for plan {plan.model} on {plan.cluster}."),
            comment(
                f"Launch unit {u.index} of {len(units)}: host {u.host} ({u.device}), global ranks "
                f"{u.first_rank}-{u.last_rank}, pipeline stage(s) {', '.join(str(s) for s in u.stages)}."
            ),
            "set -euo pipefail",
            'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
            f"NNODES={len(units)}",
            f"NODE_RANK={u.index}",
            f"NPROC_PER_NODE={u.nproc}",
            'MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR to the address of the first host in the hostfile}"',
            'MASTER_PORT="${MASTER_PORT:-29500}"',
            f'{flavor.checkout_var}="${{{flavor.checkout_var}:?set {flavor.checkout_var} to {flavor.checkout_what}}}"',
        ]
        if model is not None and not flavor.probe_vocab:
            lines += [
                "# Synthetic data unless DATA_ARGS is set (this checkout's NullTokenizer adds an EOD token).",
                'DATA_ARGS="${DATA_ARGS:-' + " ".join(tokenizer_args(model)) + '}"',
            ]
        elif model is not None:
            lines += [
                "# Synthetic data unless DATA_ARGS is set. Megatron's NullTokenizer adds an EOD token to",
                "# --vocab-size up to Megatron-Core 0.17 and not from 0.18: ask the checkout which it does.",
                'if [ -z "${DATA_ARGS:-}" ]; then',
                f'  NULL_VOCAB="$("${{PYTHON:-python3}}" - "${flavor.checkout_var}" '
                + str(int(model.vocab_size))
                + " <<'PY'",
                NULL_VOCAB_PROBE.rstrip("\n"),
                "PY",
                ')"',
                '  DATA_ARGS="' + " ".join(tokenizer_args(model, "$NULL_VOCAB")) + '"',
                "fi",
            ]
        else:
            lines.append('DATA_ARGS="${DATA_ARGS:---mock-data}"')
        if plan.settings().fsdp != "none":
            # validate_args asserts it is not 1 under Megatron-FSDP (and only warns about TP/CP then)
            lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=8  # Megatron-FSDP needs more than one")
        elif cfg_tp_cp:
            lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron asserts it with TP > 1 or CP > 1")
        if plan.settings().offload_modules:
            lines.append("export NVTE_CPU_OFFLOAD_V1=1  # validate_args: fine-grained offload with TE >= 2.10")
        for name, value, why in flavor.env:
            # the connection count set above (TP/CP, Megatron-FSDP) wins over the flavor's default
            if name != "CUDA_DEVICE_MAX_CONNECTIONS" or not (cfg_tp_cp or plan.settings().fsdp != "none"):
                lines.append(f"export {name}={shlex.quote(value)}  # {why}")
        if not u.whole_node_prefix:
            env = VISIBLE_DEVICES_ENV.get(u.vendor, "CUDA_VISIBLE_DEVICES")
            lines.append(f"export {env}={','.join(str(int(i)) for i in u.locals)}")
        lines += [
            "set -f  # no globbing: the layout and --moe-layer-freq values contain '*', '(' and '['",
            f'MEGATRON_ARGS=$(cat "$HERE/{flavor.args_file}")',
            'torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$NPROC_PER_NODE" \\',
            '  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\',
            f'  "${flavor.checkout_var}/{entry}" $MEGATRON_ARGS $DATA_ARGS "$@"',
        ]
        out[f"launch_node{u.index}.sh"] = "\n".join(lines) + "\n"
    return out


def comment(text: str) -> str:
    """A shell comment line: control characters (a newline would end the comment) become spaces."""
    return "# " + "".join(ch if ch.isprintable() else " " for ch in text)


def readme(plan: Plan, model: ModelSpec, cluster: ClusterSpec, args: Sequence[str]) -> str:
    units = launch_units(plan, cluster)
    split = pipeline_split(plan, model)
    entry = entry_script(model)
    vendors = sorted({u.vendor for u in units})
    lines = [
        f"{GENERATED_MARK}: Megatron-LM launch for {plan.model} on {plan.cluster}",
        "",
        f"Mesh: {plan.stages[0].cfg.label()}, PP {plan.pp}, VPP {plan.vpp}; "
        f"micro-batch {plan.micro_batch_size}, global batch {plan.global_batch_size}, "
        f"{plan.num_microbatches} micro-batches per iteration.",
        "",
        "Stages (rank order; pipeline stage i = global ranks i*g .. i*g+g-1):",
    ]
    for i, s in enumerate(plan.stages):
        lines.append(f"  stage {i}: {s.device:>8}  layers [{s.layer_start}, {s.layer_end})  recompute {s.recompute}")
    if split.layout:
        lines += ["", f"Layer layout: {split.layout}"]
    if plan.vpp > 1:
        lines += [
            "",
            "Note: with virtual pipeline stages each rank holds several non-contiguous chunks of layers; the",
            "layout above is the exact assignment (virtual stage j runs on pp rank j mod PP).",
        ]
    lines += [
        "",
        "Files:",
        f"  {ARGS_FILE}   model + parallelism flags for {entry} (one flag per line)",
        "  hostfile             hosts in global rank order (replace the placeholder names)",
        "  launch_node<k>.sh    one torchrun agent per line of the hostfile",
        "  plan.json            the plan with its predicted cost",
        "",
        "Run launch_node<k>.sh on host k of the hostfile, all with the same MASTER_ADDR (host 0) and",
        "MEGATRON_LM (a Megatron-LM checkout). DATA_ARGS defaults to synthetic data with a NullTokenizer of",
        f"exactly {model.vocab_size} tokens; set DATA_ARGS to your --data-path/--tokenizer-* flags for real data.",
        "Training-length flags (--train-iters, --lr, ...) are yours to add after the script name: extra",
        f"arguments to launch_node<k>.sh are passed on to {entry}.",
    ]
    if vendors == ["amd"]:
        lines += [
            "",
            "AMD GPUs: run these with the ROCm fork of Megatron-LM (ROCm/Megatron-LM) as MEGATRON_LM. Its flags",
            "are upstream's plus --no-gradient-accumulation-fusion, and the scripts export the environment",
            "its examples set (see hapmoe_milp/export/rocm.py for what differs and why).",
        ]
    if any(not u.whole_node_prefix for u in units):
        lines += [
            "",
            "Some nodes host two launch units (their ranks are not consecutive); those scripts restrict",
            "themselves to their devices with the vendor's *_VISIBLE_DEVICES variable.",
        ]
    lines += ["", "Full command of launch unit 0:", f"  torchrun ... {entry} " + shlex.join(list(args))]
    return "\n".join(lines) + "\n"
