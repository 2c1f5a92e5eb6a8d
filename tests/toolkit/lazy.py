"""A module imported on first use, not when the test file is collected.

Every pytest worker collects every test file, so a heavy import at a test file's top is paid by
each worker, whichever runs the file's tests: TensorFlow's 5-6 s, three times on `make test`'s
three workers. A test file names such a module with `lazy("tensorflow")` and uses it as usual.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule:
    """Stands for the module `name`; the first attribute read imports it."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):  # pytest's collection looks for its own marks on objects
            raise AttributeError(attribute)
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attribute)


def lazy(name: str) -> Any:
    """`name`, imported when a test first reads one of its attributes."""
    return LazyModule(name)
