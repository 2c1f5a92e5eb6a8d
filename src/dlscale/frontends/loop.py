"""The event loop every serving process runs on: uvloop where installed, else asyncio's."""

from __future__ import annotations

import asyncio
import gc


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop when it is installed."""
    try:
        import uvloop  # measured about 5% more throughput than asyncio's loop (docs/decisions.md)
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def freeze_survivors() -> None:
    """Hide every object alive now from the cyclic collector, once the models are loaded.

    What a serving process makes while it starts (modules, models, sessions: hundreds of
    thousands of objects) lives as long as it does; without this, each full collection walks
    them all again, and the small-request path paid about a tenth of its time there (py-spy,
    benchmarks/profile_large.py --small). Python's own advice for long-lived servers.
    """
    gc.collect()
    gc.freeze()
