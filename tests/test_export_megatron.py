"""Megatron-LM export: layout grammar, split flags, argument set, round trip, hostfile and launch scripts."""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hapmoe_milp.config import ParallelConfig, Settings
from hapmoe_milp.errors import ExportError, HapmoeError, PlanError
from hapmoe_milp.export import (
    export_plan,
    hostfile,
    launch_scripts,
    megatron_args,
    nearest_expressible_recompute,
    parse_megatron_args,
    plan_from_megatron_args,
)
from hapmoe_milp.export.common import StageLayers, launch_units, moe_layer_freq_arg, plan_chunks, rank_chunks
from hapmoe_milp.export.megatron import (
    build_layout,
    compress_layout,
    format_args_file,
    layout_problems,
    layout_rank_layers,
    model_args,
    parse_layout,
    pipeline_split,
)
from hapmoe_milp.export.megatron_arch import position_embedding
from hapmoe_milp.export.validate import validate
from hapmoe_milp.plan import Plan, Stage, load_plan
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs.model import ModelSpec
from hapmoe_milp.specs.model_doc import model_from_dict, model_to_dict

CAT = Catalog()
MIXTRAL = CAT.model("mixtral-s")
DSV3 = CAT.model("deepseek-v3")
C16 = CAT.cluster("8xh800+8xa100")  # two NVIDIA types: upstream Megatron-LM runs them
C256 = CAT.cluster("128xh800+128xa100")


def make_plan(
    counts: list[int],
    devices: list[str],
    cfg: ParallelConfig | list[ParallelConfig],
    *,
    model: ModelSpec = MIXTRAL,
    cluster: str = "8xh800+8xa100",
    recompute: str | list[str] = "none",
    family: str = "megatron",
    gbs: int = 256,
    mbs: int = 1,
    vpp: int = 1,
    seq: int = 4096,
    precision: str = "bf16",
) -> Plan:
    cfgs = cfg if isinstance(cfg, list) else [cfg] * len(counts)
    recs = recompute if isinstance(recompute, list) else [recompute] * len(counts)
    stages, pos = [], 0
    for n, d, c, r in zip(counts, devices, cfgs, recs):
        stages.append(Stage(d, c, pos, pos + n, r))  # type: ignore[arg-type]
        pos += n
    return Plan(model.name, cluster, family, tuple(stages), gbs, seq, mbs, vpp=vpp, precision=precision)  # type: ignore[arg-type]


TP2 = ParallelConfig(tp=2, dp=2, ep=4, etp=1)  # 4 devices per stage
TP2_8 = ParallelConfig(tp=2, dp=4, ep=8, etp=1)  # 8 devices per stage
DS_CFG = ParallelConfig(tp=1, dp=16, ep=16, etp=1)  # DeepSeek-V3, 16 devices per stage
H2_B2 = ["h800", "h800", "a100", "a100"]

