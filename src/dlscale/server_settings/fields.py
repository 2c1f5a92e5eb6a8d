"""A setting's field: its default, help and flags in one place (flags.py makes the flags)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Any


def setting(
    default: Any, help: str, *flags: str, convert: Callable[[Any], Any] | None = None, **arg: Any
) -> Any:
    """A field: its default, its help, its flags (dlscale's spelling first, then Triton's),
    how a parsed value becomes the field's (`convert`) and argparse's other arguments (`arg`)."""
    metadata = {"help": help, "flags": flags, "convert": convert, "arg": arg}
    return field(default=default, metadata=metadata)


def boolean(text: str) -> bool:
    """true/false, yes/no, 1/0, as Triton's flags take them."""
    value = text.strip().lower()
    if value in ("true", "yes", "1", "on"):
        return True
    if value in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def unwritable(path: Path) -> str:
    """Why no file can be written at `path`, or "": checked when a flag names the file, so that
    a mistyped folder fails then, not when the file is first written."""
    if path.is_dir():
        return "it is a folder"
    return "" if path.parent.is_dir() else f"there is no folder {path.parent}"
