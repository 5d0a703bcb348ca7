"""The MoE families people train now, imported from their real Hugging Face ``config.json`` files.

tests/data/hf/<model>/config.json are copies of the published configs (tests/data/hf/SOURCES.md says where
each comes from and what was trimmed). Every expected number here comes from outside this package: the
labs' published sizes (model cards, papers; each row cites its source), or layer shapes worked out by hand
from the config in the test itself.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import pytest

from hapmoe_milp.errors import SpecError
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs.hf import load_hf_config, model_from_hf_config
from hapmoe_milp.specs.loader import load_model_file
from hapmoe_milp.specs.model_doc import model_from_dict, model_to_dict

DATA = Path(__file__).parent / "data" / "hf"
CAT = Catalog()


class Family(NamedTuple):
    folder: str
    model_type: str
    catalog: str
    total_b: float  # the lab's published total (units of 1e9)
    total_attr: str
    active_b: float  # the lab's published active count
    convention: str  # which of our active counts the lab's convention corresponds to
    rounded: bool  # the lab printed one significant digit ("3B"): also accept anything that rounds to it
    source: str


# conventions: all_embeddings -> active_params, excl_input_embedding -> active_params_no_input_embedding,
# non_embedding -> active_params_non_embedding (see ModelSpec.active_count)
FAMILIES = [
    Family(
        "Kimi-K2-Instruct",
        "kimi_k2",
        "kimi-k2",
        1040,
        "total_params",
        32.6,
        "all_embeddings",
        False,
        "arXiv 2507.20534 (Kimi K2 tech report): 1.04T total, 32.6B activated",
    ),
    Family(
        "GLM-4.5",
        "glm4_moe",
        "glm-4.5",
        355,
        "total_params_main",
        32,
        "non_embedding",
        False,
        "huggingface.co/zai-org/GLM-4.5 model card: 355B total, 32B active",
    ),
    Family(
        "GLM-4.5-Air",
        "glm4_moe",
        "glm-4.5-air",
        106,
        "total_params_main",
        12,
        "non_embedding",
        False,
        "huggingface.co/zai-org/GLM-4.5-Air model card: 106B total, 12B active",
    ),
    Family(
        "Qwen3-Next-80B-A3B-Instruct",
        "qwen3_next",
        "qwen3-next-80b-a3b",
        80,
        "total_params",
        3,
        "non_embedding",
        True,
        "huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct: 80B total, 3B activated",
    ),
    Family(
        "Llama-4-Scout-17B-16E",
        "llama4",
        "llama-4-scout",
        109,
        "total_params",
        17,
        "all_embeddings",
        False,
        "ai.meta.com/blog/llama-4-multimodal-intelligence: 17B active, 109B total (with vision)",
    ),
    Family(
        "Llama-4-Maverick-17B-128E",
        "llama4",
        "llama-4-maverick",
        400,
        "total_params",
        17,
        "all_embeddings",
        False,
        "ai.meta.com/blog/llama-4-multimodal-intelligence: 17B active, 400B total",
    ),
    Family(
        "dbrx-base",
        "dbrx",
        "dbrx",
        132,
        "total_params",
        36,
        "all_embeddings",
        False,
        "databricks.com/blog/introducing-dbrx-new-state-art-open-llm: 132B total, 36B active",
    ),
    Family(
        "granite-3.0-3b-a800m-base",
        "granitemoe",
        "granite-3.0-3b-a800m",
        3.3,
        "total_params",
        0.8,
        "non_embedding",
        False,
        "huggingface.co/ibm-granite/granite-3.0-3b-a800m-base: 3.3B, 800M active",
    ),
    Family(
        "Jamba-v0.1",
        "jamba",
        "jamba-v0.1",
        52,
        "total_params",
        12,
        "all_embeddings",
        False,
        "arXiv 2403.19887 (Jamba): 52B total, 12B active",
    ),
    Family(
        "Hunyuan-A13B-Instruct",
        "hunyuan",
        "hunyuan-a13b",
        80,
        "total_params",
        13,
        "all_embeddings",
        False,
        "huggingface.co/tencent/Hunyuan-A13B-Instruct: 80B total, 13B active",
    ),
    Family(
        "MiniMax-M2",
        "minimax_m2",
        "minimax-m2",
        230,
        "total_params_main",
        10,
        "non_embedding",
        False,
        "huggingface.co/MiniMaxAI/MiniMax-M2: 230B total, 10B active",
    ),
    Family(
        "dots.llm1.base",
        "dots1",
        "dots-llm1",
        142,
        "total_params",
        14,
        "all_embeddings",
        False,
        "arXiv 2506.05767 (dots.llm1): 142B total, 14B activated",
    ),
    Family(
        "Ling-lite",
        "bailing_moe",
        "ling-lite",
        16.8,
        "total_params",
        2.75,
        "all_embeddings",
        False,
        "arXiv 2503.05139 (Ling): Ling-Lite 16.8B total, 2.75B activated",
    ),
    Family(
        "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
        "nemotron_h",
        "nemotron-3-nano-30b-a3b",
        31.6,
        "total_params",
        3.2,
        "excl_input_embedding",
        False,
        "huggingface.co/nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16: 31.6B total, ~3.2B active (3.6B w/ emb.)",
    ),
]
IDS = [f.folder for f in FAMILIES]


def _load(fam: Family):
    return load_hf_config(DATA / fam.folder / "config.json")


def _within(ours: float, published: float, rounded: bool) -> bool:
    if abs(ours / 1e9 - published) <= 0.03 * published:
        return True
    return rounded and abs(ours / 1e9 - published) < 0.5  # "3B" covers [2.5, 3.5)


@pytest.mark.parametrize("fam", FAMILIES, ids=IDS)
def test_real_config_is_accepted_with_its_model_type(fam: Family) -> None:
    doc = json.loads((DATA / fam.folder / "config.json").read_text())  # Python's JSON, as transformers writes
    assert doc["model_type"] == fam.model_type
    m = _load(fam)
    assert m.name == fam.folder  # the folder name, as a snapshot directory gives
    assert m.description.endswith(f"({fam.model_type})")


@pytest.mark.parametrize("fam", FAMILIES, ids=IDS)
def test_counts_within_3_percent_of_published(fam: Family) -> None:
    m = _load(fam)
    total = getattr(m, fam.total_attr)
    active = m.active_count(fam.convention)  # type: ignore[arg-type]
    assert abs(total / 1e9 - fam.total_b) <= 0.03 * fam.total_b, f"total {total / 1e9:.2f}B vs {fam.source}"
    assert _within(active, fam.active_b, fam.rounded), f"active {active / 1e9:.3f}B vs {fam.source}"


@pytest.mark.parametrize("fam", FAMILIES, ids=IDS)
def test_catalog_entry_equals_the_imported_config(fam: Family) -> None:
    """The catalog's flagship entry is the config's architecture, and says what the lab says."""
    cat = CAT.model(fam.catalog)
    imported = _load(fam)
    # kv_channels unset means hidden / heads (Megatron's default): compare the head width itself
    a = model_to_dict(replace(cat, kv_channels=cat.head_dim))
    b = model_to_dict(replace(imported, kv_channels=imported.head_dim))
    for k in ("name", "description", "source", "official", "defaults"):
        a.pop(k, None)
        b.pop(k, None)
    assert a == b
    assert cat.official is not None
    assert cat.official.total_b == fam.total_b and cat.official.active_b == fam.active_b
    assert cat.official.active_convention == fam.convention
    assert any(s.startswith("https://huggingface.co/") for s in cat.sources)


@pytest.mark.parametrize("fam", FAMILIES, ids=IDS)
def test_plan_document_round_trip(fam: Family) -> None:
    m = _load(fam)
    assert model_from_dict(model_to_dict(m), "plan") == replace(m, origin="plan")


# ---------------------------------------------------------------------------------------- layer layouts
def test_qwen3_next_layers_are_three_linear_to_one_softmax() -> None:
    m = load_hf_config(DATA / "Qwen3-Next-80B-A3B-Instruct" / "config.json")
    assert m.decoder_kinds == (("gdn_moe",) * 3 + ("moe",)) * 12
    assert m.linear_attention_freq == 4 and m.attention_output_gate and m.rotary_percent == 0.25
    # gated DeltaNet by hand: q,k 16 heads x 128, v,z 32 heads x 128, beta and a per value head
    h = 2048
    in_proj = h * (2 * 16 * 128 + 2 * 32 * 128 + 2 * 32)
    conv = (2 * 16 * 128 + 32 * 128) * 4
    gdn = in_proj + conv + 2 * 32 + 128 + 32 * 128 * h
    assert m.mixer_params("gdn") == gdn
    # gated attention: q and its gate (2 x 16 x 256), k and v (2 x 2 x 256), o, per-head q/k norms
    attn = h * 2 * 16 * 256 + h * 2 * 2 * 256 + 16 * 256 * h + 2 * 256
    assert m.mixer_params("attention") == attn


def test_nemotron_3_nano_pattern_and_mamba2_by_hand() -> None:
    m = load_hf_config(DATA / "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16" / "config.json")
    kinds = m.layer_kinds
    assert (kinds.count("mamba"), kinds.count("moe_mlp"), kinds.count("attention")) == (23, 23, 6)
    assert m.is_hybrid and not m.swiglu and m.squared_relu
    h, inner, groups, state, heads = 2688, 64 * 64, 8, 128, 64
    conv_dim = inner + 2 * groups * state
    mamba = h * (2 * inner + 2 * groups * state + heads) + conv_dim * 5 + 3 * heads + inner + inner * h
    assert m.mixer_params("mamba") == mamba
    # squared-ReLU experts: two h x F matrices each
    assert m.expert_params == 2 * h * 1856
    assert m.layer_params("moe_mlp")["replicated"] == h + h * 128 + 128  # norm, router, score bias


def test_jamba_is_mixer_then_mlp_per_layer() -> None:
    m = load_hf_config(DATA / "Jamba-v0.1" / "config.json")
    pat = m.hybrid_override_pattern or ""
    assert len(pat) == 64 and m.num_layers == 64
    mixers, mlps = pat[0::2], pat[1::2]
    assert [i for i, c in enumerate(mixers) if c == "*"] == [4, 12, 20, 28]  # attn period 8, offset 4
    assert [i for i, c in enumerate(mlps) if c == "E"] == list(range(1, 32, 2))  # experts period 2, offset 1
    assert m.mamba_version == 1
    h, d, n, r = 4096, 8192, 16, 256
    mamba1 = h * 2 * d + d * 4 + d + d * (r + 2 * n) + r * d + d + d * n + d + d * h + r + 2 * n
    assert m.mixer_params("mamba") == mamba1


def test_llama4_maverick_interleaves_and_scout_does_not() -> None:
    mav = load_hf_config(DATA / "Llama-4-Maverick-17B-128E" / "config.json")
    scout = load_hf_config(DATA / "Llama-4-Scout-17B-16E" / "config.json")
    assert mav.moe_pattern == (0, 1) * 24
    assert scout.moe_pattern == (1,) * 48
    for m in (mav, scout):
        assert m.no_rope_freq == 4 and m.attention_chunk_size == 8192
        assert m.moe_shared_expert_intermediate_size == 8192 and m.moe_router_topk == 1
    assert scout.qk_l2_norm and not mav.qk_l2_norm


def test_llama4_chunked_attention_keys_by_enumeration() -> None:
    """Mean keys per query over all layers, counted position by position, relative to full causal attention
    (the spec normalises full attention to S/2 keys rather than (S+1)/2: hence 0.1%)."""
    m = load_hf_config(DATA / "Llama-4-Scout-17B-16E" / "config.json")
    for seq in (4096, 8192, 20000):
        total = 0
        for layer in range(48):
            nope = (layer + 1) % 4 == 0
            total += sum((i + 1) if nope else (i % 8192 + 1) for i in range(seq))
        want = total / 48 / seq / ((seq + 1) / 2)
        assert m.attention_keys_factor(seq) == pytest.approx(want, rel=1e-3)
    assert m.attention_keys_factor(65536) < 0.4  # 36 of 48 layers see at most 8192 keys


def test_glm_and_kimi_mappings() -> None:
    glm = load_hf_config(DATA / "GLM-4.5" / "config.json")
    assert glm.rotary_percent == 0.5 and glm.qk_layernorm and glm.add_qkv_bias
    assert glm.moe_pattern == (0,) * 3 + (1,) * 89 and glm.mtp_num_layers == 1
    assert glm.moe_shared_expert_intermediate_size == 1536 and glm.moe_router_bias
    air = load_hf_config(DATA / "GLM-4.5-Air" / "config.json")
    assert not air.qk_layernorm and air.moe_pattern[0] == 0 and sum(air.moe_pattern) == 45
    kimi = load_hf_config(DATA / "Kimi-K2-Instruct" / "config.json")
    assert kimi.multi_latent_attention and kimi.num_experts == 384 and kimi.mtp_num_layers == 0
    assert kimi.moe_router_num_groups is None  # n_group 1: no group-limited routing


def test_hunyuan_lists_and_shared_mlp() -> None:
    m = load_hf_config(DATA / "Hunyuan-A13B-Instruct" / "config.json")
    assert (m.num_experts, m.moe_router_topk, m.moe_ffn_hidden_size) == (64, 8, 3072)
    assert m.moe_shared_expert_intermediate_size == 3072 and not m.untie_embeddings_and_output_weights


# ---------------------------------------------------------------------------------------- JSON and refusals
def test_infinity_in_a_transformers_config_is_accepted(tmp_path: Path) -> None:
    text = (DATA / "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16" / "config.json").read_text()
    assert '"time_step_limit": [0.0, Infinity]' in text
    nan = tmp_path / "nan-model" / "config.json"
    nan.parent.mkdir()
    nan.write_text(text.replace('"time_step_floor": 0.0001', '"time_step_floor": NaN'))
    for p in (DATA / "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16" / "config.json", nan):
        assert load_model_file(p).total_params > 0


def test_nan_in_a_field_we_read_names_the_field(tmp_path: Path) -> None:
    p = tmp_path / "m" / "config.json"
    p.parent.mkdir()
    doc = (DATA / "Ling-lite" / "config.json").read_text().replace('"hidden_size": 2048', '"hidden_size": NaN')
    p.write_text(doc)
    with pytest.raises(SpecError, match="hidden_size") as exc:
        load_model_file(p)
    assert "JSON" not in str(exc.value)


def test_nan_in_our_own_json_is_still_refused(tmp_path: Path) -> None:
    p = tmp_path / "model.json"
    p.write_text('{"name": "a", "num_layers": NaN}')
    with pytest.raises(SpecError, match="NaN is not valid JSON"):
        load_model_file(p)


REFUSALS = [
    ("Hunyuan-A13B-Instruct", {"use_cla": True}, "hunyuan", "cross-layer attention", "use_cla"),
    ("MiniMax-M2", {"attn_type_list": [0] + [1] * 61}, "minimax_m2", "lightning", "attn_type_list"),
    ("Kimi-K2-Instruct", {"index_topk": 2048}, "kimi_k2", "sparse attention", "index_topk"),
    ("Jamba-v0.1", {"mamba_proj_bias": True}, "jamba", "biases on the Mamba projections", "mamba_proj_bias"),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", {"mlp_hidden_act": "silu"}, "nemotron_h", "activation", "mlp_hidden_act"),
    ("Kimi-K2-Instruct", {"model_type": "minimax"}, "minimax", "lightning", "model_type"),
    ("Kimi-K2-Instruct", {"model_type": "deepseek_v32"}, "deepseek_v32", "sparse attention", "model_type"),
]


@pytest.mark.parametrize(
    ("folder", "edit", "mt", "feature", "field"), REFUSALS, ids=[r[2] + "-" + r[4] for r in REFUSALS]
)
def test_unsupported_feature_names_model_type_and_feature(folder, edit, mt, feature, field) -> None:
    doc = json.loads((DATA / folder / "config.json").read_text())
    doc.update(edit)
    with pytest.raises(SpecError) as exc:
        model_from_hf_config(doc, f"{folder}/config.json")
    msg = str(exc.value)
    assert f"'{mt}'" in msg and feature in msg and exc.value.field == field


def test_non_periodic_nope_layers_are_refused_by_name() -> None:
    doc = json.loads((DATA / "Llama-4-Scout-17B-16E" / "config.json").read_text())
    doc["text_config"]["no_rope_layers"] = [1, 0] + [1] * 46
    with pytest.raises(SpecError, match=r"'llama4'.*NoPE"):
        model_from_hf_config(doc, "x/config.json")
