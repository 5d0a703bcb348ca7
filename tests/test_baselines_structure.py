"""The baselines are thin adapters (issue 12): one module per planner, and no cost computed outside
``cost/``. Checked on the source with ``ast``: no import of the pricing primitives, no use of their
functions, no private :class:`CostModel` attribute. The checker is itself tested on snippets that
break each rule, so a pass means the rule holds, not that the checker saw nothing.

Also checked: the zebra model's per-layer times are the cost model's public pieces, composed as
:func:`hetermoe_style` documents them."""

from __future__ import annotations

import ast
import inspect
from functools import cache
from pathlib import Path

import pytest

import hapmoe_milp.baselines as baselines
from hapmoe_milp import api
from hapmoe_milp.cost.model import CostModel
from hapmoe_milp.specs import Catalog

PKG = Path(baselines.__file__).parent
FORBIDDEN_MODULES = ("hapmoe_milp.cost.primitives", "hapmoe_milp.cost.kernels")
# the low-level pricing functions: whoever calls them computes a cost
PRICING_FUNCTIONS = {
    "gemm_time",
    "memory_time",
    "attention_time",
    "collective_time",
    "dispatch_time",
    "host_overhead",
    "distinct_groups",
    "layer_kernels",
}
# private CostModel members by introspection (methods and what __init__ sets), e.g. _layer, _memo, _ep_comm
PRIVATE_COST_MEMBERS = {
    n for n in [*vars(CostModel), "_memo"] if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))
}
# Known gap in the public cost API, kept visible here rather than hidden: Metis's MoE-unaware estimator
# overrides the EP-traffic hook. Remove the entry once cost/ offers a public switch for it.
ALLOWED_PRIVATE_OVERRIDES: set[tuple[str, str, str]] = set()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """Absolute module name of an ``ImportFrom`` inside ``hapmoe_milp.baselines.<module>``."""
    if node.level == 0:
        return node.module or ""
    package = ["hapmoe_milp", "baselines"]  # every module here, __init__ included, sits in this package
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _annotation_names(ann: ast.expr | None) -> set[str]:
    if ann is None:
        return set()
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        ann = ast.parse(ann.value, mode="eval").body
    return {n.id for n in ast.walk(ann) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(ann) if isinstance(n, ast.Attribute)
    }