# (name, plan, model, cluster) — all valid Megatron plans, used by the round-trip and oracle tests.
DS_COUNTS = [5] + [4] * 13 + [3, 2]  # 61 decoder + 1 MTP = 62, MTP in the last stage
VALID = [
    ("even", make_plan([6, 6, 6, 6], H2_B2, TP2), MIXTRAL, C16),
    ("first-only", make_plan([14, 10], ["h800", "a100"], TP2_8), MIXTRAL, C16),
    ("last-only", make_plan([7, 7, 7, 3], H2_B2, TP2), MIXTRAL, C16),
    ("first-last", make_plan([9, 6, 6, 3], H2_B2, TP2), MIXTRAL, C16),
    ("layout-uneven", make_plan([8, 7, 5, 4], H2_B2, TP2), MIXTRAL, C16),
    ("even-vpp2", make_plan([6, 6, 6, 6], H2_B2, TP2, vpp=2), MIXTRAL, C16),
    ("layout-vpp2", make_plan([8, 7, 5, 4], H2_B2, TP2, vpp=2), MIXTRAL, C16),
    ("first-last-vpp2", make_plan([8, 6, 6, 4], H2_B2, TP2, vpp=2), MIXTRAL, C16),
    ("full-recompute", make_plan([8, 7, 5, 4], H2_B2, TP2, recompute="full"), MIXTRAL, C16),
    ("selective", make_plan([6, 6, 6, 6], H2_B2, TP2, recompute="selective"), MIXTRAL, C16),
    ("tp1-cp2", make_plan([12, 12], ["h800", "a100"], ParallelConfig(tp=1, cp=2, dp=4, ep=8)), MIXTRAL, C16),
    ("pp1", make_plan([24], ["h800"], TP2_8), MIXTRAL, C16),
    (
        "dsv3-mtp-last",
        make_plan(DS_COUNTS, ["h800"] * 8 + ["a100"] * 8, DS_CFG, model=DSV3, cluster="128xh800+128xa100"),
        DSV3,
        C256,
    ),
    (
        "dsv3-mtp-vpp2",
        make_plan(DS_COUNTS, ["h800"] * 8 + ["a100"] * 8, DS_CFG, model=DSV3, cluster="128xh800+128xa100", vpp=2),
        DSV3,
        C256,
    ),
    (
        "dsv3-last-flag",  # 4 decoder layers per rank, the last rank 1 decoder + MTP: --decoder-last-... 1
        make_plan([4] * 15 + [2], ["h800"] * 8 + ["a100"] * 8, DS_CFG, model=DSV3, cluster="128xh800+128xa100"),
        DSV3,
        C256,
    ),
]
VALID_IDS = [v[0] for v in VALID]


# ---------------------------------------------------------------------- layout grammar
@pytest.mark.parametrize(
    ("layout", "pp", "stages", "vpp"),
    [
        ("Et*3|(tt|)*29m|L", 16, 32, 2),
        ("Et|(tt|)*30mL", 8, 32, 4),
        ("Et*2|(tt|)*22t|(tt|)*7mL", 8, 32, 4),
        ("Ett|tt|tt|ttL", 4, 4, 1),
        ("E,t,t|t,t,L", 2, 2, 1),
    ],
)
def test_parse_layout_reference_examples(layout: str, pp: int, stages: int, vpp: int) -> None:
    """The worked examples of reference/megatron.md §1.5 parse to the same stage counts as Megatron's."""
    got = parse_layout(layout)
    assert len(got) == stages
    assert len(got) // pp == vpp


def test_parse_layout_dsv3_example_grid() -> None:
    got = parse_layout("Et*3|(tt|)*29m|L")
    assert got[0] == "Ettt" and got[-2] == "m" and got[-1] == "L"
    ranks = layout_rank_layers("Et*3|(tt|)*29m|L", 16)
    assert ranks[0] == StageLayers(5, 0) and ranks[14] == StageLayers(2, 1) and ranks[15] == StageLayers(2, 0)
    assert layout_problems("Et*3|(tt|)*29m|L", 16, 61, 1) == []


@pytest.mark.parametrize("bad", ["Ext|L", "E(t)*2|tL|x", "Et|t*2|L?"])
def test_parse_layout_rejects_unknown_characters(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid layer character"):
        parse_layout(bad)


def test_parse_layout_refuses_huge_expansion() -> None:
    with pytest.raises(ValueError, match="expands"):
        parse_layout("Et*99999999|L")


@pytest.mark.parametrize(
    ("layout", "msg"),
    [
        ("tE|tL", "first layer must be the embedding"),
        ("Et|tLL", "exactly once"),
        ("Et|t", "last layer must be the loss"),
        ("Et|tmtL", "before MTP"),
        ("Ett|ttm||L", "last virtual stage"),
        ("Et|t|t", "not divisible"),
    ],
)
def test_layout_problems_mirror_validate_layer_layout(layout: str, msg: str) -> None:
    n_t = "".join(parse_layout(layout)).count("t")
    problems = layout_problems(layout, 2, n_t, 1 if "m" in layout else 0)
    assert any(msg in p for p in problems), problems


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["", "t", "tt", "ttt", "tttt", "m", "tm", "ttmm"]), min_size=1, max_size=40))
def test_compress_layout_round_trips(stages: list[str]) -> None:
    assert parse_layout(compress_layout(stages)) == stages


