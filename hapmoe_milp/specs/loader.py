"""Read a model file of either form: a catalog/plan document or a Hugging Face ``config.json``.

This module sits above both readers (:mod:`hapmoe_milp.specs.model_doc` and :mod:`hapmoe_milp.specs.hf`),
so neither imports the other and the spec types import neither.
"""

from __future__ import annotations

from pathlib import Path

from hapmoe_milp.specs._fields import load_document
from hapmoe_milp.specs.hf import looks_like_hf_config, model_from_hf_config
from hapmoe_milp.specs.model import ModelSpec
from hapmoe_milp.specs.model_doc import model_from_dict


def load_model_file(path: str | Path) -> ModelSpec:
    doc = load_document(path)
    if looks_like_hf_config(doc):
        return model_from_hf_config(doc, str(path))
    return model_from_dict(doc, str(path))
