"""CUDA graphs, BF16 gradient reduction and FP8 parameter gathering: settings a measured run carries
(``bench/calibration/runs.yaml`` reads them from the NeMo / Megatron-Bridge performance recipes), that
``estimate``/``solve`` take as flags and the Megatron export emits, each priced where its physics says.

- captured kernels are replayed by the device, so they add no host launch idle; the dropless router's
  host sync is not captured. Expected kernel counts are restated by hand from the counts documented in
  ``cost/kernels.py`` (attention 7 kernels, +2 with QK-norm; dense MLP 5; MoE 20 + 2 per local expert, of
  which the router part is 8 and the preprocess part 2).
- the data-parallel gradient reduce-scatter moves 2 bytes per parameter instead of 4 in BF16, the
  parameter all-gather 1 byte instead of 2 with FP8 parameters: bandwidth-bound collectives take about
  half as long.
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from hapmoe_milp import cli
from hapmoe_milp.calibration.fidelity import with_devices
from hapmoe_milp.calibration.runs import load_runs
from hapmoe_milp.config import ParallelConfig, Settings, check_graph_scope
from hapmoe_milp.cost.kernels import layer_kernels
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.errors import SettingsError, SpecError
from hapmoe_milp.export import megatron_args
from hapmoe_milp.knobs import plan_from_knobs
from hapmoe_milp.specs import Catalog

CAT = Catalog(use_calibrated=False)
QWEN = CAT.model("qwen3-30b-a3b")  # GQA with QK-norm, 128 experts, no shared expert
LLAMA = CAT.model("llama-2-7b")


def _fwd(m, cfg, kind, scope, dispatcher="alltoall"):
    return layer_kernels(m, cfg, kind, dispatcher, "bf16", "none", "tensorwise", scope)


@pytest.mark.parametrize(
    ("scope", "eager"),
    [("none", 12), ("attn", 5), ("mlp", 7), ("attn,mlp", 0), ("layer", 0), ("moe_router", 12)],
)
def test_captured_parts_of_a_dense_layer_launch_nothing_from_the_host(scope, eager):
    k = _fwd(LLAMA, ParallelConfig(dp=8), "dense", scope)
    assert k.fwd == pytest.approx(eager)
    # the backward of a captured part is captured too (Transformer Engine graphs both passes)
    base = _fwd(LLAMA, ParallelConfig(dp=8), "dense", "none")
    assert k.bwd == pytest.approx(base.bwd * eager / 12)


@pytest.mark.parametrize(
    ("scope", "captured"),
    [
        ("moe_router,moe_preprocess", 10),
        ("attn,moe_router,moe_preprocess", 19),
        ("moe", 20 + 2 * 16),
        ("mamba", 0),  # no Mamba mixer in this layer
    ],
)
def test_captured_parts_of_an_moe_layer(scope, captured):
    cfg = ParallelConfig(dp=8, ep=8)  # 16 local experts
    total = 9 + 20 + 2 * 16
    k = _fwd(QWEN, cfg, "moe", scope)
    assert _fwd(QWEN, cfg, "moe", "none").fwd == total
    assert k.fwd == pytest.approx(total - captured)
    assert k.syncs_fwd == 1  # the token-count sync stays under any graph scope


def test_whole_layer_graphs_remove_exactly_the_launch_idle_and_keep_the_sync():
    c = CAT.cluster("8xh100")
    cfg = ParallelConfig(dp=8, ep=8)

    def layer(scope: str, launch: float, sync: float):
        cc = with_devices(
            c,
            {
                "h100": replace(
                    c.device("h100"), runtime=replace(c.device("h100").runtime, launch_us=launch, sync_us=sync)
                )
            },
        )
        return CostModel(QWEN, cc, Settings(cuda_graph_scope=scope)).layer("h100", cfg, 1, "moe", "none")

    eager, graphed, bare = layer("none", 10.0, 40.0), layer("layer", 10.0, 40.0), layer("none", 0.0, 0.0)
    k = _fwd(QWEN, cfg, "moe", "none")
    assert eager.fwd - graphed.fwd == pytest.approx(10 * k.fwd * 1e-6, rel=1e-9)
    assert graphed.fwd - bare.fwd == pytest.approx(40e-6, rel=1e-9)  # one sync, not captured


def _sync(settings: Settings) -> tuple[float, float]:
    m, c = CAT.model("llama-3-70b"), CAT.cluster("64xh100")
    lc = CostModel(m, c, settings).layer("h100", ParallelConfig(tp=1, dp=64), 1, "dense", "none")
    return lc.rs, lc.ag


def test_bf16_gradient_reduction_about_halves_the_reduce_scatter():
    fp32, _ = _sync(Settings())
    bf16, _ = _sync(Settings(grad_reduce_in_bf16=True))
    assert 0.5 <= bf16 / fp32 < 0.6  # half the bytes; latency terms do not halve


def test_fp8_parameter_gather_about_halves_the_all_gather_and_needs_fp8():
    _, bf16 = _sync(Settings(precision="fp8"))
    _, fp8 = _sync(Settings(precision="fp8", fp8_param_gather=True))
    assert 0.5 <= fp8 / bf16 < 0.6
    with pytest.raises(SettingsError) as e:
        Settings(fp8_param_gather=True)
    assert e.value.field == "fp8_param_gather"


@pytest.mark.parametrize(
    ("given", "canonical"),
    [("none", "none"), ("layer", "layer"), ("moe_router, attn", "attn,moe_router"), ("mamba,attn", "attn,mamba")],
)
def test_graph_scope_is_checked_and_written_in_one_order(given, canonical):
    assert check_graph_scope(given) == canonical
    assert Settings(cuda_graph_scope=given).cuda_graph_scope == canonical


@pytest.mark.parametrize("bad", ["", "full_iteration", "layer,attn", "attn,bogus", 3])
def test_bad_graph_scopes_name_the_field(bad):
    with pytest.raises(SettingsError) as e:
        Settings(cuda_graph_scope=bad)
    assert e.value.field == "cuda_graph_scope"


def _runs_file(tmp_path: Path, **extra) -> Path:
    row = {
        "id": "r1",
        "source": "local:test",
        "model": "qwen3-30b-a3b",
        "cluster": "16xh100",
        "ep": 16,
        "etp": 1,
        "seq_length": 4096,
        "global_batch_size": 1024,
        "step_time_s": 20.0,
        **extra,
    }
    p = tmp_path / "runs.yaml"
    p.write_text(yaml.safe_dump({"runs": [row]}))
    return p


def test_runs_file_carries_graph_and_sync_settings(tmp_path):
    (r,) = load_runs(_runs_file(tmp_path, cuda_graph_scope="moe_preprocess,moe_router", grad_reduce_in_bf16=True))
    kw = r.settings_kw()
    assert kw["cuda_graph_scope"] == "moe_router,moe_preprocess"
    assert kw["grad_reduce_in_bf16"] is True


def test_runs_file_refuses_an_unknown_graph_scope_by_field(tmp_path):
    with pytest.raises(SpecError) as e:
        load_runs(_runs_file(tmp_path, cuda_graph_scope="everything"))
    assert "cuda_graph_scope" in str(e.value) and "runs[0]" in str(e.value)


def test_megatron_export_emits_the_graph_and_reduction_flags():
    m, c = CAT.model("mixtral-8x7b"), CAT.cluster("16xh100")
    st = Settings(
        seq_length=4096,
        global_batch_size=256,
        precision="fp8",
        fp8_param_gather=True,
        grad_reduce_in_bf16=True,
        cuda_graph_scope="attn,moe_router",
    )
    plan = plan_from_knobs(m, c, st, tp=2, ep=8, etp=1)
    text = " ".join(megatron_args(plan, m, c))
    assert "--cuda-graph-impl transformer_engine --cuda-graph-scope attn moe_router" in text
    assert "--grad-reduce-in-bf16" in text and "--fp8-param-gather" in text
    plain = " ".join(megatron_args(plan_from_knobs(m, c, Settings(), tp=2, ep=8, etp=1), m, c))
    assert "--cuda-graph" not in plain and "--grad-reduce-in-bf16" not in plain
    whole = plan_from_knobs(m, c, replace(Settings(), cuda_graph_scope="layer"), tp=2, ep=8, etp=1)
    assert "--cuda-graph-impl local" in " ".join(megatron_args(whole, m, c))


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.run(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_estimate_flags_reach_the_cost_model():
    import json

    base = ["estimate", "-m", "qwen3-30b-a3b", "-c", "16xh100", "--ep", "16", "--etp", "1", "--json"]
    t = {}
    for name, extra in {
        "eager": [],
        "graphs": ["--cuda-graph-scope", "layer"],
        "bf16": ["--grad-reduce-in-bf16"],
    }.items():
        code, out, err = _cli(*base, *extra)
        assert code == 0, err
        t[name] = json.loads(out)["iteration_time_s"]
    assert t["graphs"] < t["eager"]
    assert t["bf16"] <= t["eager"]
    code, out, err = _cli(*base, "--cuda-graph-scope", "bogus")
    assert code == 2 and out == ""
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert "--cuda-graph-scope" in line


@pytest.mark.parametrize("share", [0.0, 0.5, 0.9])
def test_tp_overlap_hides_a_share_of_the_tp_collectives_behind_each_pass(share):
    """With --tp-comm-overlap (MindSpeed --use-mc2) a share ``tp_overlap`` of min(TP comm, that pass's
    compute) is hidden, forward and backward; without it the collectives stay exposed."""
    m, c = CAT.model("llama-3-70b"), CAT.cluster("8xh100")
    cfg = ParallelConfig(tp=8)
    dev = c.device("h100")
    cc = with_devices(c, {"h100": replace(dev, runtime=replace(dev.runtime, tp_overlap=share))})
    off = CostModel(m, cc, Settings()).layer("h100", cfg, 1, "dense", "none")
    on = CostModel(m, cc, Settings(tp_comm_overlap=True)).layer("h100", cfg, 1, "dense", "none")
    tp_pass = off.tp / 2  # the same TP traffic forward and backward
    assert tp_pass > 0
    hidden_f = share * min(tp_pass, off.fwd - off.host - tp_pass)
    assert off.fwd - on.fwd == pytest.approx(hidden_f, rel=1e-9)
    assert on.tp < off.tp or share == 0.0
    assert on.compute == pytest.approx(off.compute, rel=1e-12)


def test_tp_overlap_is_exported_only_with_tensor_parallelism():
    m, c = CAT.model("llama-3-70b"), CAT.cluster("16xh100")
    st = Settings(seq_length=4096, global_batch_size=64, tp_comm_overlap=True)
    assert "--tp-comm-overlap" in megatron_args(plan_from_knobs(m, c, st, tp=8, pp=2), m, c)
    assert "--tp-comm-overlap" not in megatron_args(plan_from_knobs(m, c, st, tp=1, pp=8), m, c)
