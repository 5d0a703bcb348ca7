"""Megatron-Core as an oracle, shared by the tests that need it (``test_export_oracle``, the VPP search tests).

Importing this module skips the importing test module unless torch and megatron-core are installed (the
optional extras ``megatron`` / ``profile``). What each helper re-enacts is cited in test_export_oracle.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from megatron.core import parallel_state as ps  # noqa: E402
from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator  # noqa: E402
from megatron.core.transformer.enums import LayerType  # noqa: E402
from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout  # noqa: E402
from megatron.core.transformer.transformer_block import get_num_layers_to_build  # noqa: E402
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

from hapmoe_milp.export import megatron_args, parse_megatron_args  # noqa: E402
from hapmoe_milp.export.common import plan_chunks, rank_slots  # noqa: E402
from hapmoe_milp.export.validate import validate  # noqa: E402
from hapmoe_milp.plan import Plan  # noqa: E402
from hapmoe_milp.specs.cluster import ClusterSpec  # noqa: E402
from hapmoe_milp.specs.model import ModelSpec  # noqa: E402

# ---------------------------------------------------------------------- args -> megatron-core objects
# flags that are not TransformerConfig fields (checked by other parts of this test or by validate_args)
NOT_CONFIG = {
    "micro_batch_size",
    "global_batch_size",
    "seq_length",
    "max_position_embeddings",
    "group_query_attention",
    "untie_embeddings_and_output_weights",
    "position_embedding_type",
    "use_distributed_optimizer",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "make_vocab_size_divisible_by",
    # DistributedDataParallelConfig (its grad_reduce_in_fp32 = False), not a TransformerConfig field
    "grad_reduce_in_bf16",
    # GPTModel / MambaModel constructor arguments (megatron/training gpt_builders, pretrain_mamba.py), not
    # TransformerConfig fields
    "rotary_percent",
    "hybrid_override_pattern",
    "spec",
}
# flags that configure the optimizer (OptimizerConfig, checked by optimizer_config_from_args)
OPTIMIZER_FLAGS = {
    "use_distributed_optimizer",
    "optimizer_cpu_offload",
    "use_precision_aware_optimizer",
    "optimizer_offload_fraction",
}
RENAMED = {
    "num_experts": "num_moe_experts",
    "decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
    "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage",
    "num_virtual_stages_per_pipeline_rank": "virtual_pipeline_model_parallel_size",
}


def moe_freq_type(x: Any) -> Any:
    """megatron.training.arguments.moe_freq_type: ints stay ints, other strings are eval'd to a list."""
    if isinstance(x, int):
        return x
    return int(x) if str(x).isdigit() else eval(str(x), {"__builtins__": {}}, {})


def config_from_args(parsed: dict[str, Any]) -> TransformerConfig:
    """What ``core_transformer_config_from_args`` does for the flags we emit."""
    kw: dict[str, Any] = {}
    fields = set(TransformerConfig.__dataclass_fields__) | set(MLATransformerConfig.__dataclass_fields__)
    for k, v in parsed.items():
        if k in NOT_CONFIG or k in OPTIMIZER_FLAGS:
            continue
        if k == "swiglu":
            kw.update(gated_linear_unit=True, activation_func=F.silu, bias_activation_fusion=False)
        elif k == "disable_bias_linear":
            kw["add_bias_linear"] = False
        elif k == "bf16":
            kw.update(bf16=True, params_dtype=torch.bfloat16)
        elif k in ("moe_layer_freq", "no_rope_freq", "linear_attention_freq"):
            kw[k] = moe_freq_type(v)
        elif k == "squared_relu":  # validate_args: activation_func = squared_relu, no GLU
            from megatron.core.activations import squared_relu

            kw.update(activation_func=squared_relu, gated_linear_unit=False, bias_activation_fusion=False)
        elif k == "no_rope_fusion":  # argparse dest apply_rope_fusion (store_false)
            kw["apply_rope_fusion"] = False
        elif k == "no_bias_swiglu_fusion":  # core_transformer_config_from_args: bias_activation_fusion for SwiGLU
            kw["bias_activation_fusion"] = False
        elif k == "fp8_param_gather":  # core_transformer_config_from_args: fp8_param = args.fp8_param_gather
            kw["fp8_param"] = True
        elif k in ("cuda_graph_scope", "recompute_modules"):
            kw[k] = v if isinstance(v, list) else [v]
        elif k in RENAMED:
            kw[RENAMED[k]] = v
        elif k in fields:
            kw[k] = v
        else:
            raise LookupError(f"exported flag --{k.replace('_', '-')} has no TransformerConfig mapping")
    if kw.get("pipeline_model_parallel_size", 1) > 1:
        kw["pipeline_dtype"] = torch.bfloat16
    cls = MLATransformerConfig if kw.get("multi_latent_attention") else TransformerConfig
    return cls(**kw)


