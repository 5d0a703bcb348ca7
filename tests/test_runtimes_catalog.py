"""Every catalog cluster x the five issue-18 models: the default search names a runtime that runs the
cluster's vendor mix, and ``solve --export <that runtime>`` writes files that pass the runtime's checks
(our rules, and the re-enacted ones: FlagScale's argument asserts and runner launch, MindSpeed-LLM's
parsing and validation), with no plan refused after the search.

The searches are cut at a few seconds (the DP's best plan so far counts: runnability does not depend on
optimality); a model that fits no plan on a cluster is skipped with the search's own reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hapmoe_milp.api import solve
from hapmoe_milp.errors import InfeasibleError
from hapmoe_milp.export import export_plan
from hapmoe_milp.export.megatron import parse_hostfile
from hapmoe_milp.export.validate import validate
from hapmoe_milp.runtimes import RUNTIMES, cluster_vendors
from hapmoe_milp.specs import Catalog
from tests.flagscale_oracle import built_layer_ids, check_launch, flagscale_asserts
from tests.mindspeed_oracle import mindspeed_accepts

CAT = Catalog()
MODELS = ["mixtral-s", "mixtral-l", "deepseek-v3", "qwen3-235b-a22b", "deepseek-v2-lite"]
CASES = [(m, c) for c in CAT.cluster_names() for m in MODELS]
TIME_LIMITS = (6.0, 60.0)  # a busy machine may need the longer one for the largest models


def _solve(model: str, cluster: str):
    for limit in TIME_LIMITS:
        try:
            return solve(model, cluster, time_limit=limit, catalog=CAT)
        except InfeasibleError as exc:
            if exc.constraint != "time" or limit == TIME_LIMITS[-1]:
                if exc.constraint == "time":
                    raise
                pytest.skip(f"{model} fits no plan on {cluster}: {exc}")
    raise AssertionError("unreachable")


@pytest.mark.slow
@pytest.mark.parametrize(("model", "cluster"), CASES, ids=[f"{m}-{c}" for m, c in CASES])
def test_default_plan_runs_on_its_runtime_and_exports(model: str, cluster: str, tmp_path: Path) -> None:
    sol = _solve(model, cluster)
    plan, m, c = sol.plan, CAT.model(model), CAT.cluster(cluster)
    assert plan is not None and plan.runtime in RUNTIMES
    rt = RUNTIMES[plan.runtime]
    vendors = cluster_vendors(c)
    assert rt.runs_vendors(vendors), (rt.name, vendors)
    if len(vendors) > 1:
        assert rt.name == "flagscale"
    assert [v for v in validate(plan, m, c, rt.name) if v.severity == "error"] == []
    export_plan(plan, m, c, rt.name, tmp_path)  # type: ignore[arg-type]
    if rt.name == "flagscale":
        cfg = yaml.safe_load((tmp_path / "flagscale.yaml").read_text())
        flagscale_asserts(cfg, m)
        check_launch(tmp_path, cluster)
        ids = built_layer_ids(cfg)
        assert sorted(ids) == list(range(m.num_layers)), "no two meshes build the same layer ids"
    else:
        world = sum(n for _h, n in parse_hostfile((tmp_path / "hostfile").read_text()))
        assert world == plan.devices_used
        if rt.name == "mindspeed":
            mindspeed_accepts((tmp_path / "mindspeed_args.txt").read_text().split(), world=world)
        else:
            assert (tmp_path / "megatron_args.txt").is_file()


@pytest.mark.slow
def test_issue_deepseek_v3_flagscale_export_succeeds(tmp_path: Path) -> None:
    """The command issue 18 saw refused after its search: MTP ties the first and last mesh's TP, which
    is now a search constraint, so the search returns a plan FlagScale's asserts accept."""
    from hapmoe_milp import cli

    out = tmp_path / "launch"
    argv = ["solve", "-m", "deepseek-v3", "-c", "256-h800-910b", "--family", "hetero", "--export", "flagscale"]
    assert cli.run([*argv, "--out", str(out), "--time-limit", "30"]) == 0
    cfg = yaml.safe_load((out / "flagscale.yaml").read_text())
    meshes = cfg["system"]["hetero"]["hetero_process_meshes"]
    assert meshes[0] == meshes[-5]  # first and last mesh: one TP
    flagscale_asserts(cfg, CAT.model("deepseek-v3"))
    check_launch(out, "256-h800-910b")
