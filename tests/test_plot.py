"""Schedule plot: the simulated 1F1B timeline it draws, and the PNG."""

from __future__ import annotations

import sys

import pytest

from hapmoe_milp.api import estimate_plan, solve
from hapmoe_milp.errors import HapmoeError
from hapmoe_milp.plot import plot_schedule, simulate_plan

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def hetero(catalog):
    """A small heterogeneous plan with few micro-batches (labels drawn)."""
    m, c = catalog.model("mixtral-s"), catalog.cluster("8xh800+8x910b")
    sol = solve(m, c, global_batch_size=16, catalog=catalog)
    assert sol.plan is not None
    return m, c, sol.plan


def test_simulated_schedule_matches_the_estimate(hetero):
    m, c, plan = hetero
    sched = simulate_plan(m, c, plan)
    est = estimate_plan(m, c, plan, simulate=True)
    assert sched.iteration_time_s == pytest.approx(est.iteration_time_s, rel=1e-9)
    assert sched.timeline.makespan == pytest.approx(est.pipeline_s, rel=1e-9)
    # every stage runs each micro-batch forward and backward once per virtual chunk
    M, v = plan.num_microbatches, max(1, plan.vpp)
    for ops in sched.timeline.ops:
        assert sorted((k, mb, c) for k, mb, c, *_ in ops) == sorted(
            [(k, i, c) for k in "FB" for i in range(M) for c in range(v)]
        )
    assert all(0 < b <= 1 for b in sched.busy_fraction)


def test_plot_schedule_writes_a_png(hetero, tmp_path):
    pytest.importorskip("matplotlib")
    m, c, plan = hetero
    out = plot_schedule(m, c, plan, tmp_path / "sub" / "schedule.png")
    data = out.read_bytes()
    assert data[:8] == PNG and len(data) > 10_000
    from matplotlib.image import imread

    img = imread(out)
    assert img.shape[0] > 200 and img.shape[1] > 600


def test_plot_schedule_interleaved_and_by_name(catalog, tmp_path):
    pytest.importorskip("matplotlib")
    from hapmoe_milp.config import Settings
    from hapmoe_milp.knobs import plan_from_knobs

    m, c = catalog.model("mixtral-s"), catalog.cluster("16-1-h")
    st = Settings(seq_length=4096, global_batch_size=32, micro_batch_size=1)
    vplan = plan_from_knobs(m, c, st, pp=2, vpp=2)
    assert vplan.pp == 2 and vplan.vpp == 2
    sched = simulate_plan("mixtral-s", "16-1-h", vplan, catalog=catalog)
    assert {chunk for ops in sched.timeline.ops for _, _, chunk, _, _ in ops} == {0, 1}
    out = plot_schedule("mixtral-s", "16-1-h", vplan, tmp_path / "v.png", catalog=catalog)
    assert out.read_bytes()[:8] == PNG


def test_missing_matplotlib_is_a_clear_error(hetero, tmp_path, monkeypatch):
    for mod in ("matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, mod, None)
    m, c, plan = hetero
    with pytest.raises(HapmoeError, match=r"hapmoe-milp\[plot\]") as ei:
        plot_schedule(m, c, plan, tmp_path / "x.png")
    assert ei.value.field == "out_png"  # the argument; the CLI calls it --plot
    assert not (tmp_path / "x.png").exists()
