"""Model catalog: parameter counts, FLOPs per token and layer layout against independent published numbers.

Every expected value below is copied by hand from a source outside this package (the model's authors,
reference/moe-models.yaml, reference/megatron.md §3.1, reference/papers.md §1.7) or worked out by hand in
the test. None is produced by running our own code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from decimal import Decimal

import pytest
import yaml

from hapmoe_milp.errors import SpecError
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs.model import ModelSpec
from hapmoe_milp.specs.model_doc import model_from_dict

CAT = Catalog()


def _model(mid: str) -> ModelSpec:
    return CAT.model(mid)


def _unit(reported: str) -> float:
    """Size of one unit in the last digit the source printed ("46.7" -> 0.1, "141" -> 1)."""
    return float(Decimal(1).scaleb(Decimal(reported).as_tuple().exponent))


def _assert_official(ours: float, reported: str, rounding: str, what: str) -> None:
    """Official figures are rounded: allow max(1 %, half a unit in the last printed digit).

    ``trunc`` marks figures a lab truncated instead of rounding (the exact count from the lab's own
    architecture lies between the printed number and the next unit); there we allow one full unit above.
    """
    v = float(reported)
    ours_b = ours / 1e9
    if rounding == "round":
        tol = max(0.01 * v, _unit(reported) / 2)
        lo, hi = v - tol, v + tol
    else:
        assert rounding == "trunc"
        lo, hi = v * 0.99, v + _unit(reported)
    assert lo <= ours_b <= hi, f"{what}: ours {ours_b:.4f}B vs reported {reported}B (allowed [{lo:.4f}, {hi:.4f}])"


# --------------------------------------------------------------------------------------------------------
# (a) official totals and active counts (reference/moe-models.yaml `params_official_billions`, Llama 2 from
#     the Llama 2 paper). Each lab's convention picks the count to compare with:
#       total_params_main                    DeepSeek (671B excludes the MTP module)
#       active_params                        Mistral, Qwen, AllenAI, Databricks, dense models (both embeddings)
#       active_params_no_input_embedding     DeepSeek, OpenAI (input-embedding lookup left out)
# columns: id, total, total attribute, active, active attribute, convention, rounding of the active figure
OFFICIAL = [
    ("mixtral-8x7b", "46.7", "total_params", "12.9", "active_params", "all_embeddings", "round"),
    ("mixtral-8x22b", "141", "total_params", "39", "active_params", "all_embeddings", "round"),
    # DeepSeek-V2 paper: 15.7B / 2.4B; the architecture gives 2.451B active (moe-models.yaml formula 2.45)
    (
        "deepseek-v2-lite",
        "15.7",
        "total_params",
        "2.4",
        "active_params_no_input_embedding",
        "excl_input_embedding",
        "trunc",
    ),
    ("deepseek-v2", "236", "total_params", "21", "active_params_no_input_embedding", "excl_input_embedding", "round"),
    (
        "deepseek-v3",
        "671",
        "total_params_main",
        "37",
        "active_params_no_input_embedding",
        "excl_input_embedding",
        "round",
    ),
    # Qwen model card: 3.3B activated; the architecture gives 3.353B (moe-models.yaml formula 3.35)
    ("qwen3-30b-a3b", "30.5", "total_params", "3.3", "active_params", "all_embeddings", "trunc"),
    # Moonshot's model card: 16B total, 3B activated (rounded); the architecture gives 15.96B / 2.91B
    ("moonlight-16b-a3b", "16", "total_params", "3", "active_params", "all_embeddings", "round"),
    ("qwen3-235b-a22b", "235", "total_params", "22", "active_params", "all_embeddings", "round"),
    ("qwen2-57b-a14b", "57", "total_params", "14", "active_params", "all_embeddings", "round"),
    ("olmoe-1b-7b", "6.9", "total_params", "1.3", "active_params", "all_embeddings", "round"),
    (
        "gpt-oss-120b",
        "116.83",
        "total_params",
        "5.13",
        "active_params_no_input_embedding",
        "excl_input_embedding",
        "round",
    ),
    ("dbrx", "132", "total_params", "36", "active_params", "all_embeddings", "round"),
    ("llama-2-7b", "7", "total_params", "7", "active_params", "all_embeddings", "round"),
    ("llama-2-13b", "13", "total_params", "13", "active_params", "all_embeddings", "round"),
]


@pytest.mark.parametrize(
    ("mid", "total", "total_attr", "active", "active_attr", "conv", "rounding"), OFFICIAL, ids=[r[0] for r in OFFICIAL]
)
def test_param_counts_match_official(mid, total, total_attr, active, active_attr, conv, rounding):
    m = _model(mid)
    _assert_official(getattr(m, total_attr), total, "round", f"{mid} total")
    _assert_official(getattr(m, active_attr), active, rounding, f"{mid} active")


@pytest.mark.parametrize(
    ("mid", "total", "total_attr", "active", "active_attr", "conv", "rounding"), OFFICIAL, ids=[r[0] for r in OFFICIAL]
)
def test_catalog_official_block_matches_source(mid, total, total_attr, active, active_attr, conv, rounding):
    """The `official` block in models/<id>.yaml says what the lab says, with the lab's convention."""
    off = _model(mid).official
    assert off is not None
    assert off.total_b == pytest.approx(float(total))
    assert off.active_b == pytest.approx(float(active))
    assert off.active_convention == conv
    assert off.includes_mtp is False
    assert off.source.startswith("https://")


