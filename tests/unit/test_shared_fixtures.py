"""tests/conftest.py's TOGETHER keeps each expensive session fixture on one worker: every test file
that asks for one is listed with the others that do, and every entry still names a file."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import TOGETHER, shared_set

ROOT = Path(__file__).resolve().parents[2]
#: A test's use of a shared fixture: a parameter of a test function (or of a fixture) so named.
BIG_ZOO = re.compile(r"def \w+\([^)]*\bbig_zoo\b")
RAY = re.compile(r"def \w+\([^)]*\b(deployed|cluster)\b")


def test_every_file_of_a_shared_fixture_runs_with_the_others() -> None:
    files = sorted((ROOT / "tests").rglob("test_*.py"))
    for path in files:
        relative = path.relative_to(ROOT).as_posix()
        text, listed = path.read_text(), shared_set(relative)
        if BIG_ZOO.search(text):
            assert listed == "big-zoo", f"{relative} asks for big_zoo: list it in TOGETHER"
        if relative.startswith("tests/integration/scale/") and RAY.search(text):
            assert listed == "ray", f"{relative} uses the Ray fleet: list it in TOGETHER"
    named = {p.relative_to(ROOT).as_posix() for p in files}
    for prefix in TOGETHER:
        assert any(n.startswith(prefix) for n in named), f"TOGETHER names no file: {prefix}"
