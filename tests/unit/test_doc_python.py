"""The Python the docs show compiles, and every dlscale name it imports exists: a module moved or
a function renamed fails here, not in a user's script. (The client examples of
docs/serving-*.md also run: tests/integration/test_doc_examples.py.)"""

from __future__ import annotations

import ast
import importlib

import pytest
from tests.toolkit.doc_blocks import DOCS, code_blocks

SNIPPETS = [(doc.name, text) for doc in DOCS for lang, text in code_blocks(doc) if lang == "python"]


def test_the_docs_show_python() -> None:
    # So that a fence this file misreads cannot leave it checking nothing.
    assert len(SNIPPETS) >= 20


@pytest.mark.parametrize("text", [t for _, t in SNIPPETS], ids=[d for d, _ in SNIPPETS])
def test_a_documented_snippet_compiles_and_its_imports_exist(text: str) -> None:
    # A snippet may await at its top level, as in `python -m asyncio`.
    tree = compile(text, "<doc>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dlscale"):
            module = importlib.import_module(str(node.module))
            missing = [a.name for a in node.names if not hasattr(module, a.name)]
            assert not missing, f"{node.module} has no {missing}"