# checked against their labs' figures (3% rule of issue 22) in test_specs_hf_families.py
CHECKED_IN_FAMILIES = {
    "kimi-k2",
    "glm-4.5",
    "glm-4.5-air",
    "qwen3-next-80b-a3b",
    "llama-4-scout",
    "llama-4-maverick",
    "granite-3.0-3b-a800m",
    "jamba-v0.1",
    "hunyuan-a13b",
    "minimax-m2",
    "dots-llm1",
    "ling-lite",
    "nemotron-3-nano-30b-a3b",
}


def test_every_catalog_model_is_checked():
    names = set(CAT.model_names())
    with_official = {n for n in names if _model(n).official is not None}
    assert with_official == {r[0] for r in OFFICIAL} | CHECKED_IN_FAMILIES
    # HAPMoE gives no (total, active) pair for its two models, so they carry no official block
    assert {"mixtral-s", "mixtral-l"} <= names - with_official


def test_catalog_entries_cite_sources_and_are_named_after_their_file():
    for n in CAT.model_names():
        m = _model(n)
        assert m.name == n
        assert m.sources and all(s.startswith("https://") for s in m.sources), n
        raw = yaml.safe_load((CAT.models_dir / f"{n}.yaml").read_text())
        assert raw.get("notes"), f"{n} has no notes"


# --------------------------------------------------------------------------------------------------------
# Tighter check: exact counts computed independently, printed to 0.01B (or 0.1B). Sources:
#   M  = reference/megatron.md §3.1 table (Megatron's own parameter count, embeddings included)
#   F  = reference/moe-models.yaml `params_formula_billions` (the reference's weight-by-weight formula)
#   P  = reference/papers.md §1.7 "My count" column (HAPMoE models, vocab 32000 untied assumed)
#   L1 = arXiv 2302.13971 Table 2 (LLaMA-1, same shapes as Llama-2 7B / 13B)
EXACT = [
    ("mixtral-8x7b", "total_params", "46.70", "M"),
    ("mixtral-8x7b", "active_params", "12.88", "M"),
    ("mixtral-8x22b", "total_params", "140.62", "M"),
    ("mixtral-8x22b", "active_params", "39.15", "M"),
    ("qwen3-30b-a3b", "total_params", "30.53", "M"),
    ("qwen3-30b-a3b", "active_params", "3.35", "M"),
    ("qwen3-235b-a22b", "total_params", "235.09", "M"),
    ("qwen3-235b-a22b", "active_params", "22.19", "M"),
    ("deepseek-v3", "total_params_main", "671.03", "M"),
    ("deepseek-v3", "active_params", "37.55", "M"),
    ("deepseek-v3", "active_params_no_input_embedding", "36.63", "F"),
    ("deepseek-v2-lite", "total_params", "15.71", "F"),
    ("deepseek-v2-lite", "active_params", "2.66", "F"),
    ("deepseek-v2-lite", "active_params_no_input_embedding", "2.45", "F"),
    ("deepseek-v2", "total_params", "235.74", "F"),
    ("deepseek-v2", "active_params", "21.38", "F"),
    # F also lists 20.86 without the input embedding, but 21.38 - V*h (0.524288) = 20.85: that entry is
    # inconsistent with F's own 21.38 and is left out
    ("qwen2-57b-a14b", "total_params", "57.41", "F"),
    ("qwen2-57b-a14b", "active_params", "14.25", "F"),
    ("olmoe-1b-7b", "total_params", "6.92", "F"),
    ("olmoe-1b-7b", "active_params", "1.28", "F"),
    ("gpt-oss-120b", "total_params", "116.83", "F"),
    ("gpt-oss-120b", "active_params", "5.71", "F"),
    ("gpt-oss-120b", "active_params_no_input_embedding", "5.13", "F"),
    ("dbrx", "total_params", "131.6", "F"),
    ("dbrx", "active_params", "36.47", "F"),
    ("mixtral-s", "total_params", "35.1", "P"),
    ("mixtral-s", "active_params", "9.7", "P"),
    ("mixtral-l", "total_params", "120.6", "P"),
    ("mixtral-l", "active_params", "33.6", "P"),
    ("llama-2-7b", "total_params", "6.7", "L1"),
    ("llama-2-13b", "total_params", "13.0", "L1"),
]


