"""FlagScale's runner with our files: every rank gets a process on its device type, with its vendor's
visible-devices variable (the runner re-enacted in :mod:`tests.flagscale_oracle`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hapmoe_milp.api import solve
from hapmoe_milp.config import ParallelConfig
from hapmoe_milp.export import export_plan
from hapmoe_milp.plan import Plan, Stage
from hapmoe_milp.specs import Catalog
from tests.flagscale_oracle import RunnerError, check_launch, flagscale_asserts, launch

CAT = Catalog()
MIXTRAL = CAT.model("mixtral-s")
C16 = CAT.cluster("16-1")
_H, _B = ParallelConfig(tp=4, dp=1, ep=2), ParallelConfig(tp=2, dp=2, ep=2)  # 4 devices each
HETERO = Plan(
    "mixtral-s",
    "16-1",
    "hetero",
    tuple(
        Stage(d, c, s, e)
        for d, c, s, e in (("h800", _H, 0, 7), ("h800", _H, 7, 14), ("910b", _B, 14, 19), ("910b", _B, 19, 24))
    ),
    256,
    4096,
    2,
)


def test_runner_starts_every_rank_with_its_vendors_visible_devices(tmp_path: Path) -> None:
    export_plan(HETERO, MIXTRAL, C16, "flagscale", tmp_path)
    hosts = check_launch(tmp_path, "16-1")
    assert [(x["type"], x["nproc"]) for x in hosts] == [("h800", 8), ("910b", 8)]
    assert hosts[0]["envs"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert hosts[1]["envs"]["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert "CUDA_VISIBLE_DEVICES" not in hosts[1]["envs"]  # the 910B host counts its own devices
    flagscale_asserts(yaml.safe_load((tmp_path / "flagscale.yaml").read_text()), MIXTRAL)


def test_without_a_visible_devices_variable_the_runner_crashes(tmp_path: Path) -> None:
    """What issue 18 saw: an experiment.yaml without one fails in run_node before anything starts."""
    export_plan(HETERO, MIXTRAL, C16, "flagscale", tmp_path)
    exp = yaml.safe_load((tmp_path / "experiment.yaml").read_text())
    exp["experiment"]["envs"].pop("device_type_specific")
    (tmp_path / "experiment.yaml").write_text(yaml.safe_dump(exp))
    with pytest.raises(RunnerError, match="num_visible_devices"):
        launch(tmp_path)


@pytest.mark.parametrize(
    ("model", "cluster"), [("mixtral-s", "16-2"), ("mixtral-s", "24-3"), ("deepseek-v2-lite", "16-a100-910b")]
)
def test_solved_cross_vendor_plans_launch(model: str, cluster: str, tmp_path: Path) -> None:
    """Default solves on cross-vendor clusters name FlagScale and launch through its runner as written."""
    sol = solve(model, cluster, time_limit=20, catalog=CAT)
    assert sol.plan is not None and sol.plan.runtime == "flagscale"
    export_plan(sol.plan, CAT.model(model), CAT.cluster(cluster), "flagscale", tmp_path)
    check_launch(tmp_path, cluster)
    flagscale_asserts(yaml.safe_load((tmp_path / "flagscale.yaml").read_text()), CAT.model(model))
