"""The package's import graph has no cycle inside client/, engine/, server/ or protocol/.

Every import statement counts, wherever it sits (module top, function body, class body), except
those under `if TYPE_CHECKING:`, which never run. A function-level import is still a
dependency: it runs the first time the function does, and a cycle through one is a cycle a
reader has to hold in their head. Lazy imports that keep `import burn_remote` light are fine
as long as they point *down* the layering, so they never close a loop.

Edges are the modules an import names: `from .a import b` is an edge to module `a.b` when that
is a module, otherwise to `a`. The package `__init__` that Python runs before a submodule is
not counted as an edge of its own (it is when written, e.g. `from .. import nn`).

The layering between folders (client -> protocol, engine; server -> protocol, engine, client;
engine -> protocol; protocol -> nothing of ours) is checked here too, over the same graph.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = {
    "burn_remote": "client",
    "burn_remote.protocol": "protocol",
    "burn_remote.engine": "engine",
    "burn_remote.server": "server",
}
ALLOWED = {
    "client": {"client", "protocol", "engine"},
    "server": {"server", "protocol", "engine", "client"},
    "engine": {"engine", "protocol"},
    "protocol": {"protocol"},
}
"""Which folders the modules of each folder may import."""

KNOWN_CYCLES: dict[str, list[set[str]]] = {
    "client": [],
    "engine": [],
    "protocol": [],
    "server": [],
}
"""Cycles not yet broken, per folder: the test fails on any other cycle, and on a listed one
that is gone (so the list only shrinks)."""


def _folder_of(module: str) -> str:
    for pkg in ("burn_remote.protocol", "burn_remote.engine", "burn_remote.server"):
        if module == pkg or module.startswith(pkg + "."):
            return FOLDERS[pkg]
    return "client"


def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
    """Every module of the package: dotted name -> (file, is a package `__init__`)."""
    found: dict[str, tuple[pathlib.Path, bool]] = {}
    for pkg, folder in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join([pkg, *parts])] = (path, is_package)
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST):
    """Every import statement under `node` that can run (the `else` of TYPE_CHECKING can)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for stmt in child.orelse:
                yield from _imports_of_stmt(stmt)
            continue
        yield from _imports_of_stmt(child)


def _imports_of_stmt(node: ast.AST):
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    yield from _imports(node)


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module of ours: first line that imports it}."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def _describe(component: set[str], graph: dict[str, dict[str, int]]) -> str:
    lines = [f"cycle of {len(component)} modules:"]
    for module in sorted(component):
        for target, line in sorted(graph[module].items()):
            if target in component:
                lines.append(f"  {module}:{line} imports {target}")
    return "\n".join(lines)


GRAPH = import_graph()


@pytest.mark.parametrize("folder", sorted(KNOWN_CYCLES))
def test_no_import_cycle_in(folder):
    found = [c for c in cycles(GRAPH) if _folder_of(next(iter(c))) == folder]
    known = KNOWN_CYCLES[folder]
    new = [c for c in found if c not in known]
    gone = [c for c in known if c not in found]
    assert not new, "\n".join(_describe(c, GRAPH) for c in new)
    assert not gone, f"cycles listed in KNOWN_CYCLES are gone, remove them: {gone}"


def test_folders_import_only_down_the_layering():
    wrong = [
        f"{module}:{line} imports {target}"
        for module, edges in GRAPH.items()
        for target, line in edges.items()
        if _folder_of(target) not in ALLOWED[_folder_of(module)]
    ]
    assert not wrong, "\n".join(wrong)


def test_the_graph_sees_function_level_and_skips_type_checking_imports():
    """The oracle for the walker: a known lazy import is an edge, a TYPE_CHECKING one is not."""
    init = GRAPH["burn_remote"]
    assert "burn_remote._tensor" in init  # a top-level import
    assert "burn_remote._jobs" not in init  # only under TYPE_CHECKING (and by name string)
    assert "burn_remote._remote" in init  # a function-level import (the peer row of the table)
    toy = ast.parse(
        "import typing\n"
        "if typing.TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
        "def f():\n    import c\n"
        "class K:\n    def g(self):\n        if x:\n            import d\n"
    )
    assert [n.names[0].name for n in _imports(toy)] == ["typing", "b", "c", "d"]


def test_no_import_sits_at_the_bottom_of_a_file():
    """Module-level imports come first (ruff's E402); a `noqa: E402` is how one used to sit
    at the bottom of a file to dodge a cycle, so none may remain in the package."""
    dodges = [
        f"{path.relative_to(ROOT)}:{n}"
        for path, _ in _modules().values()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "noqa: E402" in line or "noqa:E402" in line
    ]
    assert not dodges, "imports after code (move them up, break the cycle):\n" + "\n".join(dodges)