@pytest.mark.parametrize(("mid", "attr", "reported", "src"), EXACT, ids=[f"{r[0]}-{r[1]}" for r in EXACT])
def test_param_counts_match_independent_exact_counts(mid, attr, reported, src):
    ours = getattr(_model(mid), attr) / 1e9
    tol = _unit(reported) / 2 + 1e-9
    assert abs(ours - float(reported)) <= tol, f"{mid}.{attr} = {ours:.4f}B, source {src} says {reported}B"


def test_deepseek_v3_mtp_module_size():
    """moe-models.yaml: the MTP module adds 11.61B unique weights (embedding and head are shared)."""
    m = _model("deepseek-v3")
    assert abs((m.total_params - m.total_params_main) / 1e9 - 11.61) <= 0.005


def test_deepseek_v3_total_with_mtp_matches_megatron_minus_eh_proj():
    """megatron.md §3.1: Megatron counts 682.53B with MTP but leaves the MTP eh-proj (2h x h) out."""
    m = _model("deepseek-v3")
    eh_proj = 2 * 7168 * 7168
    assert abs((m.total_params - eh_proj) / 1e9 - 682.53) <= 0.005 + 2e-5  # + its two h-sized norms


def test_active_conventions_are_ordered():
    """For untied models: active (both embeddings) - active without input embedding = V*h exactly."""
    for n in CAT.model_names():
        m = _model(n)
        if m.untie_embeddings_and_output_weights:
            assert m.active_params - m.active_params_no_input_embedding == m.vocab_size * m.hidden_size


# --------------------------------------------------------------------------------------------------------
# (b) FLOPs per token at s = 4096, reference values computed with Megatron's num_floating_point_operations
#     (reference/megatron.md §3.1), within 0.1 %
FLOPS = [
    ("mixtral-8x7b", None, 7.971e10),
    ("mixtral-8x22b", None, 2.422e11),
    ("qwen3-30b-a3b", None, 2.301e10),
    ("qwen3-235b-a22b", None, 1.480e11),
    ("deepseek-v3", None, 2.600e11),
    ("deepseek-v3", 0, 2.498e11),
]


@pytest.mark.parametrize(("mid", "mtp", "expected"), FLOPS, ids=[f"{r[0]}-mtp{r[1]}" for r in FLOPS])
def test_flops_per_token_match_megatron(mid, mtp, expected):
    m = _model(mid)
    if mtp is not None:
        m = dataclasses.replace(m, mtp_num_layers=mtp)
    got = m.flops_per_token(4096)
    assert got == pytest.approx(expected, rel=1e-3)


def test_flops_without_mtp_drop_by_the_mtp_share():
    m = _model("deepseek-v3")
    no_mtp = dataclasses.replace(m, mtp_num_layers=0)
    assert no_mtp.layer_kinds.count("mtp") == 0
    assert m.flops_per_token(4096) > no_mtp.flops_per_token(4096)


def test_flops_use_default_sequence_length():
    m = _model("mixtral-8x7b")
    assert m.defaults.seq_length == 4096
    assert m.flops_per_token() == m.flops_per_token(4096)
    assert m.flops_per_token(8192) > m.flops_per_token(4096)


# --------------------------------------------------------------------------------------------------------
# (c) layer kinds
def test_deepseek_v3_layer_kinds():
    kinds = _model("deepseek-v3").layer_kinds
    assert kinds == ("dense",) * 3 + ("moe",) * 58 + ("mtp",)
    m = _model("deepseek-v3")
    assert (m.num_dense_layers, m.num_moe_layers, m.mtp_num_layers) == (3, 58, 1)
    assert m.mtp_is_moe


