"""The tests the default run leaves out for time, run by `make test-slow` (DLSCALE_SLOW_TESTS=1)."""

from __future__ import annotations

import os

import pytest

#: Whether this run includes the slowest tests.
SLOW = os.environ.get("DLSCALE_SLOW_TESTS") == "1"


def slow_only(why: str) -> pytest.MarkDecorator:
    """Skip in the default run, saying why and how to run it; `make test-slow` runs it."""
    return pytest.mark.skipif(not SLOW, reason=f"{why}: `make test-slow` (DLSCALE_SLOW_TESTS=1)")