def optimizer_config_from_args(parsed: dict[str, Any]) -> Any:
    """What ``megatron.training`` builds the OptimizerConfig from (its ``__post_init__`` checks that the
    precision-aware optimizer, which CPU offload needs, runs with the distributed optimizer)."""
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer import optimizer_config as oc

    kw = {k: parsed[k] for k in OPTIMIZER_FLAGS if k in parsed}
    if "optimizer_offload_fraction" in kw:
        kw["optimizer_offload_fraction"] = float(kw["optimizer_offload_fraction"])
    # The precision-aware path asks Transformer Engine's version (only to pick store_param_remainders);
    # TE is not installed on a CPU machine, so answer as a TE >= 2.1 install would. Every assert still runs.
    with pytest.MonkeyPatch.context() as mp:
        if hasattr(oc, "is_te_min_version"):
            mp.setattr(oc, "is_te_min_version", lambda *a, **k: True)
        return OptimizerConfig(optimizer="adam", bf16=True, **kw)


@contextlib.contextmanager
def fake_world(world: int) -> Iterator[None]:
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


def init_mesh(world: int, tp: int, pp: int, cp: int, ep: int, etp: int, vpp: int | None) -> dict[str, int]:
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        context_parallel_size=cp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
        create_gloo_process_groups=False,
    )
    return {
        "dp": ps.get_data_parallel_world_size(),
        "edp": ps.get_expert_data_parallel_world_size(),
        "pp": ps.get_pipeline_model_parallel_world_size(),
        "tp": ps.get_tensor_model_parallel_world_size(),
        "cp": ps.get_context_parallel_world_size(),
        "ep": ps.get_expert_model_parallel_world_size(),
    }


def mcore_chunks(config: TransformerConfig, pp: int, vpp: int) -> list[list[tuple[int, int]]]:
    """(decoder, mtp) layers per [pp_rank][vpp_chunk] as megatron-core builds them."""
    layout = config.pipeline_model_parallel_layout
    if layout is not None:
        return [[(c.count(LayerType.decoder), c.count(LayerType.mtp)) for c in row] for row in layout.layout]
    out = []
    for r in range(pp):
        row = []
        for v in range(vpp):
            d = get_num_layers_to_build(config, vp_stage=v, pp_rank=r)
            m = (config.mtp_num_layers or 0) if (r == pp - 1 and v == vpp - 1) else 0  # mtp_on_this_rank
            row.append((d, m))
        out.append(row)
    return out


# ---------------------------------------------------------------------- the positive oracle
def check_megatron_export(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> None:
    """Megatron-core accepts the plan's exported arguments and reproduces its split, mesh and batches."""
    assert validate(plan, model, cluster, "megatron") == []
    parsed = parse_megatron_args(megatron_args(plan, model, cluster))
    cfg = plan.stages[0].cfg

    # layout string parses and validates on its own
    if "pipeline_model_parallel_layout" in parsed:
        lay = PipelineParallelLayerLayout.from_str(parsed["pipeline_model_parallel_layout"], plan.pp)
        lay.validate_layer_layout(model.num_layers, model.mtp_num_layers or None)
        per_rank = [
            sum(len([x for x in c if x in (LayerType.decoder, LayerType.mtp)]) for c in row) for row in lay.layout
        ]
        assert per_rank == plan.layer_counts()
        assert lay.virtual_pipeline_model_parallel_size == plan.vpp

    # the whole argument set builds a TransformerConfig, with the plan's split, and an OptimizerConfig
    config = config_from_args(parsed)
    opt = optimizer_config_from_args(parsed)
    st = plan.settings()
    assert opt.optimizer_cpu_offload == st.optimizer_offload
    assert opt.use_distributed_optimizer == st.distributed_optimizer
    if opt.optimizer_cpu_offload:  # validate_args: "must be used in conjunction with --use-precision-aware-optimizer"
        assert opt.use_precision_aware_optimizer
    got = mcore_chunks(config, plan.pp, plan.vpp)
    want = [[(c.decoder, c.mtp) for c in row] for row in plan_chunks(plan, model)]
    assert got == want
    assert [sum(d + m for d, m in row) for row in got] == plan.layer_counts()

    # the process groups
    world = plan.devices_used
    with fake_world(world):
        sizes = init_mesh(world, cfg.tp, plan.pp, cfg.cp, cfg.ep, cfg.etp, plan.vpp if plan.vpp > 1 else None)
    assert sizes["dp"] == cfg.dp and sizes["pp"] == plan.pp and sizes["tp"] == cfg.tp and sizes["cp"] == cfg.cp
    assert sizes["edp"] == world // (cfg.etp * cfg.ep * plan.pp)

    # rank order: PP outermost, TP and ETP groups on one node of the stage's device type
    slots = rank_slots(plan, cluster)
    rg = ps.RankGenerator(tp=cfg.tp, ep=1, dp=cfg.dp, pp=plan.pp, cp=cfg.cp, order="tp-cp-ep-dp-pp")
    erg = ps.RankGenerator(
        tp=cfg.etp, ep=cfg.ep, dp=world // (cfg.etp * cfg.ep * plan.pp), pp=plan.pp, cp=1, order="tp-cp-ep-dp-pp"
    )
    for stage, ranks in enumerate(sorted(zip(*rg.get_ranks("pp")))):
        assert {slots[r].stage for r in ranks} == {stage}
        assert {slots[r].device for r in ranks} == {plan.stages[stage].device}
    for group in rg.get_ranks("tp") + erg.get_ranks("tp"):
        assert len({(slots[r].group, slots[r].node) for r in group}) == 1

    # batch arithmetic
    calc = ConstantNumMicroBatchesCalculator(plan.global_batch_size, plan.micro_batch_size, cfg.dp, False, 0)
    assert calc.get() == plan.num_microbatches
