"""A model.py read as a syntax tree, nothing run: which class and methods it defines.

The server reads model.py files on its loading threads, several at once. CPython 3.11 keeps the
depth count of the syntax tree it builds in the interpreter's AST state, which its threads
share: a CI run of this project lost a Python model's load to `SystemError: AST constructor
recursion depth mismatch (before=42, after=40)` while other loads read their model.py (the
same error in threaded programs: python/cpython#106905). Every parse here takes one lock.
"""

from __future__ import annotations

import ast
import threading
from pathlib import Path

_PARSING = threading.Lock()


def syntax_tree(path: Path, source: str | None = None) -> ast.Module:
    """The tree of the model.py at `path` (or of its `source`, already read): OSError,
    SyntaxError or ValueError as `ast.parse` raises them."""
    text = path.read_text() if source is None else source
    with _PARSING:
        return ast.parse(text, str(path))


def defines_method(path: Path, cls: str, method: str) -> bool:
    """Whether the model.py at `path` gives its class `cls` a method `method`; False for a file
    that cannot be read or parsed (the load reports it, `loader.api_of`)."""
    try:
        tree = syntax_tree(path)
    except (OSError, SyntaxError, ValueError):
        return False
    return any(
        isinstance(node, ast.ClassDef)
        and node.name == cls
        and any(
            isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and f.name == method
            for f in node.body
        )
        for node in tree.body
    )