# ---------------------------------------------------------------------- chunking and split selection
def test_rank_chunks_even_extras_first_mtp_last() -> None:
    assert rank_chunks(StageLayers(5, 0), 2) == [StageLayers(3, 0), StageLayers(2, 0)]
    assert rank_chunks(StageLayers(2, 1), 2) == [StageLayers(2, 0), StageLayers(0, 1)]
    assert rank_chunks(StageLayers(0, 1), 2) == [StageLayers(0, 0), StageLayers(0, 1)]
    assert rank_chunks(StageLayers(1, 2), 2) == [StageLayers(1, 0), StageLayers(0, 2)]
    assert rank_chunks(StageLayers(7, 0), 1) == [StageLayers(7, 0)]


@pytest.mark.parametrize(
    ("name", "first", "last", "layout"),
    [
        ("even", None, None, False),
        ("first-only", 14, None, False),
        ("last-only", None, 3, False),
        ("first-last", 9, 3, False),
        ("layout-uneven", None, None, True),
        ("even-vpp2", None, None, False),
        ("layout-vpp2", None, None, True),
        ("first-last-vpp2", 8, 4, False),
        ("pp1", None, None, False),
        ("dsv3-mtp-last", None, None, True),
        ("dsv3-last-flag", None, 1, False),
    ],
)
def test_pipeline_split_prefers_simplest_flags(name: str, first: int | None, last: int | None, layout: bool) -> None:
    plan, model, _cluster = next((p, m, c) for n, p, m, c in VALID if n == name)
    split = pipeline_split(plan, model)
    assert (split.first, split.last) == (first, last)
    assert (split.layout is not None) == layout
    assert split.vpp == (plan.vpp if plan.vpp > 1 and not layout else None)


def test_dsv3_vpp2_layout_matches_megatron_style() -> None:
    plan, model, _ = next((p, m, c) for n, p, m, c in VALID if n == "dsv3-mtp-vpp2")
    lay = build_layout(plan, model)
    assert layout_problems(lay, 16, 61, 1) == []
    stages = parse_layout(lay)
    assert stages[0] == "Ettt"  # rank 0 holds 5 layers: 3 in its first chunk, 2 in its second
    assert stages[-1].endswith("mL")  # last rank: 1 decoder + MTP + loss in its last chunk
    assert [r.total for r in layout_rank_layers(lay, 16)] == plan.layer_counts()


def test_plan_chunks_cover_every_layer() -> None:
    for _n, plan, model, _c in VALID:
        chunks = plan_chunks(plan, model)
        assert sum(c.decoder for row in chunks for c in row) == model.num_layers
        assert sum(c.mtp for row in chunks for c in row) == model.mtp_num_layers


# ---------------------------------------------------------------------- argument content
def _args(name: str, **kw: object) -> tuple[list[str], dict[str, object]]:
    plan, model, cluster = next((p, m, c) for n, p, m, c in VALID if n == name)
    a = megatron_args(plan, model, cluster, **kw)  # type: ignore[arg-type]
    return a, parse_megatron_args(a)


def test_args_parallel_sizes_and_sequence_parallel() -> None:
    _, p = _args("layout-uneven")
    assert p["tensor_model_parallel_size"] == 2 and p["pipeline_model_parallel_size"] == 4
    assert p["context_parallel_size"] == 1 and p["expert_model_parallel_size"] == 4
    assert p["expert_tensor_parallel_size"] == 1
    assert p["sequence_parallel"] is True
    assert p["disable_bias_linear"] is True and p["moe_grouped_gemm"] is True
    assert p["micro_batch_size"] == 1 and p["global_batch_size"] == 256
    assert p["seq_length"] == 4096 and p["max_position_embeddings"] == 4096
    assert p["use_distributed_optimizer"] and p["overlap_grad_reduce"] and p["overlap_param_gather"] and p["bf16"]


