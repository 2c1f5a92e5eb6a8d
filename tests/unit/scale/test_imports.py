"""The scale package imports without a circle (function-level imports count too)."""

from __future__ import annotations

import ast
from pathlib import Path

import dlscale.scale

PACKAGE = Path(dlscale.scale.__file__).parent


def _edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        module = f"dlscale.scale.{path.stem}"
        found = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found.update(n for n in names if n.startswith("dlscale.scale.") and n != module)
    return {m: {n for n in e if n in graph} for m, e in graph.items()}


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for nxt in sorted(graph[module]):
            found = visit(nxt, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module, [])
        if found:
            return found
    return None


def test_no_module_of_scale_imports_itself_back() -> None:
    assert _circle(_edges()) is None


def test_the_walk_finds_a_circle() -> None:
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
