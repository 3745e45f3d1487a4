"""No import cycle inside ``src/disco``, counting every import (at the top, inside a function, or under
``if TYPE_CHECKING:``): neither between modules nor between the top-level packages and modules of
``disco`` (``disco.graph``, ``disco.runtime``, ``disco.cost``, ...: an edge A -> B when any module of A
imports any module of B)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, pkg: str, files: dict[str, Path]) -> list[str]:
    """The modules an import statement names (``from pkg import mod`` counts as the module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        anchor = pkg.split(".")
        anchor = anchor[:len(anchor) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports, wherever the import statement is."""
    files = {_module_name(p, root): p for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            graph[mod].update(t for t in _imported(node, pkg, files) if t in files and t != mod)
    return graph


def package_graph(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The module graph collapsed to ``package``'s top-level subpackages and modules (the package's own
    ``__init__`` is a node of its own)."""

    def top(mod: str) -> str:
        return ".".join(mod.split(".")[:2])

    out: dict[str, set[str]] = {top(m): set() for m in graph}
    for mod, targets in graph.items():
        out[top(mod)].update(top(t) for t in targets if top(t) != top(mod))
    assert all(m == package or m.startswith(package + ".") for m in out)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _edges_within(graph: dict[str, set[str]], comps: list[list[str]]) -> list[str]:
    """The edges that close each cycle, for the failure message."""
    return [f"{a} -> {b}" for comp in comps for a in comp for b in sorted(graph[a]) if b in comp]


def test_no_import_cycle_between_modules() -> None:
    graph = import_graph(SRC, "disco")
    assert "disco.graph.partition" in graph and graph["disco.cost"], "the import graph was not built"
    found = cycles(graph)
    assert found == [], "\n".join(_edges_within(graph, found))


def test_no_import_cycle_between_packages() -> None:
    graph = package_graph(import_graph(SRC, "disco"), "disco")
    assert {"disco.graph", "disco.runtime", "disco.cost", "disco.api"} <= set(graph), sorted(graph)
    assert "disco.graph" in graph["disco.cost"], "the package graph was not built"
    found = cycles(graph)
    assert found == [], "\n".join(_edges_within(graph, found))


def test_graph_types_sit_below_rules_and_partitioner() -> None:
    """The op rules and the partitioner meet only in ``disco.graph.types``: neither imports the other."""
    graph = import_graph(SRC, "disco")
    rules = {m for m in graph if m.startswith("disco.graph.ops")}
    assert "disco.graph.ops.mixing" in rules and "disco.graph.types" in graph
    assert graph["disco.graph.types"] == set()
    assert not graph["disco.graph.partition"] & rules, graph["disco.graph.partition"]
    assert all("disco.graph.partition" not in graph[m] for m in rules)
    assert all("disco.graph.types" in graph[m] for m in ("disco.graph.partition", "disco.graph.ops.base"))


def _synthetic(tmp_path: Path) -> dict[str, set[str]]:
    """pkg: a -> sub.b (inside a function) -> c -> a; d -> a; and a -> d under TYPE_CHECKING."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import D\n"
                              "def f():\n    from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from .a import f\n")
    (pkg / "e.py").write_text("from .sub.b import x\n")
    return import_graph(tmp_path, "pkg")


def test_the_check_finds_a_cycle(tmp_path: Path) -> None:
    """Imports inside a function and under ``if TYPE_CHECKING:`` both count."""
    graph = _synthetic(tmp_path)
    assert graph["pkg.a"] == {"pkg.sub.b", "pkg.d"} and graph["pkg.d"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.d", "pkg.sub.b"]]


def test_the_package_check_finds_a_cycle(tmp_path: Path) -> None:
    """x.one -> y.two -> x.three: no cycle between modules, one between the packages x and y; z.py only
    points into it."""
    pkg = tmp_path / "pkg"
    for sub in ("x", "y"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "x" / "one.py").write_text("from ..y import two\n")
    (pkg / "y" / "two.py").write_text("def f():\n    from pkg.x.three import g\n")
    (pkg / "x" / "three.py").write_text("def g():\n    pass\n")
    (pkg / "z.py").write_text("from .x import one\n")
    modules = import_graph(tmp_path, "pkg")
    assert cycles(modules) == []
    graph = package_graph(modules, "pkg")
    assert graph == {"pkg": set(), "pkg.x": {"pkg.y"}, "pkg.y": {"pkg.x"}, "pkg.z": {"pkg.x"}}
    assert cycles(graph) == [["pkg.x", "pkg.y"]]