def test_args_tp1_has_no_sequence_parallel() -> None:
    _, p = _args("tp1-cp2")
    assert "sequence_parallel" not in p
    assert p["context_parallel_size"] == 2


def test_args_model_shape_mixtral() -> None:
    _, p = _args("even")
    assert p["num_layers"] == 24 and p["hidden_size"] == 4096 and p["ffn_hidden_size"] == 14336
    assert p["num_attention_heads"] == 32 and p["group_query_attention"] and p["num_query_groups"] == 8
    assert p["kv_channels"] == 128 and p["swiglu"] and p["normalization"] == "RMSNorm"
    assert p["untie_embeddings_and_output_weights"] and p["num_experts"] == 8 and p["moe_router_topk"] == 2
    assert p["moe_ffn_hidden_size"] == 14336 and p["moe_layer_freq"] == 1
    assert "multi_latent_attention" not in p and "mtp_num_layers" not in p


def test_position_embedding_flag_follows_the_model() -> None:
    """RoPE for the catalog's transformers, none for hybrid stacks, learned_absolute for a model (a measured
    FlagPerf launch) that keeps Megatron's learned table; the flag survives the plan-file round trip."""
    llama = CAT.model("llama-3-8b")
    assert position_embedding(llama) == "rope"
    learned = replace(llama, learned_absolute_position_embedding=True)
    a = model_args(learned)
    assert a[a.index("--position-embedding-type") + 1] == "learned_absolute"
    assert model_from_dict(model_to_dict(learned), "plan") == replace(learned, origin="plan")
    assert "learned_absolute_position_embedding" not in model_to_dict(llama)  # default: model hash unchanged


def test_args_model_shape_deepseek_v3() -> None:
    _, p = _args("dsv3-mtp-last")
    assert p["multi_latent_attention"] and p["q_lora_rank"] == 1536 and p["kv_lora_rank"] == 512
    assert p["qk_head_dim"] == 128 and p["qk_pos_emb_head_dim"] == 64 and p["v_head_dim"] == 128
    assert p["mtp_num_layers"] == 1 and p["moe_layer_freq"] == "([0]*3+[1]*58)"
    assert p["moe_shared_expert_intermediate_size"] == 2048 and p["num_experts"] == 256
    assert p["moe_router_score_function"] == "sigmoid" and p["moe_router_enable_expert_bias"]
    assert "group_query_attention" not in p and "kv_channels" not in p
    assert "sequence_parallel" not in p  # TP 1


def test_args_recompute_full_is_block_over_largest_chunk() -> None:
    _, p = _args("full-recompute")
    assert p["recompute_granularity"] == "full" and p["recompute_method"] == "block"
    assert p["recompute_num_layers"] == 8  # the largest stage: every layer of every stage recomputed


def test_args_recompute_selective_modules() -> None:
    _, p = _args("selective")
    assert p["recompute_granularity"] == "selective"
    assert p["recompute_modules"] == ["layernorm", "moe_act"]
    assert "recompute_method" not in p and "recompute_num_layers" not in p


def test_args_fp8_and_settings_switches() -> None:
    plan = make_plan([6, 6, 6, 6], H2_B2, TP2, precision="fp8")
    p = parse_megatron_args(megatron_args(plan, MIXTRAL, C16))
    assert p["fp8_format"] == "hybrid" and p["bf16"]
    s = Settings(distributed_optimizer=False)
    p2 = parse_megatron_args(megatron_args(plan, MIXTRAL, C16, s))
    assert "use_distributed_optimizer" not in p2 and "overlap_param_gather" not in p2


