"""The `dlscale` verbs' arguments, one module per verb group; cli.py assembles them and parses.

Each verb names its handler lazily, beside what it drives (`dlscale.<part>.commands`), so that
parsing imports no handler module and `dlscale -h` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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


def positive_int(text: str) -> int:
    """A count of 1 or more (a batch, rows, runs)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number, 1 or more")
    return int(text)


def positive_seconds(text: str) -> float:
    """Seconds above 0 (not NaN, not infinite)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds above 0")
    return value


def output_file(text: str) -> Path:
    """A file a verb writes when its work is done: its folder is checked as the flag is read,
    so that a mistyped folder fails at once rather than as a traceback after the work."""
    # Here, not at the top: server_settings imports the serving core, which `dlscale -h` need not.
    from dlscale.server_settings.fields import unwritable

    path = Path(text).expanduser()
    if why := unwritable(path):
        raise argparse.ArgumentTypeError(f"cannot write {text}: {why}")
    return path


def output_folder(text: str) -> Path:
    """A folder a verb writes into (made if missing): refused if it, or the nearest part of it
    that exists, is not a folder."""
    path = Path(text).expanduser()
    there = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if there.exists() and not there.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write into {text}: {there} is not a folder")
    return path


# A string: argparse._SubParsersAction cannot be subscripted at run time on Python 3.11.
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
