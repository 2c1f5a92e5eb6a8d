"""A model.py read as a syntax tree: one parse at a time across threads, and what it defines."""

from __future__ import annotations

import ast
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dlscale.backends.python import source

MODEL = """
class TritonPythonModel:
    def auto_complete_config(config):
        return config

    async def execute(self, requests):
        return []
"""


def test_parses_on_many_threads_run_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPython 3.11 shares the tree builder's depth count between threads (a CI run's load
    failed with `AST constructor recursion depth mismatch`): the loading threads' parses never
    overlap. The parse is slowed so that, unserialized, the threads would overlap."""
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    inside, most = 0, 0
    count = threading.Lock()
    real = ast.parse

    def slow_parse(*args: object, **kwargs: object) -> ast.Module:
        nonlocal inside, most
        with count:
            inside += 1
            most = max(most, inside)
        time.sleep(0.01)  # releases the GIL, as a collection's finalizer may mid-parse
        try:
            return real(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            with count:
                inside -= 1

    monkeypatch.setattr(source.ast, "parse", slow_parse)
    with ThreadPoolExecutor(4) as pool:
        trees = list(pool.map(lambda _: source.syntax_tree(path), range(16)))
    assert most == 1
    assert all(isinstance(t.body[0], ast.ClassDef) for t in trees)


@pytest.mark.parametrize(
    ("cls", "method", "defined"),
    [
        ("TritonPythonModel", "auto_complete_config", True),
        ("TritonPythonModel", "execute", True),  # async methods count
        ("TritonPythonModel", "initialize", False),
        ("Other", "execute", False),
    ],
)
def test_a_method_is_found_by_class_and_name(
    tmp_path: Path, cls: str, method: str, defined: bool
) -> None:
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    assert source.defines_method(path, cls, method) is defined


def test_an_unreadable_or_broken_file_defines_nothing(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("class TritonPythonModel(:\n")
    assert not source.defines_method(broken, "TritonPythonModel", "execute")
    assert not source.defines_method(tmp_path / "absent.py", "TritonPythonModel", "execute")