def test_args_reject_non_uniform_mesh_and_mixed_recompute() -> None:
    bad = make_plan([12, 12], ["h800", "a100"], [TP2_8, ParallelConfig(tp=4, dp=2, ep=8)], family="hetero")
    with pytest.raises(ExportError, match="rule_uniform_mesh"):
        megatron_args(bad, MIXTRAL, C16)
    mixed = make_plan([6, 6, 6, 6], H2_B2, TP2, recompute=["full", "none", "none", "none"])
    with pytest.raises(ExportError, match="rule_uniform_recompute"):
        megatron_args(mixed, MIXTRAL, C16)


@pytest.mark.parametrize(
    ("freq", "expect"),
    [
        (1, "1"),
        (2, "2"),
        ((0, 0, 0) + (1,) * 58, "([0]*3+[1]*58)"),
        ((1, 0) * 4, "2"),
        ((1, 1, 1, 0) * 3, "([1]*3+[0]*1)*3"),
        ((0, 1, 1, 0, 1), "([0]*1+[1]*2+[0]*1+[1]*1)"),
    ],
)
def test_moe_layer_freq_arg(freq: int | tuple[int, ...], expect: str) -> None:
    n = 8 if isinstance(freq, int) else len(freq)
    m = replace(MIXTRAL, num_layers=n, moe_layer_freq=freq)
    assert moe_layer_freq_arg(m) == expect


def test_parse_megatron_args_reads_file_text() -> None:
    a, p = _args("layout-uneven")
    text = "# comment line\n" + format_args_file(a)
    assert parse_megatron_args(text) == p
    assert all(line.startswith("--") for line in format_args_file(a).splitlines())


def test_parse_megatron_args_errors_are_export_errors() -> None:
    with pytest.raises(ExportError, match="twice"):
        parse_megatron_args(["--bf16", "--bf16"])
    with pytest.raises(ExportError, match="--flag first"):
        parse_megatron_args(["4", "--bf16"])


# ---------------------------------------------------------------------- round trip
@pytest.mark.parametrize("case", VALID, ids=VALID_IDS)
def test_round_trip_export_parse_rebuild(case: tuple[str, Plan, ModelSpec, object]) -> None:
    _name, plan, model, cluster = case
    assert validate(plan, model, cluster, "megatron") == []
    text = format_args_file(megatron_args(plan, model, cluster))
    rebuilt = plan_from_megatron_args(text, hostfile(plan, cluster), model, cluster)
    assert rebuilt.stages == plan.stages
    assert rebuilt.vpp == plan.vpp
    for f in ("global_batch_size", "micro_batch_size", "seq_length", "precision", "num_microbatches"):
        assert getattr(rebuilt, f) == getattr(plan, f)


def test_rebuild_maps_partial_block_recompute_to_full_k() -> None:
    """Block recompute of the first K layers per chunk is a plan recompute value of its own (``full:K``)."""
    plan, model, cluster = VALID[0][1:]
    a = [*megatron_args(plan, model, cluster), "--recompute-granularity", "full", "--recompute-method", "block"]
    a += ["--recompute-num-layers", "2"]
    back = plan_from_megatron_args(a, hostfile(plan, cluster), model, cluster)
    assert {s.recompute for s in back.stages} == {"full:2"}
    u = [*megatron_args(plan, model, cluster), "--recompute-granularity", "full", "--recompute-method", "uniform"]
    u += ["--recompute-num-layers", "3"]
    assert {s.recompute for s in plan_from_megatron_args(u, hostfile(plan, cluster), model, cluster).stages} == {
        "uniform:3"
    }


# ---------------------------------------------------------------------- hostfile and launch scripts
def test_hostfile_orders_stages_by_type() -> None:
    plan = make_plan([8, 7, 5, 4], H2_B2, TP2)
    lines = [ln for ln in hostfile(plan, C16).splitlines() if not ln.startswith("#")]
    assert lines == ["h800-node0 slots=8", "a100-node0 slots=8"]


