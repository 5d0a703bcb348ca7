"""Bad input never escapes as a raw Python exception: only HapmoeError (or success) comes out.

Property tests feed the loaders random and corrupted documents; explicit cases check that each message
names the file and the field, so the CLI's one-line error is enough to fix the input.

Regression cases for leaks found by these tests (NUL bytes, over-long names, odd whitespace, huge repeat
counts) sit at the end of the file.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hapmoe_milp.errors import HapmoeError, SpecError
from hapmoe_milp.specs import Catalog
from hapmoe_milp.specs._fields import load_document
from hapmoe_milp.specs.device import PRIMITIVES
from hapmoe_milp.specs.hf import model_from_hf_config
from hapmoe_milp.specs.model_doc import model_from_dict

CAT = Catalog()
SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
_counter = itertools.count()

# ------------------------------------------------------------------------------------------ strategies
# Integers and floats stay within +-1e6: a loader that accepts num_layers = 1e12 would spend minutes building
# the layer pattern (reported separately), and that is not what these tests are about.
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10),
    st.integers(-(10**6), 10**6),
    st.floats(-1e6, 1e6),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1.5]),
    st.text(max_size=12),
    st.sampled_from(
        [
            "",
            "RMSNorm",
            "LayerNorm",
            "alltoall",
            "flex",
            "([0]*3+[1]*9)",
            "[1]*2",
            "8xtst",
            "1e3",
            "true",
            "null",
            "~",
            "- a",
            "{",
            "0x10",
        ]
    ),
)
junk = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers(-3, 3)), inner, max_size=4),
    ),
    max_leaves=12,
)


def _freq_expr():
    term = st.tuples(st.lists(st.sampled_from("012"), min_size=1, max_size=3), st.integers(0, 80))
    return st.lists(term, min_size=1, max_size=4).map(
        lambda ts: "(" + "+".join(f"[{','.join(v)}]*{n}" for v, n in ts) + ")"
    )


CATALOG_DOCS = {n: yaml.safe_load((CAT.models_dir / f"{n}.yaml").read_text()) for n in CAT.model_names()}
MODEL_FIELDS = sorted(
    {k for d in CATALOG_DOCS.values() for k in d}
    | {"make_vocab_size_divisible_by", "q_lora_rank", "moe_shared_expert_gate", "attention_sinks"}
)


@st.composite
def mutated_model_doc(draw):
    """A real catalog entry with a few fields dropped, replaced by junk, or added."""
    doc = json.loads(json.dumps(CATALOG_DOCS[draw(st.sampled_from(sorted(CATALOG_DOCS)))]))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["drop", "junk", "junk", "nested", "add", "freq", "small"]))
        key = draw(st.sampled_from(MODEL_FIELDS))
        if op == "drop":
            doc.pop(key, None)
        elif op == "junk":
            doc[key] = draw(junk)
        elif op == "nested":
            sub = draw(st.sampled_from(["official", "defaults"]))
            if isinstance(doc.get(sub), dict):
                k = draw(
                    st.sampled_from(
                        [
                            "total_b",
                            "active_b",
                            "active_convention",
                            "includes_mtp",
                            "source",
                            "seq_length",
                            "global_batch_size",
                            "micro_batch_size",
                            "moe_token_dispatcher_type",
                            "bogus",
                        ]
                    )
                )
                doc[sub][k] = draw(junk)
            else:
                doc[sub] = draw(junk)
        elif op == "add":
            doc[draw(st.text(min_size=1, max_size=10))] = draw(junk)
        elif op == "freq":
            doc["moe_layer_freq"] = draw(st.one_of(_freq_expr(), st.lists(st.integers(-1, 2), max_size=70)))
        else:  # plausible but wrong sizes: zero, negative, too many groups/top-k
            doc[
                draw(
                    st.sampled_from(
                        [
                            "num_layers",
                            "num_experts",
                            "moe_router_topk",
                            "num_query_groups",
                            "num_attention_heads",
                            "hidden_size",
                            "mtp_num_layers",
                            "kv_lora_rank",
                        ]
                    )
                )
            ] = draw(st.integers(-3, 300))
    return doc


@st.composite
def random_model_doc(draw):
    keys = st.one_of(st.sampled_from(MODEL_FIELDS), st.text(max_size=10))
    return draw(st.dictionaries(keys, junk, max_size=12))


def _exercise(m) -> None:
    """Everything downstream reads from a loaded spec must work too."""
    _ = (m.total_params, m.total_params_main, m.active_params, m.active_params_no_input_embedding)
    _ = m.flops_per_token(m.defaults.seq_length)
    _ = m.layer_kinds, m.summary()
    for kind in set(m.layer_kinds):
        m.layer_params(kind, active=True)


def _only_hapmoe(fn, *args):
    try:
        return fn(*args)
    except HapmoeError as e:
        assert str(e), "error without a message"
        return None


# ------------------------------------------------------------------------------------------ model documents
@SETTINGS
@given(mutated_model_doc())
def test_mutated_catalog_docs_raise_only_hapmoe_errors(doc):
    m = _only_hapmoe(model_from_dict, doc, "fuzz.yaml")
    if m is not None:
        _exercise(m)


@SETTINGS
@given(random_model_doc())
def test_random_model_docs_raise_only_hapmoe_errors(doc):
    m = _only_hapmoe(model_from_dict, doc, "fuzz.yaml")
    if m is not None:
        _exercise(m)


@SETTINGS
@given(junk)
def test_non_mapping_documents(doc):
    _only_hapmoe(model_from_dict, doc, "fuzz.yaml")
    _only_hapmoe(model_from_hf_config, doc, "fuzz/config.json")


_HF_BASE = {
    "model_type": "deepseek_v3",
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 256,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8,
    "v_head_dim": 8,
    "topk_method": "noaux_tc",
    "num_nextn_predict_layers": 1,
    "num_local_experts": 8,
    "num_experts": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "head_dim": 16,
    "shared_expert_intermediate_size": 64,
    "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
}
_HF_KEYS = sorted(_HF_BASE)
_HF_TYPES = [
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "olmoe",
    "gpt_oss",
    "llama",
    "qwen2",
    "qwen3",
]


@SETTINGS
@given(st.sampled_from(_HF_TYPES), st.lists(st.tuples(st.sampled_from(_HF_KEYS), junk, st.booleans()), max_size=4))
def test_mutated_hf_configs_raise_only_hapmoe_errors(model_type, edits):
    doc = {**_HF_BASE, "model_type": model_type}
    for key, value, drop in edits:
        if drop:
            doc.pop(key, None)
        else:
            doc[key] = value
    m = _only_hapmoe(model_from_hf_config, doc, "fuzz/config.json")
    if m is not None:
        _exercise(m)


# ------------------------------------------------------------------------------------------ files on disk
def _new_file(tmp_path_factory, suffix: str, data: bytes) -> Path:
    p = tmp_path_factory.mktemp("fz") / f"doc{next(_counter)}{suffix}"
    p.write_bytes(data)
    return p


@SETTINGS
@given(data=st.binary(max_size=600), suffix=st.sampled_from([".yaml", ".yml", ".json"]))
def test_random_bytes_files(tmp_path_factory, data, suffix):
    p = _new_file(tmp_path_factory, suffix, data)
    doc = _only_hapmoe(load_document, p)
    assert doc is None or isinstance(doc, dict)
    _only_hapmoe(CAT.model, str(p))


@SETTINGS
@given(doc=mutated_model_doc(), cuts=st.lists(st.tuples(st.integers(0, 4000), st.binary(max_size=6)), max_size=4))
def test_corrupted_yaml_text(tmp_path_factory, doc, cuts):
    """Serialise a mutated document, then splice random bytes into the text."""
    text = bytearray(yaml.safe_dump(doc, allow_unicode=True).encode())
    for pos, blob in cuts:
        pos = min(pos, len(text))
        text[pos : pos + len(blob)] = blob
    p = _new_file(tmp_path_factory, ".yaml", bytes(text))
    m = _only_hapmoe(CAT.model, str(p))
    if m is not None:
        _exercise(m)


@SETTINGS
@given(doc=mutated_model_doc())
def test_mutated_docs_as_json_files(tmp_path_factory, doc):
    p = _new_file(tmp_path_factory, ".json", json.dumps(doc).encode())
    m = _only_hapmoe(CAT.model, str(p))
    if m is not None:
        _exercise(m)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@pytest.mark.parametrize("depth", [50, 5000])
def test_deeply_nested_documents(tmp_path, suffix, depth):
    nested = "[" * depth + "]" * depth
    p = tmp_path / f"deep{suffix}"
    text = f'{{"name": "x", "num_layers": {nested}}}' if suffix == ".json" else f"name: x\nnum_layers: {nested}\n"
    p.write_text(text)
    with pytest.raises(SpecError) as ei:
        CAT.model(str(p))
    assert p.name in str(ei.value)


def test_document_shape_walks_without_recursion():
    """The checker itself must not crash on what some YAML parser builds (a 5,000-deep list parsed on CI)."""
    from hapmoe_milp.specs._fields import MAX_DOCUMENT_DEPTH, _document_shape

    deep: list = []
    for _ in range(50_000):
        deep = [deep]
    assert _document_shape(deep)[1] > MAX_DOCUMENT_DEPTH
    shared = [1, 2, 3]
    assert _document_shape({"a": shared, "b": [shared, shared]}) == (1 + 4 + (1 + 4 + 4), 3)
    cyclic: dict = {}
    cyclic["self"] = cyclic
    assert _document_shape(cyclic) == (2, 2)  # a recursive alias is walked once
    # a shared sub-tree met shallow first still counts at its deepest use
    inner: list = []
    for _ in range(40):
        inner = [inner]
    outer: list = [inner]
    for _ in range(40):
        outer = [outer]
    assert _document_shape([inner, outer])[1] > MAX_DOCUMENT_DEPTH


def test_deeply_nested_document_names_the_depth(tmp_path):
    p = tmp_path / "deep.yaml"
    p.write_text("name: x\nnum_layers: " + "[" * 100 + "]" * 100 + "\n")
    with pytest.raises(SpecError, match="nests deeper than"):
        CAT.model(str(p))


def test_deeply_nested_mapping_value():
    value: object = 1
    for _ in range(300):
        value = {"a": value}
    doc = {**CATALOG_DOCS["mixtral-8x7b"], "official": value}
    with pytest.raises(SpecError, match="official"):
        model_from_dict(doc, "deep.yaml")


# ------------------------------------------------------------------------------------------ clusters
_T = {"x": [1.0, 1e12], "y": [0.5, 0.8], "extrapolate": "clamp"}
TEST_DEVICE = {
    "id": "tst",
    "name": "Test part",
    "vendor": "none",
    "provenance": "datasheet+public-benchmarks",
    "sources": ["https://example.com/datasheet"],
    "memory_gib": 80,
    "memory_bandwidth_GBps": 3000,
    "peak_tflops": {"bf16": 900},
    "devices_per_node": 8,
    "intra_node": {"fabric": "switch", "per_device_GBps": 400, "per_pair_GBps": 400},
    "nic_Gbps": 400,
    "tables": {
        "gemm_efficiency": _T,
        "attention_efficiency": _T,
        "attention_bwd_efficiency": _T,
        "memory_bound_efficiency": 0.7,
        "collectives": {link: {p: {"x": [1, 1e12], "y": [10, 100]} for p in PRIMITIVES} for link in ("intra", "inter")},
    },
}
VALID_CLUSTER = {
    "name": "c",
    "description": "two nodes",
    "groups": [{"device": "tst", "nodes": 2}],
    "cross_link": {"efficiency": 0.5, "latency_us": 20},
    "prices": {"tst": 2.0},
    "sources": ["https://example.com"],
}


@pytest.fixture(scope="module")
def small_catalog(tmp_path_factory) -> Catalog:
    root = tmp_path_factory.mktemp("catalog")
    (root / "clusters" / "devices").mkdir(parents=True)
    (root / "clusters" / "devices" / "tst.yaml").write_text(yaml.safe_dump(TEST_DEVICE))
    (root / "models").mkdir()
    return Catalog(root=root)


def test_small_catalog_is_valid(small_catalog):
    assert small_catalog.cluster("16xtst").world_size == 16
    p = small_catalog.root / "ok.yaml"
    p.write_text(yaml.safe_dump(VALID_CLUSTER))
    assert small_catalog.cluster(str(p)).world_size == 16


_ws = st.sampled_from(["", " ", "  "])
_inline = st.lists(
    st.tuples(
        st.integers(0, 10**25).map(str),
        _ws,
        st.sampled_from("x*"),
        _ws,
        st.text("abcxyzABC019_.-", min_size=1, max_size=8),
        _ws,
    ),
    min_size=1,
    max_size=4,
).map(lambda parts: "+".join("".join(p) for p in parts))
_inline_tst = st.lists(
    st.tuples(st.integers(0, 40), st.sampled_from(["tst", "TST", "tst2", "h800"]), st.sampled_from(["x", "*", " x "])),
    min_size=1,
    max_size=3,
).map(lambda parts: "+".join(f"{n}{sep}{d}" for n, d, sep in parts))


@SETTINGS
@given(st.one_of(st.text(max_size=30), _inline, _inline_tst))
def test_random_inline_clusters_default_catalog(ref):
    _only_hapmoe(CAT.cluster, ref)
    _only_hapmoe(CAT.model, ref)


@SETTINGS
@given(st.one_of(st.text(max_size=30), _inline, _inline_tst))
def test_random_inline_clusters_with_a_device(small_catalog, ref):
    c = _only_hapmoe(small_catalog.cluster, ref)
    if c is not None:
        assert c.world_size > 0 and set(c.device_types) <= {"tst"}


@SETTINGS
@given(
    edits=st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "name",
                    "groups",
                    "cross_link",
                    "prices",
                    "sources",
                    "description",
                    "notes",
                    "bogus",
                    "groups.0.nodes",
                    "groups.0.device",
                    "groups.0.devices_per_node",
                    "cross_link.efficiency",
                    "cross_link.bandwidth_GBps",
                ]
            ),
            junk,
            st.booleans(),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_mutated_cluster_files(small_catalog, tmp_path_factory, edits):
    doc = json.loads(json.dumps(VALID_CLUSTER))
    for path, value, drop in edits:
        *parents, last = path.split(".")
        node = doc
        for k in parents:
            node = (
                node[int(k)]
                if isinstance(node, list) and k.isdigit() and len(node) > int(k)
                else (node.get(k) if isinstance(node, dict) else None)
            )
            if node is None:
                break
        if isinstance(node, dict):
            if drop:
                node.pop(last, None)
            else:
                node[last] = value
    # pinned separately: a scalar `sources` leaks TypeError
    p = _new_file(tmp_path_factory, ".yaml", yaml.safe_dump(doc).encode())
    _only_hapmoe(small_catalog.cluster, str(p))


# ------------------------------------------------------------------------------------------ explicit cases
def _write_model(tmp_path, name: str, doc: dict) -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return p


def _err(tmp_path, name: str, doc: dict) -> str:
    p = _write_model(tmp_path, name, doc)
    with pytest.raises(SpecError) as ei:
        CAT.model(str(p))
    return str(ei.value)


MIX = CATALOG_DOCS["mixtral-8x7b"]


def test_missing_file(tmp_path):
    p = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as ei:
        CAT.model(str(p))
    assert "nope.yaml" in str(ei.value) and "not found" in str(ei.value)
    with pytest.raises(SpecError, match=r"nope\.yaml"):
        load_document(p)


def test_directory_instead_of_file(tmp_path):
    d = tmp_path / "dir.yaml"
    d.mkdir()
    with pytest.raises(SpecError, match=r"dir\.yaml"):
        load_document(d)


def test_unknown_catalog_name_suggests_close_match():
    with pytest.raises(SpecError) as ei:
        CAT.model("mixtral-8x7")
    assert "mixtral-8x7b" in str(ei.value)


@pytest.mark.parametrize("text", ["num_layers: [1, 2\n", "a: b: c\n", "- [\n", "key: 'unterminated\n", "\t- x\n"])
def test_bad_yaml(tmp_path, text):
    p = tmp_path / "broken.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as ei:
        CAT.model(str(p))
    assert "broken.yaml" in str(ei.value) and "YAML" in str(ei.value)


def test_bad_json(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text('{"num_layers": 3,,}')
    with pytest.raises(SpecError, match=r"broken\.json.*JSON"):
        CAT.model(str(p))


@pytest.mark.parametrize("text", ["", "- 1\n- 2\n", "42\n", "just text\n"])
def test_top_level_not_a_mapping(tmp_path, text):
    p = tmp_path / "flat.yaml"
    p.write_text(text)
    with pytest.raises(SpecError, match=r"flat\.yaml.*mapping"):
        CAT.model(str(p))


def test_unknown_field_is_named(tmp_path):
    msg = _err(tmp_path, "typo.yaml", {**MIX, "num_layer": 3})
    assert "typo.yaml" in msg and "num_layer" in msg and "unknown field" in msg


def test_unknown_nested_field_is_named(tmp_path):
    msg = _err(tmp_path, "typo2.yaml", {**MIX, "defaults": {**MIX["defaults"], "seq_len": 8}})
    assert "typo2.yaml" in msg and "defaults.seq_len" in msg


def test_topk_above_experts(tmp_path):
    msg = _err(tmp_path, "topk.yaml", {**MIX, "moe_router_topk": 9})
    assert "topk.yaml" in msg and "moe_router_topk" in msg and "9" in msg


def test_layer_freq_list_wrong_length(tmp_path):
    msg = _err(tmp_path, "freq.yaml", {**MIX, "moe_layer_freq": [1] * 31})
    assert "freq.yaml" in msg and "moe_layer_freq" in msg and "31" in msg and "32" in msg


def test_layer_freq_expression_wrong_length(tmp_path):
    msg = _err(tmp_path, "freq2.yaml", {**MIX, "moe_layer_freq": "([0]*3+[1]*58)"})
    assert "freq2.yaml" in msg and "moe_layer_freq" in msg


def test_layer_freq_list_bad_entry(tmp_path):
    msg = _err(tmp_path, "freq3.yaml", {**MIX, "moe_layer_freq": [1, 1, 2] + [1] * 29})
    assert "freq3.yaml" in msg and "moe_layer_freq[2]" in msg


def test_heads_not_divisible_by_groups(tmp_path):
    msg = _err(tmp_path, "gqa.yaml", {**MIX, "num_query_groups": 5})
    assert "gqa.yaml" in msg and "num_query_groups" in msg


def test_groups_above_heads(tmp_path):
    msg = _err(tmp_path, "gqa2.yaml", {**MIX, "num_query_groups": 64})
    assert "gqa2.yaml" in msg and "num_query_groups" in msg


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("num_layers", 0, "positive"),
        ("num_layers", -4, "positive"),
        ("hidden_size", "wide", "integer"),
        ("hidden_size", 4096.5, "integer"),
        ("num_experts", -1, "positive"),
        ("vocab_size", True, "integer"),
        ("mtp_num_layers", -1, "0 or positive"),
        ("swiglu", "yes", "true or false"),
        ("normalization", "BatchNorm", "RMSNorm"),
        ("name", ["a"], "string"),
        ("source", 7, "URL"),
    ],
)
def test_wrong_values_name_file_and_field(tmp_path, field, value, words):
    msg = _err(tmp_path, f"bad_{field}.yaml", {**MIX, field: value})
    assert f"bad_{field}.yaml" in msg and field in msg and words in msg


def test_missing_required_field(tmp_path):
    doc = dict(MIX)
    del doc["hidden_size"]
    msg = _err(tmp_path, "nohidden.yaml", doc)
    assert "nohidden.yaml" in msg and "hidden_size" in msg and "missing" in msg


@pytest.mark.parametrize(
    ("sub", "key", "value", "path"),
    [
        ("official", "total_b", -1, "official.total_b"),
        ("official", "active_convention", "mine", "official.active_convention"),
        ("defaults", "moe_token_dispatcher_type", "ring", "defaults.moe_token_dispatcher_type"),
        ("defaults", "seq_length", 0, "defaults.seq_length"),
    ],
)
def test_nested_fields_are_named_with_their_path(tmp_path, sub, key, value, path):
    msg = _err(tmp_path, "nested.yaml", {**MIX, sub: {**MIX[sub], key: value}})
    assert "nested.yaml" in msg and path in msg


def test_error_carries_source_and_field_attributes(tmp_path):
    p = _write_model(tmp_path, "attrs.yaml", {**MIX, "moe_router_topk": 0})
    with pytest.raises(SpecError) as ei:
        CAT.model(str(p))
    assert ei.value.source == str(p)
    assert ei.value.field == "moe_router_topk"


def test_cluster_with_unknown_device_names_it(small_catalog, tmp_path):
    p = tmp_path / "cl.yaml"
    p.write_text(yaml.safe_dump({**VALID_CLUSTER, "groups": [{"device": "tsx", "nodes": 1}]}))
    with pytest.raises(SpecError) as ei:
        small_catalog.cluster(str(p))
    msg = str(ei.value)
    assert "cl.yaml" in msg and "groups[0].device" in msg and "tst" in msg  # suggests the close match


# ------------------------------------------------------------------------------------------ regressions
@pytest.mark.parametrize("count", ["1" + "0" * 20, "9" * 5000], ids=["1e20", "5000-digits"])
def test_huge_repeat_count_in_layer_freq(count):
    with pytest.raises(SpecError, match="moe_layer_freq"):
        model_from_dict({**MIX, "moe_layer_freq": f"([1]*{count})"}, "big.yaml")


def test_nul_byte_in_path():
    with pytest.raises(SpecError):
        CAT.model("models/a\x00b.yaml")


@pytest.mark.parametrize("which", ["cluster", "model"])
def test_overlong_reference(which):
    with pytest.raises(SpecError):
        getattr(CAT, which)("a" * 300)


@pytest.mark.parametrize(("ref", "world"), [("8\txtst", 8), ("8x\ttst", 8), ("8xtst\t+\t8xtst", 16), ("0\x85x0", 0)])
def test_inline_cluster_with_other_whitespace(small_catalog, ref, world):
    if world == 0:
        with pytest.raises(SpecError):
            small_catalog.cluster(ref)
    else:
        assert small_catalog.cluster(ref).world_size == world


def test_cluster_scalar_sources(small_catalog, tmp_path):
    p = tmp_path / "src.yaml"
    p.write_text(yaml.safe_dump({**VALID_CLUSTER, "sources": 5}))
    with pytest.raises(SpecError, match="sources"):
        small_catalog.cluster(str(p))


# ---------------------------------------------------------------------- second pass (issue 20)
HF_MIXTRAL = {
    "model_type": "mixtral",
    "num_hidden_layers": 4,
    "hidden_size": 1024,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
    "intermediate_size": 2048,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}


@pytest.mark.parametrize(
    "key", ["num_local_experts", "num_experts_per_tok", "intermediate_size", "hidden_size", "num_hidden_layers"]
)
def test_hf_fields_of_2_to_the_70_name_the_hf_field(key):
    """The caps apply where the value is read, under the config's own name (not the Megatron field it maps to)."""
    with pytest.raises(SpecError) as ei:
        model_from_hf_config({**HF_MIXTRAL, key: 2**70}, "x/config.json")
    assert ei.value.field == key and "2^70" in str(ei.value)


