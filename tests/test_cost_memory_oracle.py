"""Megatron-LM's own accounting as the oracle of the memory model, and its validate_args for our exports.

``tests/data/megatron_memory_oracle.json`` holds what Megatron-LM's code said about our exported arguments
(``tools/megatron_memory_oracle.py``: ``parse_args`` + ``validate_args`` at core_v0.16.1,
``compute_weight_and_optimizer_memory`` / ``compute_activation_memory`` of
``theoretical_memory_usage.py`` at d98e8a64dd; the file records commits and command). Here we check:

- the arguments we export today are the ones Megatron validated (else: re-run the tool);
- weights + optimizer state agree within 2% on every catalog model exported in the megatron family;
- on the textbook layer (dense, MHA, non-gated, dropout on, sequence parallel, selective recompute) the
  activations equal Megatron's formula, term by term.

Where we deliberately differ (documented in cost/memory.py): Megatron prices an *average* shard --
``num_layers / PP`` of the decoder layers, the whole MTP block and the input embedding -- while we price each
stage's real layers (MTP on the last stage, a stage's own mix of dense and MoE layers); the comparison below
assembles our per-layer numbers into Megatron's shard. Megatron's optimizer divisor is DP without CP (ours
DP x CP: the distributed optimizer shards over both; the plans here have CP = 1). Megatron does not count
MTP's projection and norms, QK-norm weights or router biases -- all well under 2%.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hapmoe_milp.config import Settings
from hapmoe_milp.cost.estimate import estimate
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.errors import ExportError
from hapmoe_milp.export.megatron import megatron_args
from hapmoe_milp.knobs import plan_from_knobs
from hapmoe_milp.specs import Catalog
from tests.data.oracle_cases import DENSE_CASE, LEVER_CASES, catalog_cases, dense_mha_model, is_hybrid

ORACLE = json.loads((Path(__file__).parent / "data" / "megatron_memory_oracle.json").read_text())
RECORDS = {r["name"]: r for r in ORACLE["cases"]}
CAT = Catalog()
CATALOG_CASES = catalog_cases(CAT)
ALL_CASES = [*CATALOG_CASES, *LEVER_CASES, DENSE_CASE]


def _built(case):
    m = dense_mha_model() if case["model"] == "dense-mha" else CAT.model(case["model"])
    c = CAT.cluster(case["cluster"])
    st = Settings(**case["settings"])
    return m, c, st, plan_from_knobs(m, c, st, **case["knobs"])


def test_oracle_file_names_its_commits_and_command():
    prov = ORACLE["provenance"]
    assert "55ac7082517c3878ae653c07c09c534b8aed49f6" in prov["validate_args"]
    assert "d98e8a64ddf34856e74b24714e3bedb2f5a39553" in prov["theoretical_memory"]
    assert prov["command"].startswith("python tools/megatron_memory_oracle.py")
    assert {c["name"] for c in ALL_CASES} == set(RECORDS), "the catalog changed: re-run the tool"


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c["name"])
def test_export_is_what_megatron_validated(case):
    """Every memory lever's flags (recompute modules, block/uniform, FSDP, offload, state precision) passed
    Megatron's validate_args; an export that changed since must be re-validated with the tool."""
    m, c, st, plan = _built(case)
    rec = RECORDS[case["name"]]
    if "export" in rec:  # a model Megatron-LM cannot build: our exporter refuses it, as recorded
        with pytest.raises(ExportError):
            megatron_args(plan, m, c, st)
        return
    assert rec["validate_args"] == "ok"
    assert megatron_args(plan, m, c, st) == rec["argv"], "exports changed: re-run tools/megatron_memory_oracle.py"
    assert rec["data_parallel_size"] == plan.stages[0].cfg.dp