@pytest.mark.parametrize(("mid", "n"), [("llama-2-7b", 32), ("llama-2-13b", 40)])
def test_llama2_is_all_dense(mid, n):
    m = _model(mid)
    assert m.layer_kinds == ("dense",) * n
    assert not m.is_moe
    assert m.total_params == m.active_params


@pytest.mark.parametrize(
    ("mid", "n"),
    [("mixtral-s", 24), ("mixtral-l", 48), ("mixtral-8x7b", 32), ("qwen3-235b-a22b", 94), ("gpt-oss-120b", 36)],
)
def test_all_moe_models(mid, n):
    assert _model(mid).layer_kinds == ("moe",) * n


@pytest.mark.parametrize(("mid", "n_dense", "n_moe"), [("deepseek-v2-lite", 1, 26), ("deepseek-v2", 1, 59)])
def test_deepseek_v2_first_layer_dense(mid, n_dense, n_moe):
    assert _model(mid).layer_kinds == ("dense",) * n_dense + ("moe",) * n_moe


def test_hapmoe_model_settings():
    """HAPMoE Appendix A (reference/papers.md §1.7)."""
    s, big = _model("mixtral-s"), _model("mixtral-l")
    assert (s.num_layers, s.hidden_size, s.expert_ffn, s.num_attention_heads, s.groups) == (24, 4096, 14336, 32, 8)
    assert (big.num_layers, big.hidden_size, big.expert_ffn, big.num_attention_heads, big.groups) == (
        48,
        6144,
        16384,
        48,
        8,
    )
    for m in (s, big):
        assert (m.num_experts, m.moe_router_topk) == (8, 2)
        assert (m.defaults.seq_length, m.defaults.micro_batch_size) == (4096, 1)
    assert (s.defaults.global_batch_size, s.defaults.moe_token_dispatcher_type) == (256, "allgather")
    assert (big.defaults.global_batch_size, big.defaults.moe_token_dispatcher_type) == (512, "alltoall")


# --------------------------------------------------------------------------------------------------------
# (d) Megatron's --moe-layer-freq forms (megatron/training/arguments.py `moe_freq_type` help text)
BASE = {
    "name": "t",
    "num_layers": 12,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "vocab_size": 128,
    "num_experts": 4,
    "moe_router_topk": 2,
}


@pytest.mark.parametrize(
    ("freq", "expected"),
    [
        (1, (1,) * 12),
        (3, (1, 0, 0) * 4),
        ([0, 1] * 6, (0, 1) * 6),
        ("([0]*3+[1]*9)", (0,) * 3 + (1,) * 9),
        ("([0]+[1]*11)", (0,) + (1,) * 11),
        ("[0,1]*6", (0, 1) * 6),
        ("([1, 1, 0] * 4)", (1, 1, 0) * 4),
    ],
)
def test_moe_layer_freq_forms(freq, expected):
    m = model_from_dict({**BASE, "moe_layer_freq": freq}, "t.yaml")
    assert m.moe_pattern == expected
    assert m.layer_kinds == tuple("moe" if x else "dense" for x in expected)


def test_moe_layer_freq_deepseek_string():
    m = model_from_dict({**BASE, "num_layers": 61, "moe_layer_freq": "([0]*3+[1]*58)"}, "t.yaml")
    assert m.moe_pattern == (0, 0, 0) + (1,) * 58


@pytest.mark.parametrize(
    ("freq", "expected"),
    [
        ("([1]*3+[0]*1)*3", (1, 1, 1, 0) * 3),  # Megatron's own help-text example
        ("([1]*3+[0]*3)*2", (1, 1, 1, 0, 0, 0) * 2),
        ("3", (1, 0, 0) * 4),  # "N" as a string means the same as the integer N
    ],
)
def test_moe_layer_freq_megatron_grouped_forms(freq, expected):
    m = model_from_dict({**BASE, "moe_layer_freq": freq}, "t.yaml")
    assert m.moe_pattern == expected


@pytest.mark.parametrize("freq", ["([0]*3+[2]*9)", "[0,1", "1+1", "([0]*3+[1]*9", "eval('1')", "", "[]"])
def test_moe_layer_freq_garbage_is_a_spec_error(freq):
    with pytest.raises(SpecError) as ei:
        model_from_dict({**BASE, "moe_layer_freq": freq}, "t.yaml")
    assert "moe_layer_freq" in str(ei.value)
    assert "t.yaml" in str(ei.value)


