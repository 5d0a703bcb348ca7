"""Map a Hugging Face ``config.json`` onto the same :class:`ModelSpec` the YAML catalog uses.

Each family names the same quantity differently (``num_local_experts`` vs ``n_routed_experts`` vs
``num_experts``; ``intermediate_size`` is the expert width in Mixtral but the dense width in Qwen). One
function per family (modules of this package) turns its config into Megatron's names, so everything
downstream sees one vocabulary. This package depends on the spec types, never the other way round.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hapmoe_milp.errors import SpecError
from hapmoe_milp.specs._fields import Fields, is_hf_config, load_document
from hapmoe_milp.specs.hf import deepseek, gpt, hybrid, llama4, qwen
from hapmoe_milp.specs.hf.common import Hf, Kw
from hapmoe_milp.specs.model import ModelSpec, TrainingDefaults
from hapmoe_milp.specs.model_doc import validate_model

__all__ = ["SUPPORTED", "load_hf_config", "looks_like_hf_config", "model_from_hf_config"]

FAMILIES: dict[str, Callable[[Hf], Kw]] = {
    "llama": gpt.dense,
    "qwen2": gpt.dense,
    "qwen3": gpt.dense,
    "mixtral": gpt.mixtral,
    "olmoe": gpt.olmoe,
    "gpt_oss": gpt.gpt_oss,
    "granitemoe": gpt.granitemoe,
    "granitemoeshared": gpt.granitemoe,
    "dbrx": gpt.dbrx,
    "minimax_m2": gpt.minimax_m2,
    "hunyuan": gpt.hunyuan,
    "hunyuan_v1_moe": gpt.hunyuan,
    "bailing_moe": gpt.bailing_moe,
    "qwen2_moe": qwen.qwen_moe,
    "qwen3_moe": qwen.qwen_moe,
    "qwen3_next": qwen.qwen3_next,
    "deepseek_v2": deepseek.deepseek,
    "deepseek_v3": deepseek.deepseek,
    "kimi_k2": deepseek.deepseek,
    "glm4_moe": deepseek.glm4_moe,
    "dots1": deepseek.dots1,
    "llama4": llama4.llama4,
    "llama4_text": llama4.llama4,
    "nemotron_h": hybrid.nemotron_h,
    "jamba": hybrid.jamba,
}
SUPPORTED = tuple(FAMILIES)

# Model types people bring that we recognise but cannot price yet: the feature that stops us.
KNOWN_UNSUPPORTED = {
    "minimax": "lightning (linear) attention of MiniMax-Text-01",
    "deepseek_v32": "DeepSeek sparse attention (DSA indexer)",
    "mamba": "a pure Mamba-1 model without attention or MLP layers",
    "mamba2": "a pure Mamba-2 model without attention or MLP layers",
}
# Multimodal wrappers whose language model sits under text_config
TEXT_CONFIG_WRAPPERS = ("llama4",)


def _safe_name(text: str) -> str:
    """A catalog-safe name from a folder name (spaces and other characters become '-')."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-._+")[:128]


def looks_like_hf_config(doc: Any) -> bool:
    return is_hf_config(doc)


def model_from_hf_config(doc: dict[str, Any], source: str, name: str | None = None) -> ModelSpec:
    f = Fields(doc, source)
    mt = f.str_("model_type", "")
    if mt in KNOWN_UNSUPPORTED:
        raise f.err("model_type", f"model_type {mt!r}: {KNOWN_UNSUPPORTED[mt]} is not supported")
    if mt not in FAMILIES:
        raise f.err("model_type", f"unsupported model_type {mt!r}; supported: {', '.join(SUPPORTED)}")
    text = f.sub("text_config") if mt in TEXT_CONFIG_WRAPPERS and f.has("text_config") else f
    assert text is not None
    kw = FAMILIES[mt](Hf(text, mt))
    kw.setdefault("name", name or _safe_name(Path(source).parent.name) or mt)
    kw["origin"] = source
    kw["description"] = f"imported from Hugging Face config ({mt})"
    seq_key = "max_seq_len" if mt == "dbrx" else "max_position_embeddings"
    seq = text.int_(seq_key, 4096)
    kw["defaults"] = TrainingDefaults(seq_length=min(seq, 4096))
    m = ModelSpec(**kw)
    validate_model(m, source)
    return m


def load_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    doc = load_document(path)
    if not isinstance(doc, dict) or "model_type" not in doc:
        raise SpecError("not a Hugging Face config.json (no model_type)", source=str(path))
    return model_from_hf_config(doc, str(path), name)
