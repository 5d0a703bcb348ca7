"""CUDA graphs, BF16 gradient reduction and FP8 parameter gathering: settings a measured run carries
(``bench/calibration/runs.yaml`` reads them from the NeMo / Megatron-Bridge performance recipes), that
``estimate``/``solve`` take as flags and the Megatron export emits, each priced where its physics says.

- captured kernels are replayed by the device, so they add no host launch idle; the dropless router's
  host sync is not captured. Expected kernel counts are restated by hand from the counts documented in
  ``cost/kernels.py`` (attention 7 kernels, +2 with QK-norm; dense MLP 5; MoE 20 + 2 per local expert, of
  which the router part is 7 and the all-to-all dispatcher's preprocess part 5; shared expert 4), counted per
  captured part (a table pins that no graphs and whole-layer graphs count exactly as the single-share formula did).
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
from hapmoe_milp.cost.kernels import _mixer_kernels, layer_kernels
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
    ("scope", "fwd", "bwd"),
    [
        ("none", 12, 20),
        ("attn", 5, 8.5),  # the MLP stays: 5 kernels, backward 2 x 2 GEMMs + 1.5 x 3 others
        ("mlp", 7, 11.5),  # attention stays: 7 kernels, backward 2 x 2 + 1.5 x 5
        ("attn,mlp", 0, 0),
        ("layer", 0, 0),
        ("moe_router", 12, 20),  # no MoE block in a dense layer
    ],
)
def test_captured_parts_of_a_dense_layer_launch_nothing_from_the_host(scope, fwd, bwd):
    k = _fwd(LLAMA, ParallelConfig(dp=8), "dense", scope)
    assert k.fwd == pytest.approx(fwd)
    # the backward of a captured part is captured too (Transformer Engine graphs both passes), counted per part
    assert k.bwd == pytest.approx(bwd)


# Qwen3-30B-A3B on EP8 (16 local experts), all-to-all, BF16: attention 9 (2 GEMMs), router 7 (1 GEMM),
# preprocess 5 (token counts 2, count exchange 1, permute 2), the rest 8 + 2 x 16 (32 GEMMs).
QWEN_GROUPS = {"attn": (9, 14.5), "router": (7, 11.0), "pre": (5, 7.5), "rest": (40, 76.0)}


@pytest.mark.parametrize(
    ("scope", "captured"),
    [
        ("moe_router", ("router",)),
        ("moe_router,moe_preprocess", ("router", "pre")),
        ("attn,moe_router,moe_preprocess", ("attn", "router", "pre")),
        ("moe", ("router", "pre", "rest")),
        ("moe_preprocess", ()),  # Megatron captures the preprocess only with the router (TransformerConfig)
        ("mamba", ()),  # no Mamba mixer in this layer
    ],
)
def test_captured_parts_of_an_moe_layer(scope, captured):
    cfg = ParallelConfig(dp=8, ep=8)
    eager = [v for name, v in QWEN_GROUPS.items() if name not in captured]
    base = _fwd(QWEN, cfg, "moe", "none")
    assert (base.fwd, base.bwd) == (61, 109)  # 9 + 20 + 2 x 16; 2 x 35 GEMMs + 1.5 x 26
    k = _fwd(QWEN, cfg, "moe", scope)
    assert k.fwd == pytest.approx(sum(f for f, _ in eager))
    assert k.bwd == pytest.approx(sum(b for _, b in eager))
    assert k.syncs_fwd == 1  # the token-count sync stays under any graph scope


@pytest.mark.parametrize(
    ("dispatcher", "total", "preprocess"),
    # alltoall: dispatch_preprocess counts, exchanges the counts and permutes (5); allgather: only reshapes (0);
    # flex (DeepEP): the routing map's conversion to top-k indices (1), its total 5 kernels fewer (fused)
    [("alltoall", 61, 5), ("allgather", 61, 0), ("flex", 56, 1)],
)
def test_moe_preprocess_graph_captures_the_dispatchers_own_preprocess(dispatcher, total, preprocess):
    cfg = ParallelConfig(dp=8, ep=8)
    assert _fwd(QWEN, cfg, "moe", "none", dispatcher).fwd == total
    assert _fwd(QWEN, cfg, "moe", "moe_router", dispatcher).fwd == total - 7
    assert _fwd(QWEN, cfg, "moe", "moe_router,moe_preprocess", dispatcher).fwd == total - 7 - preprocess


def test_router_graph_takes_the_shared_expert_with_its_collectives_and_fp8_casts():
    # Qwen2-57B-A14B (GQA, shared expert) at TP2 (sequence parallel), EP8 (8 local experts), FP8 tensorwise:
    # attention 7 + SP 2 + 2 casts = 11 (bwd 2 x 2 + 1.5 x 7 + 1.5 x 2 = 17.5); router 7 (BF16, bwd 11);
    # preprocess 5 (bwd 7.5); routed experts 8 + 16 with 16 GEMMs and 4 quantisation launches per expert GEMM
    # = 88 (bwd 2 x 16 + 1.5 x 8 + 4 x 16 = 108); shared expert 4 + SP 2 + 2 casts = 8 (bwd 4 + 1.5 x 4 + 1.5 x 2 = 13)
    m, cfg = CAT.model("qwen2-57b-a14b"), ParallelConfig(tp=2, dp=4, ep=8)

    def k(scope: str):
        return layer_kernels(m, cfg, "moe", "alltoall", "fp8", "none", "tensorwise", scope)

    assert (k("none").fwd, k("none").bwd) == (119, 157)
    assert (k("attn,moe_router").fwd, k("attn,moe_router").bwd) == (5 + 88, 7.5 + 108)
    assert (k("moe_router,moe_preprocess").fwd, k("moe_router,moe_preprocess").bwd) == (11 + 88, 17.5 + 108)
    assert (k("moe").fwd, k("moe").bwd) == (11, 17.5)


def test_full_recompute_reruns_only_the_eager_groups_forward():
    cfg = ParallelConfig(dp=8, ep=8)
    k = layer_kernels(QWEN, cfg, "moe", "alltoall", "bf16", "full", "tensorwise", "moe_router,moe_preprocess")
    assert k.fwd == 9 + 40
    assert k.bwd == (14.5 + 9) + (76 + 40)
    assert (k.syncs_fwd, k.syncs_bwd) == (1, 1)


def test_context_parallel_ring_steps_belong_to_the_attention_graph():
    cfg = ParallelConfig(cp=2, dp=4)  # one ring step: 3 kernels inside attention
    assert _fwd(LLAMA, cfg, "dense", "none").fwd == 15
    assert _fwd(LLAMA, cfg, "dense", "attn").fwd == 5
    assert _fwd(LLAMA, cfg, "dense", "mlp").fwd == 10


def test_hybrid_sub_layers_are_captured_by_their_own_part():
    m, cfg = CAT.model("nemotron-3-nano-30b-a3b"), ParallelConfig(dp=8, ep=8)  # 16 local experts, shared expert
    assert _fwd(m, cfg, "mamba", "mamba").fwd == 0
    assert _fwd(m, cfg, "mamba", "attn").fwd == _fwd(m, cfg, "mamba", "none").fwd
    # an MoE-only sub-layer: 20 + 2 x 16 + shared 4; the router graph takes the router (7) and the shared expert (4)
    assert _fwd(m, cfg, "moe_mlp", "none").fwd == 56
    assert _fwd(m, cfg, "moe_mlp", "moe_router").fwd == 56 - 7 - 4
    assert _fwd(m, cfg, "moe_mlp", "moe_router,moe_preprocess").fwd == 56 - 7 - 4 - 5


def _single_share_reference(m, cfg, kind, dispatcher, precision, recompute, fp8_recipe, scope, gshard):
    """The kernel count as it was before per-part graphs (one captured share for all of a layer's kernels),
    copied with its constants as literals; only its ``none`` and ``layer`` answers are compared."""
    mixer, mlp = m.kind_parts(kind)
    is_moe = mlp == "moe"
    k, g = _mixer_kernels(m, mixer)
    syncs = 0.0
    local = max(1, (m.num_experts or 1) // cfg.ep) if is_moe else 0
    if is_moe and gshard:
        per = 6 + (3 if cfg.etp > 1 else 0)
        k += 57 + local * per
        g += 5 + local * 3
        syncs = 1.0
    elif is_moe:
        k += 20 + 2 * local - (5 if dispatcher == "flex" else 0)
        g += 1 + 2 * local
        if m.moe_shared_expert_intermediate_size:
            k += 4
            g += 2
        if cfg.etp > 1:
            k += 2
        syncs = 1.0
    elif mlp == "dense":
        k += 5
        g += 2
    if kind == "mtp":
        k += 6
        g += 2
    eager = {"none": 1.0, "layer": 0.0}[scope]
    if cfg.tp > 1:
        k += 4 * ((mixer is not None) + (mlp is not None)) // 2
    if cfg.cp > 1:
        k += 3 * (cfg.cp - 1)
    bwd = 2.0 * g + 1.5 * (k - g)
    if precision == "fp8":
        expert = 2 * local
        dense = g - expert - (1 if is_moe else 0)
        quant = {"tensorwise": 4, "blockwise": 1, "mxfp8": 1}[fp8_recipe] * expert
        k += dense + quant
        bwd += 1.5 * dense + quant
    syncs_b = 0.0
    if recompute == "full":
        bwd += k
        syncs_b = syncs
    return (float(k) * eager, float(bwd) * eager, syncs, syncs_b)


@pytest.mark.parametrize(
    "name",
    [
        "qwen3-30b-a3b",  # GQA + QK-norm, no shared expert
        "llama-2-7b",  # dense
        "deepseek-v3",  # MLA, shared expert, dense and MoE layers, MTP
        "mixtral-8x7b",
        "qwen2-57b-a14b",  # shared expert
        "nemotron-3-nano-30b-a3b",  # Mamba2 hybrid: attention, mamba and MoE-only sub-layers
        "jamba-v0.1",  # Mamba1 hybrid with dense- and MoE-only sub-layers
        "qwen3-next-80b-a3b",  # gated DeltaNet
    ],
)
def test_no_graphs_and_whole_layer_graphs_count_as_the_single_share_formula(name):
    m = CAT.model(name)
    cfgs = [
        ParallelConfig(dp=8),
        ParallelConfig(dp=8, ep=8),
        ParallelConfig(tp=2, dp=4, ep=4),
        ParallelConfig(tp=2, dp=4, ep=2, etp=2),
        ParallelConfig(tp=4, cp=2, dp=2, ep=16),
        ParallelConfig(cp=4, dp=2, ep=1, etp=1),
    ]
    precisions = [("bf16", "tensorwise"), ("fp8", "tensorwise"), ("fp8", "blockwise"), ("fp8", "mxfp8")]
    n = 0
    for kind in sorted(set(m.layer_kinds)):
        for cfg in cfgs:
            for dispatcher in ("alltoall", "allgather", "flex"):
                for precision, recipe in precisions:
                    for recompute in ("none", "full"):
                        for gshard in (False, True):
                            for scope in ("none", "layer"):
                                args = (m, cfg, kind, dispatcher, precision, recompute, recipe, scope, gshard)
                                got = layer_kernels(*args[:-1], gshard=gshard)
                                want = _single_share_reference(*args)
                                assert (got.fwd, got.bwd, got.syncs_fwd, got.syncs_bwd) == want, args
                                n += 1
    assert n == len(set(m.layer_kinds)) * 6 * 3 * 4 * 2 * 2 * 2  # kinds x configs x dispatchers x precisions x ...


def test_whole_layer_graphs_remove_exactly_the_launch_idle_and_keep_the_sync():
    c = CAT.cluster("8xh100")
    cfg = ParallelConfig(dp=8, ep=8)

    def layer(scope: str, launch: float, sync: float):
        cc = with_devices(
            c,
            {
                "h100": replace(
                    c.device("h100"),
                    runtime=replace(c.device("h100").runtime, launch_us=launch, sync_us=sync, call_us=0.0),
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


# the last three are Megatron-Core's own rules (core_v0.16.0 transformer_config.py __post_init__ asserts them:
# moe only for drop-and-pad MoE, not with moe_router, moe_preprocess only with moe_router)
@pytest.mark.parametrize(
    "bad", ["", "full_iteration", "layer,attn", "attn,bogus", 3, "moe", "attn,moe,moe_router", "attn,moe_preprocess"]
)
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
