#!/usr/bin/env python3
"""Run Megatron-LM's own code on our exported arguments and record what it says (an oracle for tests).

For every catalog model, a megatron-family plan is exported (``megatron_args``); Megatron-LM's
``parse_args`` + ``validate_args`` (``megatron/training/arguments.py``) check the arguments, and its
``compute_weight_and_optimizer_memory`` / ``compute_activation_memory``
(``megatron/training/theoretical_memory_usage.py``) price them. The results are written, with the pinned
commits and this command, to ``tests/data/megatron_memory_oracle.json``; ``tests/test_cost_memory_oracle.py``
compares the cost model with them. Nothing of Megatron is copied into the repository: the two files are
imported from a checkout the user gives.

Needs torch and megatron-core (the installed 0.16.1 matches the ``--validate-root`` checkout at
core_v0.16.1). Usage::

    git -C Megatron-LM archive core_v0.16.1 megatron/training | tar -x -C /tmp/mlm0161
    git -C Megatron-LM archive d98e8a64dd megatron/training/theoretical_memory_usage.py | tar -x -C /tmp/mlm-d98
    python tools/megatron_memory_oracle.py --validate-root /tmp/mlm0161 --memory-root /tmp/mlm-d98
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import sys
import types
from pathlib import Path

from packaging.version import Version as PkgVersion

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hapmoe_milp.config import Settings  # noqa: E402
from hapmoe_milp.errors import ExportError  # noqa: E402
from hapmoe_milp.export.megatron import megatron_args  # noqa: E402
from hapmoe_milp.knobs import plan_from_knobs  # noqa: E402
from hapmoe_milp.specs import Catalog  # noqa: E402
from tests.data.oracle_cases import DENSE_CASE, LEVER_CASES, catalog_cases, dense_mha_model, is_hybrid  # noqa: E402

VALIDATE_COMMIT = "55ac7082517c3878ae653c07c09c534b8aed49f6"  # Megatron-LM tag core_v0.16.1
MEMORY_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"  # Megatron-LM main, 2026-08-22 (EP-aware formula)


def _load(root: str, name: str, module: str, stub_utils: types.ModuleType) -> types.ModuleType:
    """Import one file of ``megatron/training`` without the package's ``__init__`` (which needs a GPU stack)."""
    import megatron.core  # noqa: F401  (the installed megatron-core)

    pkg = sys.modules.setdefault("megatron.training", types.ModuleType("megatron.training"))
    if not hasattr(pkg, "__path__"):
        pkg.__path__ = []  # type: ignore[attr-defined]
    if f"{root}/megatron/training" not in pkg.__path__:
        pkg.__path__.append(f"{root}/megatron/training")  # type: ignore[attr-defined]
    sys.modules["megatron.training.utils"] = stub_utils
    spec = importlib.util.spec_from_file_location(module, f"{root}/megatron/training/{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module] = mod
    spec.loader.exec_module(mod)
    return mod


def _utils() -> types.ModuleType:
    """The few helpers of ``megatron/training/utils.py`` the two files import (printing, device arch)."""
    u = types.ModuleType("megatron.training.utils")
    u.get_device_arch_version = lambda: 9  # type: ignore[attr-defined]  # Hopper
    u.print_rank_0 = lambda *a, **k: None  # type: ignore[attr-defined]
    u.warn_rank_0 = lambda *a, **k: None  # type: ignore[attr-defined]
    u.is_rank0 = lambda: False  # type: ignore[attr-defined]
    u.is_hybrid_model = lambda args: False  # type: ignore[attr-defined]

    def update_use_dist_ckpt(args: argparse.Namespace) -> None:
        args.use_dist_ckpt = args.ckpt_format != "torch"

    u.update_use_dist_ckpt = update_use_dist_ckpt  # type: ignore[attr-defined]
    return u


def validated_args(arguments: types.ModuleType, argv: list[str], world: int, padded_vocab: int) -> argparse.Namespace:
    """Megatron's parse_args + validate_args on our argv, as a rank of a ``world``-GPU job would run them."""
    old = sys.argv
    sys.argv = ["pretrain_gpt.py", *argv]
    try:
        args = arguments.parse_args()
    finally:
        sys.argv = old
    args.world_size, args.rank = world, 0
    # the environment our launch scripts set for these arguments (export/megatron.py launch_scripts)
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1" if "--use-megatron-fsdp" not in argv else "8"
    os.environ["NVTE_CPU_OFFLOAD_V1"] = "1" if "--fine-grained-activation-offloading" in argv else "0"
    # no Transformer Engine on a CPU machine: answer version checks as TE 2.10 would
    arguments.is_te_min_version = lambda v, *a, **k: PkgVersion(v) <= PkgVersion("2.10.0")
    import torch

    cap = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # an H100, as the plans' cluster (CPU-only here)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            arguments.validate_args(args)
    finally:
        torch.cuda.get_device_capability = cap
    args.padded_vocab_size = padded_vocab  # set by the tokenizer in Megatron; its padding rule is ours too
    return args


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validate-root", required=True, help=f"Megatron-LM checkout at {VALIDATE_COMMIT}")
    ap.add_argument("--memory-root", required=True, help=f"Megatron-LM checkout at {MEMORY_COMMIT}")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "megatron_memory_oracle.json")
    a = ap.parse_args()
    u = _utils()
    arguments = _load(a.validate_root, "arguments", "megatron.training.arguments", u)
    memory = _load(a.memory_root, "theoretical_memory_usage", "megatron.training.theoretical_memory_usage", u)
    cat = Catalog(root=ROOT)
    out: dict[str, object] = {
        "provenance": {
            "validate_args": f"NVIDIA/Megatron-LM {VALIDATE_COMMIT} (core_v0.16.1) megatron/training/arguments.py",
            "theoretical_memory": f"NVIDIA/Megatron-LM {MEMORY_COMMIT} megatron/training/theoretical_memory_usage.py",
            "command": "python tools/megatron_memory_oracle.py --validate-root <core_v0.16.1> --memory-root <d98e8a64dd>",
        },
        "cases": [],
    }
    for case in [*catalog_cases(cat), *LEVER_CASES, DENSE_CASE]:
        m = dense_mha_model() if case["model"] == "dense-mha" else cat.model(case["model"])
        c = cat.cluster(case["cluster"])
        st = Settings(**case["settings"])
        plan = plan_from_knobs(m, c, st, **case["knobs"])
        try:
            argv = megatron_args(plan, m, c, st)
        except ExportError as exc:  # a model Megatron-LM cannot build: not in the megatron family's exports
            out["cases"].append({"name": case["name"], "export": f"refused: {exc}"})  # type: ignore[union-attr]
            print(f"{case['name']}: not exported ({exc})")
            continue
        rec: dict[str, object] = {"name": case["name"], "argv": argv}
        try:
            args = validated_args(arguments, argv, plan.devices_used, m.padded_vocab(plan.stages[0].cfg.tp))
        except (AssertionError, ValueError, TypeError, KeyError) as exc:  # what validate_args raises on bad args
            rec["validate_args"] = f"rejected: {type(exc).__name__}: {exc}"
            out["cases"].append(rec)  # type: ignore[union-attr]
            print(f"{case['name']}: validate_args REJECTED: {exc}")
            continue
        rec["validate_args"] = "ok"
        rec["data_parallel_size"] = args.data_parallel_size
        if is_hybrid(m):
            rec["theoretical_memory"] = "not supported by Megatron for hybrid models (report_theoretical_memory)"
        else:
            rec["weight_and_optimizer_bytes"] = memory.compute_weight_and_optimizer_memory(args)
        if args.sequence_parallel and args.recompute_granularity == "selective":
            rec["activation_bytes"] = memory.compute_activation_memory(args, num_microbatches=plan.num_microbatches)
        out["cases"].append(rec)  # type: ignore[union-attr]
        print(f"{case['name']}: validate_args ok")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