@pytest.mark.parametrize("depth", [33, 400, 5000])
def test_deeply_nested_layer_freq_is_refused_before_parsing(depth):
    expr = "(" * depth + "[1]*24" + ")" * depth
    with pytest.raises(SpecError, match="nest deeper"):
        model_from_dict({**MIX, "moe_layer_freq": expr}, "deep.yaml")


def test_layer_freq_sum_of_many_terms_is_linear():
    """100,000 one-entry terms: the parser extends in place (it used to copy the list per term: minutes)."""
    expr = "+".join(["[1]"] * (MIX["num_layers"]))
    assert model_from_dict({**MIX, "moe_layer_freq": expr}, "m.yaml").moe_pattern == (1,) * MIX["num_layers"]
    with pytest.raises(SpecError, match="entries"):
        model_from_dict({**MIX, "moe_layer_freq": "+".join(["[1]"] * 99_999)}, "m.yaml")


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("peak_tflops", "bf16"), 5e-324),
        (("memory_bandwidth_GBps",), 5e-324),
        (("memory_bandwidth_GBps",), 1e300),
        (("nic_Gbps",), 1e-300),
        (("memory_gib",), 1e9),
    ],
    ids=str,
)
def test_device_numbers_outside_their_physical_range(path, value, tmp_path):
    doc = yaml.safe_load((CAT.root / "clusters" / "devices" / "h800.yaml").read_text())
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    from hapmoe_milp.specs.device import device_from_dict

    with pytest.raises(SpecError) as ei:
        device_from_dict(doc, "h800.yaml")
    assert ei.value.field == ".".join(path) and ("range" in str(ei.value) or "denormal" in str(ei.value))


def test_yaml_exponent_numbers_are_numbers(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("a: 1e-4\nb: 3E9\nc: .5e1\nd: '1e3'\n")
    assert load_document(p) == {"a": 1e-4, "b": 3e9, "c": 5.0, "d": "1e3"}
