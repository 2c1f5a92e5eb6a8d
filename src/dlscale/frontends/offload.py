"""Decoding large requests off the event loop, so that one big body never stalls the others.

A thread still shares the GIL, but the interpreter switches threads every few milliseconds,
so health checks and small requests keep being answered while a large body is parsed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
#: Requests larger than this (bytes in a body, or for gRPC also elements declared, 4 bytes
#: each) are decoded off the event loop, so that the loop keeps answering.
OFF_LOOP_BYTES = 256 * 2**10


async def off_loop(large: bool, decode: Callable[..., T], *args: Any) -> T:
    """`decode(*args)`: in a worker thread when `large`, else right here (a thread costs ~50 µs)."""
    if not large:
        return decode(*args)
    return await asyncio.to_thread(decode, *args)