def test_interleaved_types_split_a_node_into_units() -> None:
    """h800, 910b, h800, 910b stages of 4 devices: each node's ranks are not consecutive, so each node
    runs two torchrun agents restricted to their devices."""
    plan = make_plan([6, 6, 6, 6], ["h800", "a100", "h800", "a100"], TP2)
    units = launch_units(plan, C16)
    assert [(u.host, u.first_rank, u.locals) for u in units] == [
        ("h800-node0", 0, (0, 1, 2, 3)),
        ("a100-node0", 4, (0, 1, 2, 3)),
        ("h800-node0", 8, (4, 5, 6, 7)),
        ("a100-node0", 12, (4, 5, 6, 7)),
    ]
    scripts = launch_scripts(plan, C16, MIXTRAL)
    assert sorted(scripts) == [f"launch_node{k}.sh" for k in range(4)]
    assert "export CUDA_VISIBLE_DEVICES=4,5,6,7" in scripts["launch_node3.sh"]  # a100: NVIDIA
    assert "export CUDA_VISIBLE_DEVICES=4,5,6,7" in scripts["launch_node2.sh"]
    assert "VISIBLE_DEVICES" not in scripts["launch_node0.sh"]
    rebuilt = plan_from_megatron_args(megatron_args(plan, MIXTRAL, C16), hostfile(plan, C16), MIXTRAL, C16)
    assert [s.device for s in rebuilt.stages] == ["h800", "a100", "h800", "a100"]


def test_launch_script_contents() -> None:
    plan = make_plan([8, 7, 5, 4], H2_B2, TP2)
    s = launch_scripts(plan, C16, MIXTRAL)["launch_node1.sh"]
    for needle in ("NNODES=2", "NODE_RANK=1", "NPROC_PER_NODE=8", "MASTER_ADDR", "set -f", "pretrain_gpt.py"):
        assert needle in s
    assert '$(cat "$HERE/megatron_args.txt")' in s
    # the NullTokenizer's --vocab-size is found at run time (test_null_vocab_probe_*), not hard-coded
    assert "--vocab-size $NULL_VOCAB" in s and "NullTokenizer" in s and "31999" not in s
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in s


# The two NullTokenizer conventions, as upstream documents them (Megatron-LM core_v0.16.1 vs core_v0.18.0+
# megatron/core/tokenizers/text/libraries/null_tokenizer.py): up to 0.17 ``vocab_size`` returns the
# argument + 1 (an EOD token is added); from 0.18 it returns the argument (EOD = vocab_size - 1). The
# oracle test runs the probe against the installed megatron-core's real file as well.
_TOKENIZER_ADDS_EOD = """
class NullTokenizer:
    def __init__(self, vocab_size):
        self._vocab_size_without_eod = int(vocab_size)
    @property
    def vocab_size(self):
        return self._vocab_size_without_eod + 1
"""
_TOKENIZER_AS_IS = """
class NullTokenizer:
    def __init__(self, vocab_size, eod_id=None, pad_id=-1, **kwargs):
        self._vocab_size = int(vocab_size)
    @property
    def vocab_size(self):
        return self._vocab_size
"""