# --------------------------------------------------------------------------------------------------------
# (e) closed-form counts on tiny made-up models, worked out by hand
def test_tiny_gqa_moe_closed_form():
    # 3 layers, pattern dense/moe/moe; h=8, 4 heads of 4 (q width 16), 2 KV groups (kv width 8); dense FFN 20,
    # 4 experts of width 6, top-2, shared expert 10 with gate, router bias; vocab 100 untied; RMSNorm.
    doc = {
        "name": "tiny",
        "num_layers": 3,
        "hidden_size": 8,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "kv_channels": 4,
        "ffn_hidden_size": 20,
        "num_experts": 4,
        "moe_router_topk": 2,
        "moe_ffn_hidden_size": 6,
        "moe_shared_expert_intermediate_size": 10,
        "moe_shared_expert_gate": True,
        "moe_router_bias": True,
        "moe_layer_freq": [0, 1, 1],
        "vocab_size": 100,
    }
    m = model_from_dict(doc, "tiny.yaml")
    attn = 8 * 16 + 8 * 8 + 8 * 8 + 16 * 8  # Wq, Wk, Wv, Wo = 384
    norms = 8 + 8  # pre-attention and pre-MLP RMSNorm
    dense_mlp = 3 * 8 * 20  # 480
    expert = 3 * 8 * 6  # 144
    shared = 3 * 8 * 10 + 8  # 248 incl. the sigmoid gate
    router = 8 * 4 + 4  # 36
    dense_layer = attn + norms + dense_mlp  # 880
    moe_layer_all = attn + norms + router + shared + 4 * expert  # 1260
    moe_layer_act = attn + norms + router + shared + 2 * expert  # 972
    final_norm, emb, head = 8, 100 * 8, 100 * 8
    assert m.attention_params == 384
    assert m.total_params == dense_layer + 2 * moe_layer_all + final_norm + emb + head == 5008
    assert m.active_params == dense_layer + 2 * moe_layer_act + final_norm + emb + head == 4432
    assert m.active_params_no_input_embedding == 4432 - 800
    assert m.total_params_main == m.total_params
    # Megatron FLOPs/token, by hand: vocab padded to 128; s = 16
    s, h, v = 16, 8, 128
    mlp = 6 * h * (20 * 3 * 1 + 6 * 2 * 3 * 2 + 10 * 3 * 2)
    a_lin = 6 * (h * (16 + 2 * 8) + 16 * h)
    expected = mlp + a_lin * 3 + 6 * h * v + s * 6 * 16 * 3
    assert m.flops_per_token(s) == expected == 9216 + 6912 + 6144 + 4608


def test_tiny_dense_layernorm_biases_tied():
    # LayerNorm (weight + bias), all linear biases, GELU MLP (2 matrices), tied embeddings, MHA
    doc = {
        "name": "d",
        "num_layers": 2,
        "hidden_size": 6,
        "num_attention_heads": 2,
        "ffn_hidden_size": 12,
        "vocab_size": 10,
        "swiglu": False,
        "normalization": "LayerNorm",
        "add_bias_linear": True,
        "untie_embeddings_and_output_weights": False,
    }
    m = model_from_dict(doc, "d.yaml")
    attn = 4 * 6 * 6 + 3 * 6 + 6  # QKV + O weights, QKV bias, O bias = 168
    mlp = 2 * 6 * 12 + 12 + 6  # fc1, fc2 weights and biases = 162
    norms = 2 * (6 + 6)  # two LayerNorms with weight and bias
    total = 2 * (attn + mlp + norms) + (6 + 6) + 10 * 6  # final LayerNorm; one shared embedding matrix
    assert m.total_params == total == 780
    assert m.active_params == total
    # tied: the one matrix is also the LM head, which every token uses
    assert m.active_params_no_input_embedding == total


