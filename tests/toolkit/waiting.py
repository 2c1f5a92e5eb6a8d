"""Waiting in a test for a state the server reaches by itself, with a safety net, not a speed."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

#: How long a test waits at most for a state on a loaded machine: a hang fails, never blocks.
PATIENCE_S = 60.0


def until(condition: Callable[[], bool], patience_s: float = PATIENCE_S) -> None:
    """Return once `condition()` holds; fail the test if it does not within `patience_s`."""
    deadline = time.monotonic() + patience_s
    while not condition():
        assert time.monotonic() < deadline, "the server never reached the state awaited"
        time.sleep(0.01)


def process_gone(pid: int) -> bool:
    """Whether process `pid` has exited (gone, or a zombie its parent has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return True
