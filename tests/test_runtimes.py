"""The runtime model: every rule cites a pinned source, vendor mixes map to the runtimes that run them,
choices resolve as documented, and plan files record the runtime (older v2 files without it still load)."""

from __future__ import annotations

import json
import re

import pytest

from hapmoe_milp.api import search_spaces
from hapmoe_milp.config import Settings
from hapmoe_milp.errors import SettingsError, SpecError
from hapmoe_milp.export.common import TARGETS, selective_modules
from hapmoe_milp.plan import plan_from_dict
from hapmoe_milp.runtimes import ANY, RUNTIMES, SEARCH_FIELDS, cluster_vendors, record, resolve, runtimes_for
from hapmoe_milp.specs import Catalog

CAT = Catalog()


@pytest.mark.parametrize("name", list(RUNTIMES))
def test_every_feature_cites_a_pinned_source(name: str) -> None:
    rt = RUNTIMES[name]
    assert set(SEARCH_FIELDS) <= set(rt.cites), sorted(set(SEARCH_FIELDS) - set(rt.cites))
    for src in (*rt.checked, *rt.cites.values()):
        assert re.fullmatch(r"[0-9a-f]{40}", src.commit), src
        assert "/" in src.repo and src.path
    assert rt.version and all(len(c) == 40 for c in rt.version.values())


def test_export_targets_are_the_runtimes() -> None:
    assert set(TARGETS) == set(RUNTIMES)


@pytest.mark.parametrize("name", CAT.cluster_names())
def test_every_catalog_cluster_has_a_runtime_and_mixes_get_flagscale(name: str) -> None:
    cl = CAT.cluster(name)
    found = [r.name for r in runtimes_for(cl)]
    vendors = cluster_vendors(cl)
    assert found, name
    if len(vendors) > 1:
        assert found == ["flagscale"]
    else:
        (vendor,) = vendors
        one_mesh = {"nvidia": "megatron", "amd": "rocm", "huawei": "mindspeed"}[vendor]
        assert found == [one_mesh, "flagscale"]


def test_resolve_choices() -> None:
    c16 = CAT.cluster("16-1")
    assert resolve(ANY, c16) is None
    assert [r.name for r in resolve("auto", c16) or []] == ["flagscale"]
    with pytest.raises(SettingsError, match="runs nvidia devices"):
        resolve("megatron", c16)
    with pytest.raises(SettingsError, match="must be one of"):
        resolve("deepspeed", c16)


def test_search_spaces_follow_vendors_and_settings() -> None:
    h = CAT.cluster("16-1-h")
    st = Settings()
    assert {f: r.name for f, r in search_spaces("auto", h, st).items()} == {
        "megatron": "megatron",
        "hetero": "flagscale",
    }
    assert search_spaces("any", h, st) == {"megatron": None, "hetero": None}
    ascend = CAT.cluster("16-2-h")
    # no FP8 on 910B in either runtime: nothing to search
    with pytest.raises(SettingsError, match="FP8"):
        search_spaces("auto", ascend, Settings(precision="fp8"))
    # the flex dispatcher (DeepEP) is CUDA-only: FlagScale's space drops it on NVIDIA, Megatron-LM keeps it
    assert {f: r.name for f, r in search_spaces("auto", h, Settings(dispatcher="flex")).items()} == {
        "megatron": "megatron"
    }
    # across vendors FlagScale runs both families (one mesh shape is a case of its meshes)
    c16 = CAT.cluster("16-1")
    assert {f: r.name for f, r in search_spaces("auto", c16, st).items()} == {
        "megatron": "flagscale",
        "hetero": "flagscale",
    }
    with pytest.raises(SettingsError, match="asks for hetero-family"):
        search_spaces("mindspeed", ascend, st, family="hetero")


@pytest.mark.parametrize("name", list(RUNTIMES))
def test_exporters_write_only_recompute_modules_the_runtime_declares(name: str) -> None:
    for model in ("mixtral-s", "llama-2-7b"):
        assert set(selective_modules(CAT.model(model))) <= set(RUNTIMES[name].recompute_modules)


def _plan_doc() -> dict:
    from hapmoe_milp.api import solve

    return json.loads(solve("mixtral-s", "16-1-h", time_limit=10, catalog=CAT).plan.to_json())


def test_plan_files_record_the_runtime_and_old_ones_still_load() -> None:
    doc = _plan_doc()
    assert doc["runtime"] == record(RUNTIMES[doc["runtime"]["name"]])
    assert plan_from_dict(doc, "p.json").runtime == doc["runtime"]["name"]
    old = {k: v for k, v in doc.items() if k != "runtime"}  # a v2 file from before plans named runtimes
    assert plan_from_dict(old, "old.json").runtime is None
    bad = {**doc, "runtime": {"name": "deepspeed"}}
    with pytest.raises(SpecError, match=r"runtime\.name"):
        plan_from_dict(bad, "bad.json")
