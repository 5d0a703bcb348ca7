"""ModelLink's legacy GShard MoE layer (``Settings.gshard_capacity_factor``) against closed forms read off its
code -- MindSpeed ``ascendspeed/components/moe`` @224ae35e (gate.py, moe_layer.py, experts.py, utils.py) and
ModelLink ``modellink/model/moe.py`` @0c8163f9de (the experts) -- on the synthetic device: constant GEMM
efficiency, element-wise work free, constant bus bandwidth, no host terms.

What the code does, per rank, for the ``S`` tokens the gate sees (the sequence-parallel shard):
- every expert runs exactly its capacity ``C = cf * k * S / E`` rows (padded; tokens past it dropped), so
  the routed work is ``cf`` times the balanced share whatever the load imbalance;
- dispatch ``[E*C, S] @ [S, h]`` and combine ``[S, E*C] @ [E*C, h]`` are dense matmuls: two forward, three
  backward (the dispatch mask has no gradient);
- each expert's w1 and w3 are separate ColumnParallelLinears, each all-gathering the capacity rows under
  sequence parallelism; w2 reduce-scatters them once.
"""

from __future__ import annotations

import pytest

from hapmoe_milp.calibration.runs import load_runs
from hapmoe_milp.config import ParallelConfig, Settings
from hapmoe_milp.cost.kernels import layer_kernels
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.errors import SettingsError
from tests.helpers import EFF, INTRA, PEAK, synthetic_cluster, tiny_moe

SEQ = 4096
MOE = tiny_moe()  # h 1024, 8 experts top-2 of width 2048, SwiGLU
H, F, E, K = 1024, 2048, 8, 2


def _layer(tp: int, **st):
    cm = CostModel(MOE, synthetic_cluster(nodes=1), Settings(seq_length=SEQ, **st))
    return cm.layer("syn", ParallelConfig(tp=tp, dp=8 // tp, etp=tp), 1, "moe", "none")


# (tp, capacity factor, imbalance the dropless layer is priced at)
CASES = [(1, 1.0, 1.0), (1, 1.25, 1.0), (2, 1.1, 1.0), (2, 2.0, 1.5), (4, 1.1, 1.3), (8, 1.1, 1.0)]


@pytest.mark.parametrize(("tp", "cf", "imb"), CASES)
def test_gshard_compute_is_capacity_padded_experts_plus_dispatch_and_combine_matmuls(tp, cf, imb):
    ts = SEQ / tp
    experts_f = 2 * K * SEQ * H * 3 * F / tp / (EFF * PEAK)  # all k*S routed rows gathered, fc1 (2F) + fc2 (F)
    einsum = 2 * (cf * K * ts) * ts * H / (EFF * PEAK)  # one [E*C, S] x [S, h] matmul
    expected = 3 * (cf - imb) * experts_f + (2 + 3) * einsum  # forward + backward
    got = _layer(tp, gshard_capacity_factor=cf, imbalance=imb).compute - _layer(tp, imbalance=imb).compute
    assert got == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(("tp", "cf", "imb"), CASES)
def test_gshard_experts_all_gather_twice_and_reduce_scatter_once_per_pass(tp, cf, imb):
    size = tp * K * (SEQ / tp) * H * 2  # bytes of the gathered routed rows, BF16

    def ag(x: float) -> float:
        return (tp - 1) / tp * x / (INTRA["all_gather"] * 1e9)

    def rs(x: float) -> float:
        return (tp - 1) / tp * x / (INTRA["reduce_scatter"] * 1e9)

    gshard = _layer(tp, gshard_capacity_factor=cf, imbalance=imb).ep
    dropless = _layer(tp, imbalance=imb).ep
    assert gshard == pytest.approx(2 * (2 * ag(cf * size) + rs(cf * size)), rel=1e-9, abs=1e-15)
    assert dropless == pytest.approx(2 * (ag(size) + rs(size)), rel=1e-9, abs=1e-15)


# (tp, ep): forward kernels = attention 7 + the GShard block 57 + per local expert 6 (+3 collectives under
# sequence-parallel TP) + the attention block's SP collectives 4
@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 1), (8, 1), (1, 4), (2, 2)])
def test_gshard_kernel_count_follows_the_legacy_layer(tp, ep):
    local = E // ep
    fwd = 7 + 57 + local * (6 + 3 * (tp > 1)) + 4 * (tp > 1)
    gemms = 2 + 5 + 3 * local
    kern = layer_kernels(MOE, ParallelConfig(tp=tp, ep=ep, etp=tp), "moe", "alltoall", "bf16", "none", gshard=True)
    assert kern.fwd == fwd
    assert kern.bwd == pytest.approx(2 * gemms + 1.5 * (fwd - gemms))
    assert kern.syncs_fwd == 1.0  # exp_counts .to("cpu") in top2gating


@pytest.mark.parametrize("bad", [0.5, -1.0, "1.1x"])
def test_capacity_factor_below_one_or_not_a_number_is_refused(bad):
    with pytest.raises(SettingsError, match="gshard_capacity_factor"):
        Settings(gshard_capacity_factor=bad)


def test_settings_price_padded_rows_at_the_capacity_factor_and_dropless_rows_at_the_imbalance():
    assert Settings(imbalance=1.3).expert_rows_factor == 1.3
    assert Settings(imbalance=1.3, gshard_capacity_factor=1.1).expert_rows_factor == 1.1


def test_a_runs_file_carries_the_capacity_factor(tmp_path):
    p = tmp_path / "runs.yaml"
    p.write_text(
        "runs:\n- id: r\n  source: local:x\n  model: mixtral-8x7b\n  cluster: 32x910b\n  tp: 8\n  pp: 4\n"
        "  seq_length: 32768\n  global_batch_size: 8\n  gshard_capacity_factor: 1.1\n  step_time_s: 16.8\n"
    )
    (run,) = load_runs(p)
    assert run.settings_kw()["gshard_capacity_factor"] == 1.1
