"""The event loop every serving process runs on: uvloop where installed, else asyncio's."""

from __future__ import annotations

import asyncio


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop when it is installed."""
    try:
        import uvloop  # measured about 5% more throughput than asyncio's loop (docs/decisions.md)
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