def violations(source: str, module: str = "snippet") -> list[str]:
    """Every breach of the adapter rules in ``source`` (one line each)."""
    tree = ast.parse(source)
    out: list[str] = []
    # classes that are CostModels: CostModel itself and subclasses defined here (transitively)
    cost_classes = {"CostModel"}
    grew = True
    while grew:
        grew = False
        for node in ast.walk(tree):
            bases = {b.id for b in node.bases if isinstance(b, ast.Name)} if isinstance(node, ast.ClassDef) else set()
            if bases & cost_classes and node.name not in cost_classes:
                cost_classes.add(node.name)
                grew = True
    # names bound to a CostModel: annotated parameters, assignments from a constructor, self in subclasses
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                if _annotation_names(a.annotation) & cost_classes:
                    bound.add(a.arg)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            value = node.value
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            is_cost = (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in cost_classes
            ) or (isinstance(node, ast.AnnAssign) and _annotation_names(node.annotation) & cost_classes)
            if is_cost:
                bound |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ClassDef) and node.name in cost_classes:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.args.args:
                    bound.add(item.args.args[0].arg)
                    if _is_private(item.name) and node.name != "CostModel":
                        key = (module, node.name, item.name)
                        if key not in ALLOWED_PRIVATE_OVERRIDES:
                            out.append(f"{module}: {node.name} overrides private CostModel hook {item.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = _resolve(module, node)
            if mod.startswith(FORBIDDEN_MODULES):
                out.append(f"{module}:{node.lineno}: imports from {mod}")
            for alias in node.names:
                if alias.name in PRICING_FUNCTIONS:
                    out.append(f"{module}:{node.lineno}: imports pricing function {alias.name} from {mod}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(FORBIDDEN_MODULES):
                    out.append(f"{module}:{node.lineno}: imports {alias.name}")
        elif isinstance(node, ast.Name) and node.id in PRICING_FUNCTIONS:
            out.append(f"{module}:{node.lineno}: uses pricing function {node.id}")
        elif isinstance(node, ast.Attribute):
            if node.attr in PRICING_FUNCTIONS:
                out.append(f"{module}:{node.lineno}: uses pricing function .{node.attr}")
            if node.attr in PRIVATE_COST_MEMBERS:
                out.append(f"{module}:{node.lineno}: private CostModel member .{node.attr}")
            elif _is_private(node.attr) and isinstance(node.value, ast.Name) and node.value.id in bound:
                out.append(f"{module}:{node.lineno}: private attribute {node.value.id}.{node.attr} of a CostModel")
    return out


def _modules() -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted(PKG.glob("*.py"))}


def test_one_module_per_baseline() -> None:
    assert {"__init__", "common", "megatron_uniform", "metis", "hetermoe"} <= set(_modules())
    where = {
        baselines.megatron_uniform: "megatron_uniform",
        baselines.metis_style: "metis",
        baselines.hetermoe_style: "hetermoe",
    }
    for fn, mod in where.items():
        assert fn.__module__ == f"hapmoe_milp.baselines.{mod}"
        assert inspect.getsourcefile(fn) == str(PKG / f"{mod}.py")


@pytest.mark.parametrize("module", sorted(_modules()))
def test_baseline_modules_compute_no_costs(module: str) -> None:
    assert violations(_modules()[module], module) == []


def test_private_cost_members_are_known() -> None:
    # the introspected list must contain the internals the old zebra code reached into, or the check
    # below them would be vacuous
    assert {"_layer", "_memo", "_ep_comm", "_mla_up_gemms"} <= PRIVATE_COST_MEMBERS


BAD = [
    ("from hapmoe_milp.cost.primitives import BF16\n", "imports from hapmoe_milp.cost.primitives"),
    ("from ..cost.primitives import gemm_time\n", "imports from hapmoe_milp.cost.primitives"),
    ("import hapmoe_milp.cost.primitives as p\n", "imports hapmoe_milp.cost.primitives"),
    ("from hapmoe_milp.cost.model import memory_time\n", "imports pricing function memory_time"),
    ("def f(dev):\n    return prim.gemm_time(dev, 1, 2, 3)\n", "uses pricing function .gemm_time"),
    ("def f(cm: CostModel):\n    return cm._coll(1)\n", "private attribute cm._coll"),
    ("def f(cm: CostModel):\n    return cm._ep_comm(1)\n", "private CostModel member ._ep_comm"),
    ("def f(cm: 'CostModel'):\n    return cm._new_private\n", "private attribute cm._new_private"),
    ("def f(m, c, s):\n    x = CostModel(m, c, s)\n    return x._whatever\n", "private attribute x._whatever"),
    ("def f(anything):\n    return anything._mla_up_gemms(1)\n", "private CostModel member ._mla_up_gemms"),
    (
        "class A(CostModel):\n    def g(self):\n        return self._secret\n",
        "private attribute self._secret",
    ),
    ("class A(CostModel):\n    def _layer(self):\n        return 0\n", "overrides private CostModel hook _layer"),
]


@pytest.mark.parametrize(("source", "expected"), BAD)
def test_checker_catches_each_breach(source: str, expected: str) -> None:
    found = violations(source, "metis")
    assert any(expected in v for v in found), found


def test_checker_accepts_public_use() -> None:
    ok = (
        "from hapmoe_milp.cost.model import BUCKET_PARAMS, CostModel\n"
        "def f(cm: CostModel, d):\n"
        "    s = cm.layer_split(d, 1, 1, 'none')\n"
        "    return s.attention_fwd + cm.expert_gemms(d, 8.0, 2, 1) + cm.collective(cm.device(d), d, 'p2p', 1, 2, 2)\n"
    )
    assert violations(ok, "hetermoe") == []


# ------------------------------------------------------------------ the zebra model is the cost model's
@cache
def _zebra(cluster: str):  # type: ignore[no-untyped-def]
    m, c = api.resolve("mixtral-s", cluster, Catalog())
    st = api.make_settings(m)
    sol = baselines.hetermoe_style(m, c, st)
    assert sol.plan is not None, sol.message
    return m, c, st, sol.plan.predicted["zebra"]


@pytest.mark.parametrize("cluster", ["16-1", "8xmi300x+8x910b"])
def test_zebra_layer_times_are_cost_model_pieces(cluster: str) -> None:
    """Rebuild the chosen layout's per-layer times from the public cost API, following the documented
    zebra semantics: attention side = layer_split (+ the offloaded share of all experts on the attention
    devices), expert side = imbalance x expert GEMMs (x2 backward, + a forward under full recompute),
    cross = one cross-type dispatch of the remaining routed tokens' bf16 hidden states."""
    m, c, st, z = _zebra(cluster)
    cm = CostModel(m, c, st)
    att, exp = z["attention_device"], z["expert_device"]
    M, N, tp, ep, etp, edp = (z[k] for k in ("attention_devices", "expert_devices", "attention_tp", "ep", "etp", "edp"))
    rec = z["recompute"]
    E, k, b, imb = m.num_experts, m.moe_router_topk, st.micro_batch_size, st.imbalance
    L_moe = sum(1 for kd in m.layer_kinds if kd != "dense")
    f = z["offloaded_experts"] / (E * L_moe)
    tokens = M // tp * b * st.seq_length  # one ZP group's micro-batch
    split = cm.layer_split(att, tp, b, rec)
    ep_x = max(d for d in range(1, M + 1) if M % d == 0 and E % d == 0)
    x_f = imb * cm.expert_gemms(att, k * tokens / (E * (M // ep_x)), E // ep_x, 1)
    lt = z["layer_times"]
    assert lt["attention_f"] == pytest.approx(split.attention_fwd + f * x_f, rel=1e-12)
    e_g = imb * cm.expert_gemms(exp, k * tokens / (E * edp), E // ep, etp)
    if etp == 1:
        assert lt["expert_f"] == pytest.approx((1 - f) * e_g, rel=1e-12)
        full = rec == "full"
        assert lt["expert_b"] == pytest.approx((1 - f) * (2 + full) * e_g, rel=1e-12)
    else:
        assert lt["expert_f"] > (1 - f) * e_g  # plus the ETP gathers
    cross = cm.cross_dispatch(att, exp, (1 - f) * k * tokens * m.hidden_size * 2, M, N) if f < 1 else 0.0
    assert lt["cross"] == pytest.approx(cross, rel=1e-12)
    # the layer takes the closed loop's bottleneck or one micro-batch's round trip
    R = z["micro_batches"]
    af, ef, cr = lt["attention_f"], lt["expert_f"], lt["cross"]
    assert lt["layer_f"] == pytest.approx(max(R * max(af, ef, cr), af + ef + 2 * cr), rel=1e-12)
