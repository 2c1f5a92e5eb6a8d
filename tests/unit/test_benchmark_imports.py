"""benchmarks/ is a harness package and leaf scripts (DESIGN.md): a script imports the dlscale
package and benchmarks/harness, never another script; the harness imports no script; tests
import no part of benchmarks/ at all (they run its scripts as `python -m benchmarks.NAME`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
HARNESS = "benchmarks.harness"


def benchmark_imports(path: Path) -> list[tuple[str, int]]:
    """(module, line) for every import of benchmarks or below in the file, lazy ones too;
    `from benchmarks.harness import servers` names benchmarks.harness.servers."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "benchmarks" or node.module == HARNESS:
                found += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
            elif node.module.startswith("benchmarks."):
                found.append((node.module, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.append((f"(relative) {node.module or ''}", node.lineno))
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "benchmarks"]
            found += [(name, node.lineno) for name in names]
    return found


#: An import statement at the start of a line of a string: code a test would run in a child.
_IMPORT_IN_TEXT = re.compile(r"^\s*(?:from|import)\s+(benchmarks(?:\.\w+)*)", re.MULTILINE)


def imports_in_strings(path: Path) -> list[tuple[str, int]]:
    """(module, line) for every import of benchmarks written in a string of the file: code run
    in a child (`python -c`) imports what the walk above cannot see."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(m.group(1), node.lineno) for m in _IMPORT_IN_TEXT.finditer(node.value)]
    return found


def breaks(path: Path, root: Path = BENCHMARKS) -> list[str]:
    """The imports of a benchmarks module that the harness-and-leaves shape forbids. A script
    may be a package (benchmarks/NAME/): its own modules may import each other."""
    parts = path.relative_to(root).parts
    in_harness = parts[0] == "harness"
    own = f"benchmarks.{parts[0]}." if len(parts) > 1 and not in_harness else None
    bad = []
    for module, line in benchmark_imports(path):
        if module.startswith("(relative)"):
            bad.append(f"line {line}: a relative import; name benchmarks.harness.* in full")
        elif own is not None and module.startswith(own):
            continue
        elif not module.startswith(f"{HARNESS}."):
            what = "the harness imports a script" if in_harness else "a script imports a script"
            bad.append(f"line {line}: {what}: {module}")
    return bad


@pytest.mark.parametrize(
    "path", sorted(BENCHMARKS.rglob("*.py")), ids=lambda p: str(p.relative_to(BENCHMARKS))
)
def test_scripts_import_only_dlscale_and_the_harness(path: Path) -> None:
    bad = breaks(path)
    assert not bad, f"benchmarks/{path.relative_to(BENCHMARKS)}: {bad}"


def test_tests_import_nothing_from_benchmarks() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for module, line in benchmark_imports(path)
    ]
    assert found == []


def test_tests_run_no_benchmarks_code_in_a_child() -> None:
    # A test runs a script as its user does (`python -m benchmarks.NAME`), never code of it in a
    # string. This file's own probes are written to files for the walk, not run.
    found = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path != Path(__file__).resolve()
        for module, line in imports_in_strings(path)
    ]
    assert found == []


def test_the_walk_sees_an_import_in_a_string(tmp_path: Path) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        'CODE = """\nimport json\nfrom benchmarks.harness.torch_gpu_report import TARGETS\n"""\n'
        'ARGV = ["-m", "benchmarks.torch_gpu", "judge"]  # a command: no import\n'
    )
    assert imports_in_strings(probe) == [("benchmarks.harness.torch_gpu_report", 1)]


def test_the_walk_sees_a_script_importing_a_script(tmp_path: Path) -> None:
    (tmp_path / "harness").mkdir()
    script = tmp_path / "probe.py"
    script.write_text(
        "from benchmarks.harness import servers\nfrom benchmarks.harness.models import IDENTITY\n"
        "def f() -> None:\n    from benchmarks import run\n"
    )
    assert breaks(script, tmp_path) == ["line 4: a script imports a script: benchmarks.run"]
    helper = tmp_path / "harness" / "probe.py"
    helper.write_text("import benchmarks.shm\nfrom . import models\n")
    assert breaks(helper, tmp_path) == [
        "line 1: the harness imports a script: benchmarks.shm",
        "line 2: a relative import; name benchmarks.harness.* in full",
    ]


def test_a_script_package_may_import_its_own_modules_only(tmp_path: Path) -> None:
    package = tmp_path / "check"
    package.mkdir()
    main = package / "__main__.py"
    main.write_text("from benchmarks.check.runner import main\nfrom benchmarks.run import x\n")
    assert breaks(main, tmp_path) == ["line 2: a script imports a script: benchmarks.run"]