def megatron_shard_weights(m, c, st, plan) -> float:
    """Our per-layer model state assembled into the shard Megatron prices: the decoder layers' state over
    PP, the MTP block, the input embedding, and the output layer when PP = 1."""
    cm = CostModel(m, c, st)
    s0 = plan.stages[0]
    b = plan.stage_micro_batch(0)
    dec = [k for k in m.layer_kinds if k != "mtp"]
    w = sum(cm.layer(s0.device, s0.cfg, b, k, "none").weights for k in dec) / plan.pp
    w += m.mtp_num_layers * cm.layer(s0.device, s0.cfg, b, "mtp", "none").weights if m.mtp_num_layers else 0.0
    if plan.pp == 1:  # the one stage's edges: embedding, head (untied: its own matrix) and final norm
        return w + cm.single_edge(s0.device, s0.cfg, b).weights
    w += cm.first_edge(s0.device, s0.cfg, b).weights
    last = cm.last_edge(s0.device, s0.cfg, b)
    # Megatron charges final_layernorm / PP to the shard
    return w + last.weights * (m.hidden_size * m.norm_params) / (last.params_dense or 1) / plan.pp


@pytest.mark.parametrize("case", CATALOG_CASES, ids=lambda c: c["name"])
def test_weights_and_optimizer_agree_with_megatron_within_2_percent(case):
    name = case["name"]
    m, c, st, plan = _built(case)
    if "export" in RECORDS[name]:
        pytest.skip("not exportable to Megatron-LM (see test_export_is_what_megatron_validated)")
    if is_hybrid(m):
        assert "not supported" in RECORDS[name]["theoretical_memory"]
        pytest.skip("Megatron's theoretical memory does not cover hybrid (Mamba / gated-DeltaNet) models")
    ours = megatron_shard_weights(m, c, st, plan)
    theirs = RECORDS[name]["weight_and_optimizer_bytes"]
    assert ours == pytest.approx(theirs, rel=0.02), (
        f"{name}: ours {ours / 2**30:.2f} GiB, Megatron {theirs / 2**30:.2f}"
    )


TIED_PP1 = [c for c in LEVER_CASES if c["name"].endswith("-tied-pp1")]


@pytest.mark.parametrize("case", TIED_PP1, ids=lambda c: c["name"])
def test_tied_embeddings_at_pp1_agree_with_megatron(case):
    """Tied embeddings on a one-stage pipeline: Megatron adds the output matrix at PP = 1 only when untied.
    The vocabulary matrix is 21-34% of these models, so a second copy (the head's) would miss by far more
    than the 2% the comparison allows; the estimate's stage weights are the same number."""
    m, c, st, plan = _built(case)
    assert plan.pp == 1 and not m.untie_embeddings_and_output_weights
    theirs = RECORDS[case["name"]]["weight_and_optimizer_bytes"]
    ours = megatron_shard_weights(m, c, st, plan)
    assert ours == pytest.approx(theirs, rel=0.02)
    s0 = plan.stages[0]
    matrix = CostModel(m, c, st).first_edge(s0.device, s0.cfg, plan.stage_micro_batch(0)).weights
    assert abs(ours + matrix - theirs) > 0.1 * theirs  # a double count could not pass
    assert estimate(m, c, plan).totals[0].weights == pytest.approx(ours, rel=1e-12)


def test_first_stage_activations_equal_megatrons_formula_on_the_textbook_layer():
    """Megatron: (layers + its embedding terms) x schedule factor, over TP. Ours: the same layers and our
    embedding terms (token ids are not split by TP; the dropout mask is)."""
    m, c, st, plan = _built(DENSE_CASE)
    rec = RECORDS[DENSE_CASE["name"]]
    est = estimate(m, c, plan)
    s, b, h, pp, tp = st.seq_length, st.micro_batch_size, m.hidden_size, plan.pp, plan.stages[0].cfg.tp
    factor = min(1, plan.num_microbatches / pp)
    theirs_embedding = (8 * s * b * pp + s * b * h * pp) * factor / tp
    ours_embedding = min(plan.num_microbatches, pp) * (8 * s * b + s * b * h / tp)
    ours = est.totals[0].activations
    assert ours - ours_embedding == pytest.approx(rec["activation_bytes"] - theirs_embedding, rel=1e-9)
