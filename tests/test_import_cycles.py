"""No import circles in the project, read from the import statements themselves.

``test_import_boundaries`` imports each package and looks at ``sys.modules``; it cannot see an
import inside a function or under ``TYPE_CHECKING``, and those are exactly how a circle stays
alive. This test parses every module of ``duplex``, ``clients``, ``bench`` and ``batch_models``,
takes every ``import`` / ``from ... import`` wherever it sits (module level, function body,
``TYPE_CHECKING`` block), resolves it to a project module, and finds the strongly connected
components of that graph: each component of more than one module is a circle.

The circles that remain are listed in ``KNOWN`` and must match exactly: a new circle fails, and so
does a listed one that was broken (remove it from the list, so it cannot come back unnoticed).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("duplex", "clients", "bench", "batch_models")

#: Circles still to break, each a set of modules (none left: keep it so).
KNOWN: set[frozenset[str]] = set()


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _targets(
    module: str, path: Path, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]
) -> set[str]:
    """The project modules one import statement loads (the nearest enclosing module for a name)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, *([node.module] if node.module else [])])
        names = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
        ]
    out = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.add(name)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, anywhere in its source."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                graph[name] |= _targets(name, path, node, modules)
    return graph


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
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
                        found.add(frozenset(component))
    return found


def test_the_cycle_finder_sees_an_import_inside_a_function_and_under_type_checking() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == {frozenset({"a", "b", "c"})}
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from duplex.engine.manager import SessionManager\n"
        "def f():\n    from duplex.engine import stream\n"
    )
    modules = {"duplex.engine.manager": ROOT, "duplex.engine.stream": ROOT, "duplex.engine.x": ROOT}
    seen = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            seen |= _targets("duplex.engine.x", ROOT / "x.py", node, modules)
    assert seen == {"duplex.engine.manager", "duplex.engine.stream"}


def test_no_import_circles_but_the_known_ones() -> None:
    found = circles(import_graph())
    new = found - KNOWN
    broken = KNOWN - found
    assert not new, "new import circles: " + "; ".join(" <-> ".join(sorted(c)) for c in new)
    assert not broken, "circles broken (remove them from KNOWN): " + "; ".join(
        " <-> ".join(sorted(c)) for c in broken
    )
