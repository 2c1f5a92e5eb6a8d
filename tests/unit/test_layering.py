"""The package's imports follow the layering of DESIGN.md; a new edge fails here first."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dlscale"
BASE = {"types", "errors", "__init__"}

#: Which top-level parts each part may import, besides itself and the base vocabulary.
ALLOWED: dict[str, set[str]] = {
    "types": set(),
    "errors": set(),
    "__init__": set(),
    "config": set(),
    "hardware": set(),
    # The one tensor wire codec: below everything that reads or writes tensors on the wire.
    "wire": set(),
    "backends": {"hardware", "wire"},
    "models": {"backends"},
    "serving": {"models", "backends", "hardware", "wire"},
    "frontends": {"serving", "wire"},
    "server": {"serving", "frontends"},
    "bench": {"hardware", "models", "serving", "wire"},
    "optimize": {"bench", "backends", "models"},
    "plan": {"hardware", "models", "serving"},
    "cli": {"*"},
    "demo": {"*"},
    "__main__": {"*"},
}


def _part(module_path: Path) -> str:
    rel = module_path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imported_parts(path: Path) -> set[tuple[str, int]]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = path.relative_to(PACKAGE).parts[: -node.level]
                names = [".".join(("dlscale", *pkg, node.module or ""))]
            elif node.module:
                names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "dlscale":
                found.add((parts[1] if len(parts) > 1 else "__init__", node.lineno))
    return found


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_imports_follow_the_layering(path: Path) -> None:
    if "grpc_gen" in path.parts:
        return  # generated stubs import only protobuf and grpc
    part = _part(path)
    assert part in ALLOWED, f"{part} is a new top-level part: add its layer to DESIGN and here"
    allowed = ALLOWED[part]
    bad = [
        f"line {line}: imports dlscale.{target}"
        for target, line in sorted(_imported_parts(path))
        if target != part and target not in BASE and "*" not in allowed and target not in allowed
    ]
    assert not bad, f"{path.relative_to(PACKAGE)} ({part}) breaks the layering: {bad}"


def test_the_walk_sees_a_forbidden_edge(tmp_path: Path) -> None:
    # The checker itself must catch an edge, or every test above passes vacuously.
    module = PACKAGE / "hardware" / "_probe_for_test.py"
    module.write_text("from dlscale.serving import manager\n")
    try:
        assert ("serving", 1) in _imported_parts(module)
        assert "serving" not in ALLOWED[_part(module)]
    finally:
        module.unlink()
