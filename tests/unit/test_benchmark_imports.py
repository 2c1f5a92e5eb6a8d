"""benchmarks/ imports form no circle, and tests use only its public names."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def _benchmark_imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) for every import of benchmarks.*, lazy ones too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [a.name for a in node.names]
            if node.module == "benchmarks":
                found += [(f"benchmarks.{n}", [], node.lineno) for n in names]
            elif node.module.startswith("benchmarks."):
                found.append((node.module, names, node.lineno))
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names if a.name.startswith("benchmarks.")]
            found += [(m, [], node.lineno) for m in modules]
    return found


def test_benchmark_modules_import_each_other_without_a_circle() -> None:
    graph = {
        f"benchmarks.{p.stem}": {m for m, _, _ in _benchmark_imports(p)}
        for p in BENCHMARKS.glob("*.py")
    }
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, (*path, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())


def test_tests_import_no_private_names_from_benchmarks() -> None:
    private = [
        f"{path.relative_to(ROOT)}:{line}: {module}.{name}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for module, names, line in _benchmark_imports(path)
        for name in names
        if name.startswith("_")
    ]
    assert private == []
