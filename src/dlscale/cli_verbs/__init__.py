"""The `dlscale` verbs' arguments, one module per verb group; cli.py assembles them and parses.

Each verb names its handler lazily, beside what it drives (`dlscale.<part>.commands`), so that
parsing imports no handler module and `dlscale -h` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

#: Each verb group registers its sub-parsers here; the parser's `func` does the work.
Handler = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class LazyHandler:
    """A verb's handler, named by module and function and imported only when the verb runs.

    Parsing imports no handler module, so `dlscale -h` stays fast.
    """

    module: str
    name: str

    def resolve(self) -> Handler:
        """The handler function itself."""
        handler: Handler = getattr(importlib.import_module(self.module), self.name)
        return handler

    def __call__(self, args: argparse.Namespace) -> int:
        return self.resolve()(args)


# A string: argparse._SubParsersAction cannot be subscripted at run time on Python 3.11.
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
