"""The event loop every serving process runs on: uvloop where installed, else asyncio's."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable
from typing import Any


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop when it is installed."""
    try:
        import uvloop  # measured about 5% more throughput than asyncio's loop (docs/decisions.md)
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


async def done_within(awaitable: Awaitable[Any], seconds: float) -> bool:
    """Whether `awaitable` finished within `seconds` (it is cancelled when it did not): a
    client read a streamed answer in time, or the socket took more."""
    try:
        await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        return False
    return True


def freeze_survivors() -> None:
    """Hide every object alive now from the cyclic collector, once the models are loaded.

    What a serving process makes while it starts (modules, models, sessions: hundreds of
    thousands of objects) lives as long as it does; without this, each full collection walks
    them all again, and the small-request path paid about a tenth of its time there (py-spy,
    benchmarks/profile_large.py --small). Python's own advice for long-lived servers.
    """
    gc.collect()
    gc.freeze()
