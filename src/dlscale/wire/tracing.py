"""Where a request's payload lies at each stage: a cheap public hook that counts copies.

Off unless a `BufferTrace` is active (`traced()`): each stage then records the memory it holds,
as address spans. The stages are `socket.in` (memory the socket wrote a request into, or, over
gRPC, the bytes gRPC handed to the decoder), `backend.in` and `backend.out` (the arrays an
instance computed on and returned), and `socket.out` (the buffers handed to the socket or to
gRPC). A stage's bytes that lie inside an earlier stage's spans were not copied on the way:
`BufferTrace.inside` measures that, so a test fails when a join or a `tobytes` comes back.
When off, `record` costs one global lookup.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

SOCKET_IN, BACKEND_IN, BACKEND_OUT, SOCKET_OUT = (
    "socket.in",
    "backend.in",
    "backend.out",
    "socket.out",
)


@dataclass(frozen=True)
class Span:
    """`size` bytes of memory from address `start`, held by `stage`."""

    stage: str
    start: int
    size: int

    def overlap(self, other: Span) -> int:
        """Bytes the two spans share."""
        low = max(self.start, other.start)
        high = min(self.start + self.size, other.start + other.size)
        return max(0, high - low)


class BufferTrace:
    """The spans recorded while active, from every thread."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()

    def add(self, stage: str, buffer: Any) -> None:
        """Record the memory of an array or a buffer (bytes, bytearray, memoryview)."""
        array = buffer if isinstance(buffer, np.ndarray) else np.frombuffer(buffer, np.uint8)
        if array.nbytes:
            start = int(array.__array_interface__["data"][0])
            with self._lock:
                self.spans.append(Span(stage, start, int(array.nbytes)))

    def of(self, stage: str) -> list[Span]:
        """The spans one stage recorded."""
        with self._lock:
            return [s for s in self.spans if s.stage == stage]

    def bytes_of(self, stage: str) -> int:
        """Bytes one stage recorded in all."""
        return sum(s.size for s in self.of(stage))

    def inside(self, stage: str, within: str) -> int:
        """Bytes of `stage` that lie inside spans of `within` (not copied in between)."""
        outer = _merged(self.of(within))
        return sum(o.overlap(s) for s in self.of(stage) for o in outer)


def _merged(spans: list[Span]) -> list[Span]:
    """The spans as disjoint ones (a byte held twice is counted once)."""
    out: list[Span] = []
    for span in sorted(spans, key=lambda s: s.start):
        if out and span.start <= out[-1].start + out[-1].size:
            last = out[-1]
            end = max(last.start + last.size, span.start + span.size)
            out[-1] = Span(last.stage, last.start, end - last.start)
        else:
            out.append(span)
    return out


#: The trace recording now, or None: `on()`, or read directly where a call per request counts.
active: BufferTrace | None = None


def on() -> bool:
    """Whether a trace is recording (to skip making views only a trace would read)."""
    return active is not None


def record(stage: str, buffer: Any) -> None:
    """Note that `stage` holds `buffer` now (nothing unless a trace is active)."""
    trace = active
    if trace is not None:
        trace.add(stage, buffer)


@contextlib.contextmanager
def traced() -> Iterator[BufferTrace]:
    """Record every stage's spans until the block ends (one trace at a time)."""
    global active
    if active is not None:
        raise RuntimeError("a buffer trace is already active")
    trace = active = BufferTrace()
    try:
        yield trace
    finally:
        active = None
