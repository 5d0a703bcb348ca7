"""The package's import layering: who may import whom, pinned as a table.

Data flows one way: specs -> cost -> space/instance -> search -> plan -> export/report, with the CLI on top.
In import terms the arrows point the other way -- a room imports only the rooms *below* it -- and a few
rooms are shared vocabulary that everything may read: the error family, the size caps, file I/O, the
settings layer (``config``), and ``plan`` (the Plan/Stage types the cost model prices and the solvers
return). :data:`MAY_IMPORT` is the rule, one row per room: the rooms it may import besides its own modules.
Every import counts -- at module level or inside a function (a lazy import is still a dependency, and the
usual way a cycle hides) -- except ``if TYPE_CHECKING:`` blocks, which never run.

A new room (module or package directly under ``hapmoe_milp/``) must get a row here: where it sits is a
design decision, and this table is where it is written down.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "hapmoe_milp"
ROOT = "hapmoe_milp"  # the package itself (its __init__: the two-name public facade)

# shared vocabulary, importable from every room above it
FOUNDATION = frozenset({"errors", "limits", "fileio", "config", "deadline"})
MODEL = FOUNDATION | {"specs", "plan"}  # input specs and the plan types
PRICED = MODEL | {"cost"}  # ... and the cost model
SEARCHED = PRICED | {"space", "instance", "search"}  # ... and the search over one shared instance

MAY_IMPORT: dict[str, frozenset[str]] = {
    # foundations
    "errors": frozenset(),
    "limits": frozenset(),
    "fileio": frozenset({"errors"}),
    "config": frozenset({"errors", "limits"}),
    "deadline": frozenset({"errors"}),  # the time limit as a point in time, checked while building models
    "layout": frozenset(),  # Megatron's layout grammar: plain text rules, read by knobs and export
    "render": frozenset(),  # rich tables from plain dicts: knows no type of ours
    # inputs and the plan vocabulary
    "specs": FOUNDATION,
    "runtimes": FOUNDATION | {"specs"},  # design §2: what each runtime runs, read by space, validate, export
    "plan": FOUNDATION | {"specs", "runtimes"},  # a plan file records its runtime and the commits checked
    # cost -> space/instance -> search
    "cost": MODEL,
    "space": PRICED | {"runtimes"},
    "instance": PRICED | {"space"},
    "search": PRICED | {"space", "instance"},
    "presets": FOUNDATION | {"specs", "space"},  # solver presets name pruning switches
    # one plan from flags, and what runs it
    "knobs": MODEL | {"layout"},
    "export": PRICED | {"layout", "runtimes", "space"},  # validate reads the space's rules between stages
    # reports and studies built on the search
    "compare": SEARCHED | {"api", "runtimes"},  # compare --runtimes: one api.solve per runtime
    # the Python facade front ends call; no library module below it imports it. It resolves runtimes and
    # asks export which architectures Megatron-Core cannot build (export/megatron_arch.py)
    "api": SEARCHED | {"runtimes", "export"},
    "baselines": SEARCHED | {"api"},  # our planner next to theirs: it calls api.solve like a user would
    "calibration": PRICED | {"knobs"},  # measured runs -> plans (knobs) -> predictions (cost), never the facade
    "plot": PRICED,
    "profiler": FOUNDATION | {"specs", "cost"},
    "sweep": FOUNDATION | {"specs", "api", "plot", ROOT},  # ROOT: ships the package to Ray workers
    # on top
    "cli": frozenset(),  # filled in below: the CLI may import every room
    ROOT: frozenset({"api", "errors"}),
}
MAY_IMPORT["cli"] = frozenset(MAY_IMPORT) - {"cli"}


# ---------------------------------------------------------------------- reading the package
@cache
def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def _target(name: str) -> str:
    """The module an import of ``name`` loads (``hapmoe_milp.plan.Plan`` -> ``hapmoe_milp.plan``)."""
    mods = modules()
    while name not in mods:
        name = name.rpartition(".")[0]
    return name


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node, minus the bodies of ``if TYPE_CHECKING:`` (annotations only; never imported)."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


@cache
def imports_of(module: str) -> frozenset[str]:
    """Modules of the package that ``module`` imports, at any depth of its code."""
    f = modules()[module]
    package = module if f.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in _runtime_nodes(ast.parse(f.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                src = ".".join([*base, *([node.module] if node.module else [])])
            else:
                src = node.module or ""
            if src.split(".")[0] != ROOT:
                continue
            for alias in node.names:  # `from pkg import submodule` loads the submodule
                full = f"{src}.{alias.name}"
                out.add(full if full in modules() else _target(src))
        elif isinstance(node, ast.Import):
            out.update(_target(a.name) for a in node.names if a.name.split(".")[0] == ROOT)
    out.discard(module)
    return frozenset(out)


def cycles(
    edges: Callable[[str], Iterable[str]] = imports_of, nodes: Iterable[str] | None = None
) -> list[frozenset[str]]:
    """Strongly connected groups of modules (Tarjan), each one an import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(frozenset(group))

    for m in modules() if nodes is None else nodes:
        if m not in index:
            visit(m)
    return found


# ---------------------------------------------------------------------- the rules
def test_every_room_has_a_row() -> None:
    rooms = {room(m) for m in modules()}
    assert rooms - set(MAY_IMPORT) == set(), "place the new room in MAY_IMPORT"


@pytest.mark.parametrize("module", sorted(modules()))
def test_imports_follow_the_table(module: str) -> None:
    mine = room(module)
    bad = sorted(t for t in imports_of(module) if room(t) != mine and room(t) not in MAY_IMPORT[mine])
    assert bad == [], f"{module} ({mine}) may import {sorted(MAY_IMPORT[mine])}, not {bad}"


def test_no_import_cycles() -> None:
    """No group of modules imports each other around a loop (at any depth of their code)."""
    assert [sorted(c) for c in cycles()] == []


def test_the_reader_sees_real_imports() -> None:
    """The checker itself: known edges are found (lazy and relative ones too), a TYPE_CHECKING block is not."""
    assert "hapmoe_milp.layout" in imports_of("hapmoe_milp.knobs")
    assert "hapmoe_milp.search.dp" in imports_of("hapmoe_milp.api")  # a lazy import inside solve()
    assert "hapmoe_milp.baselines.common" in imports_of("hapmoe_milp.baselines.metis")  # `from .common`
    assert "hapmoe_milp.cli.catalog" in imports_of("hapmoe_milp.cli.app")  # `from hapmoe_milp.cli import catalog`
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"], "e": ["e"]}
    assert cycles(graph.__getitem__, graph) == [frozenset({"a", "b", "c"})]
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import hapmoe_milp.api\n")
    assert not any(isinstance(n, ast.Import) for n in _runtime_nodes(tree))