@pytest.mark.parametrize(("source", "want"), [(None, 31999), (_TOKENIZER_ADDS_EOD, 31999), (_TOKENIZER_AS_IS, 32000)])
def test_null_vocab_probe_gives_the_model_vocabulary(tmp_path: Path, source: str | None, want: int) -> None:
    import subprocess
    import sys

    from hapmoe_milp.export.megatron import NULL_VOCAB_PROBE

    if source is not None:
        d = tmp_path / "megatron" / "core" / "tokenizers" / "text" / "libraries"
        d.mkdir(parents=True)
        (d / "null_tokenizer.py").write_text(source)
    out = subprocess.run(
        [sys.executable, "-", str(tmp_path), "32000"],
        input=NULL_VOCAB_PROBE,
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(out.stdout) == want


def test_multi_node_stage_spans_nodes_in_order() -> None:
    cl = CAT.cluster("16xh800+16xa100")  # 16 h800 (2 nodes) + 16 910b (2 nodes)
    cfg = ParallelConfig(tp=2, dp=8, ep=8)
    plan = make_plan([12, 12], ["h800", "a100"], cfg, cluster="16xh800+16xa100")
    lines = [ln for ln in hostfile(plan, cl).splitlines() if not ln.startswith("#")]
    assert lines == ["h800-node0 slots=8", "h800-node1 slots=8", "a100-node0 slots=8", "a100-node1 slots=8"]


# ---------------------------------------------------------------------- recompute note
def test_nearest_expressible_recompute_megatron() -> None:
    plan = make_plan([6, 6, 6, 6], H2_B2, TP2, recompute=["full", "selective", "none", "none"])
    plan2, note = nearest_expressible_recompute(plan)
    assert note is not None and {s.recompute for s in plan2.stages} == {"full"}
    assert note.changed_stages == (1, 2, 3) and "full" in str(note)
    same, none = nearest_expressible_recompute(plan2)
    assert none is None and same is plan2


def test_nearest_expressible_recompute_flagscale() -> None:
    plan = make_plan([6, 6, 6, 6], H2_B2, TP2, recompute=["full", "none", "none", "none"])
    assert nearest_expressible_recompute(plan, "flagscale") == (plan, None)
    plan = make_plan([6, 6, 6, 6], H2_B2, TP2, recompute=["selective", "none", "none", "none"])
    plan2, note = nearest_expressible_recompute(plan, "flagscale")
    assert [s.recompute for s in plan2.stages] == ["full", "none", "none", "none"] and note is not None


# ---------------------------------------------------------------------- export_plan
def test_export_plan_megatron_writes_files(tmp_path: Path) -> None:
    plan = make_plan([8, 7, 5, 4], H2_B2, TP2, vpp=2)
    out = tmp_path / "out"
    paths = export_plan(plan, MIXTRAL, C16, "megatron", out)
    names = sorted(p.name for p in paths)
    assert names == sorted(
        ["plan.json", "megatron_args.txt", "hostfile", "launch_node0.sh", "launch_node1.sh", "README.txt"]
    )
    for k in (0, 1):
        mode = (out / f"launch_node{k}.sh").stat().st_mode
        assert mode & stat.S_IXUSR
    assert load_plan(out / "plan.json") == plan
    text = (out / "megatron_args.txt").read_text()
    rebuilt = plan_from_megatron_args(text, (out / "hostfile").read_text(), MIXTRAL, C16)
    assert rebuilt.stages == plan.stages
    readme = (out / "README.txt").read_text()
    assert "Layer layout" in readme


def test_export_plan_removes_stale_scripts_only(tmp_path: Path) -> None:
    (tmp_path / "launch_node7.sh").write_text("# Generated by hapmoe-milp\n")
    (tmp_path / "launch_node8.sh").write_text("# my own script\n")
    export_plan(make_plan([6, 6, 6, 6], H2_B2, TP2), MIXTRAL, C16, "megatron", tmp_path)
    assert not (tmp_path / "launch_node7.sh").exists()
    assert (tmp_path / "launch_node8.sh").exists()


def test_export_plan_refuses_hetero_plan_for_megatron(tmp_path: Path) -> None:
    bad = make_plan([12, 12], ["h800", "a100"], [TP2_8, ParallelConfig(tp=4, dp=2, ep=8)], family="hetero")
    with pytest.raises(ExportError, match="rule_uniform_mesh"):
        export_plan(bad, MIXTRAL, C16, "megatron", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_export_plan_plan_error_for_invalid_plan(tmp_path: Path) -> None:
    bad = make_plan([6, 6, 6, 6], H2_B2, ParallelConfig(tp=2, dp=2, ep=3))
    with pytest.raises(PlanError, match="rule_experts_divisible_by_ep") as ei:
        export_plan(bad, MIXTRAL, C16, "megatron", tmp_path)
    assert "stages[0].ep" in str(ei.value)
    assert not any(tmp_path.iterdir())


def test_export_plan_unknown_target(tmp_path: Path) -> None:
    with pytest.raises(HapmoeError, match="unknown target"):
        export_plan(VALID[0][1], MIXTRAL, C16, "deepspeed", tmp_path)  # type: ignore[arg-type]


def test_export_plan_unwritable_dir_is_output_error(tmp_path: Path) -> None:
    from hapmoe_milp.fileio import OutputError

    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(OutputError, match="cannot create"):
        export_plan(VALID[0][1], MIXTRAL, C16, "megatron", f / "sub")


@pytest.mark.skipif(os.name != "posix", reason="bash syntax check")
def test_launch_scripts_are_valid_bash(tmp_path: Path) -> None:
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("no bash")
    export_plan(make_plan([6, 6, 6, 6], ["h800", "a100", "h800", "a100"], TP2), MIXTRAL, C16, "megatron", tmp_path)
    for p in tmp_path.glob("launch_node*.sh"):
        subprocess.run(["bash", "-n", str(p)], check=True)


def test_launch_script_passes_args_verbatim(tmp_path: Path) -> None:
    """Run the script with a fake torchrun: the layout's '*' and '(' survive word splitting unglobbed."""
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("no bash")
    plan = make_plan(DS_COUNTS, ["h800"] * 8 + ["a100"] * 8, DS_CFG, model=DSV3, cluster="128xh800+128xa100", vpp=2)
    export_plan(plan, DSV3, C256, "megatron", tmp_path)
    # files that a glob of '([0]*3+[1]*58)' or the layout could match if globbing were on
    (tmp_path / "(0x3+1x58)").write_text("")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "torchrun"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$OUT"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "MASTER_ADDR": "10.0.0.1", "MEGATRON_LM": "/m"}
    env["PYTHON"] = sys.executable
    env.pop("DATA_ARGS", None)
    env["OUT"] = str(tmp_path / "argv.txt")
    subprocess.run(["bash", str(tmp_path / "launch_node0.sh")], check=True, env=env, cwd=tmp_path)
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    i = argv.index("/m/pretrain_gpt.py")
    got = parse_megatron_args(argv[i + 1 :])
    want = parse_megatron_args(megatron_args(plan, DSV3, C256))
    assert {k: got[k] for k in want} == want
    assert got["mock_data"] is True and got["vocab_size"] == DSV3.vocab_size - 1


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "mxfp8"])
def test_fp8_plans_export_the_recipe_they_were_priced_with(recipe):
    from hapmoe_milp.knobs import plan_from_knobs

    cat = Catalog(use_calibrated=False)
    m, c = cat.model("qwen3-30b-a3b"), cat.cluster("16xh100")
    s = Settings(seq_length=4096, global_batch_size=256, precision="fp8", fp8_recipe=recipe)
    plan = plan_from_knobs(m, c, s, ep=16, etp=1)
    args = megatron_args(plan, m, c)
    assert args[args.index("--fp8-recipe") + 1] == recipe


@pytest.mark.parametrize("recipe", ["tensorwise", "mxfp8"])
def test_the_fp8_recipe_survives_the_plan_file(recipe, tmp_path):
    from hapmoe_milp.knobs import plan_from_knobs

    cat = Catalog(use_calibrated=False)
    m, c = cat.model("qwen3-30b-a3b"), cat.cluster("16xh100")
    plan = plan_from_knobs(m, c, Settings(precision="fp8", fp8_recipe=recipe), ep=16, etp=1)
    assert load_plan(plan.write(tmp_path / "p.json")).settings().fp8_recipe == recipe