def test_tiny_mla_with_mtp_closed_form():
    # MLA with q compression, 2 layers dense/moe, one MTP layer; h=8, 2 heads, q_lora 4, kv_lora 4,
    # qk nope 2 + rope 2, v 2; dense FFN 16; 4 experts of 4, top-1; shared 4; router bias; vocab 16 untied
    doc = {
        "name": "mla",
        "num_layers": 2,
        "hidden_size": 8,
        "num_attention_heads": 2,
        "ffn_hidden_size": 16,
        "num_experts": 4,
        "moe_router_topk": 1,
        "moe_ffn_hidden_size": 4,
        "moe_shared_expert_intermediate_size": 4,
        "moe_layer_freq": "([0]*1+[1]*1)",
        "moe_router_bias": True,
        "multi_latent_attention": True,
        "q_lora_rank": 4,
        "kv_lora_rank": 4,
        "qk_head_dim": 2,
        "qk_pos_emb_head_dim": 2,
        "v_head_dim": 2,
        "mtp_num_layers": 1,
        "vocab_size": 16,
    }
    m = model_from_dict(doc, "mla.yaml")
    q = 8 * 4 + 4 + 4 * 2 * (2 + 2)  # down-proj, q norm, up-proj = 68
    kv = 8 * (4 + 2) + 4 + 4 * 2 * (2 + 2)  # down-proj (latent + rope key), kv norm, up-proj = 84
    o = 2 * 2 * 8  # 32
    attn = q + kv + o  # 184
    dense = attn + 16 + 3 * 8 * 16  # 584
    moe = attn + 16 + (8 * 4 + 4) + 3 * 8 * 4 + 4 * 3 * 8 * 4  # 716
    moe_act = attn + 16 + (8 * 4 + 4) + 3 * 8 * 4 + 1 * 3 * 8 * 4  # 428
    main = dense + moe + 8 + 2 * 16 * 8
    assert m.attention_params == 184
    assert m.layer_kinds == ("dense", "moe", "mtp")
    assert m.total_params_main == main == 1564
    assert m.active_params == dense + moe_act + 8 + 2 * 16 * 8 == 1276
    mtp_lower = moe + 2 * 8 * 8 + 2 * 8  # MoE block + eh-proj + enorm + hnorm
    assert m.total_params - m.total_params_main >= mtp_lower


def test_tiny_mtp_layer_has_three_norms():
    doc = {
        "name": "mla",
        "num_layers": 2,
        "hidden_size": 8,
        "num_attention_heads": 2,
        "ffn_hidden_size": 16,
        "num_experts": 4,
        "moe_router_topk": 1,
        "moe_ffn_hidden_size": 4,
        "moe_shared_expert_intermediate_size": 4,
        "moe_layer_freq": [0, 1],
        "moe_router_bias": True,
        "multi_latent_attention": True,
        "q_lora_rank": 4,
        "kv_lora_rank": 4,
        "qk_head_dim": 2,
        "qk_pos_emb_head_dim": 2,
        "v_head_dim": 2,
        "mtp_num_layers": 1,
        "vocab_size": 16,
    }
    m = model_from_dict(doc, "mla.yaml")
    moe = 184 + 16 + 36 + 96 + 384
    assert m.total_params - m.total_params_main == moe + 2 * 8 * 8 + 3 * 8


def test_default_ffn_width_follows_megatron_for_swiglu():
    m = model_from_dict(
        {
            "name": "x",
            "num_layers": 2,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "vocab_size": 32000,
            "swiglu": True,
        },
        "x.yaml",
    )
    assert m.ffn == 10880  # int(4 * 4096 * 2 / 3 / 64) * 64


def test_num_experts_zero_means_dense():
    m = model_from_dict({**BASE, "num_experts": 0}, "t.yaml")
    assert not m.is_moe and m.layer_kinds == ("dense",) * 12


def test_default_ffn_width_without_swiglu_is_4h():
    m = model_from_dict(
        {"name": "x", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128, "swiglu": False},
        "x.yaml",
    )
    assert m.ffn == 256
    assert m.head_dim == 16


def test_vocab_padding_follows_megatron():
    m = model_from_dict({**BASE, "vocab_size": 32001}, "t.yaml")
    assert m.padded_vocab(1) == 32128
    assert m.padded_vocab(8) == 32768  # multiple of 128 * 8
    assert model_from_dict({**BASE, "vocab_size": 151936}, "t.yaml").padded_vocab(1) == 151936


@pytest.mark.parametrize(
    ("seq", "window", "freq", "layers"), [(64, 8, 2, 4), (40, 16, 0, 3), (32, 32, 2, 2), (50, 7, 3, 6)]
)
def test_attention_keys_factor_matches_enumeration(seq, window, freq, layers):
    """Windowed layers: the exact mean of min(i+1, W) keys over positions; full layers count S/2 (the cost
    model's and Megatron's causal convention); every freq-th layer (1-based) is full."""
    m = replace(_model("llama-2-7b"), num_layers=layers, window_size=window, window_attn_skip_freq=freq)
    total = 0.0
    for layer in range(1, layers + 1):
        if (freq and layer % freq == 0) or window >= seq:
            total += 1.0
        else:
            total += sum(min(i + 1, window) for i in range(seq)) / seq / (seq / 2)
    assert m.attention_keys_factor(seq) == pytest.approx(total / layers, rel=1e-12)
