"""Request bodies received in place: one buffer per body, sized from Content-Length, filled by
the socket itself.

The connection (transport.py) reads a request's head through httptools; once the head says how
long the body is, the rest of the body is read by the socket straight into one buffer of that
length (asyncio's BufferedProtocol), so the bytes the codec and the backend read are the ones
the kernel wrote: no chunk list, no join. Only what arrived with the head (one read, at most
`HEAD_READ` bytes) passes through the parser and is copied once. A body without a length
(chunked) grows a bytearray as before.

Large buffers come from `BodyBuffers`, a pool that reuses a buffer once nothing refers to it any
more (no array, view or pending write): reuse saves the page faults of fresh memory and, on a
CUDA server, the page-locking, which lets the torch backend copy inputs to the device by DMA
straight from the body.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from dlscale.serving.regions import cuda as cuda_memory
from dlscale.wire.segments import address
from dlscale.wire.tensors import Buffer

log = logging.getLogger("dlscale.http")

#: Bytes read at once while a head (or a body without a length) is parsed.
HEAD_READ = 64 * 1024
#: Bodies at least this long take a pooled buffer; shorter ones a fresh one.
POOLED_FROM = 256 * 1024
_ROUND = 1 << 20  # pooled capacities are whole MiB, so that similar sizes share buffers

Allocate = Callable[[int], np.ndarray]


class BodyBuffers:
    """Reusable receive buffers for large bodies, page-locked when a CUDA device reads them.

    A buffer is reused when only the pool refers to it. Idle buffers beyond `keep_bytes` are
    dropped; busy ones never are (the pool grows with the bodies in flight).
    """

    def __init__(
        self, page_lock: bool = False, keep_bytes: int = 512 << 20, allocate: Allocate | None = None
    ) -> None:
        self.page_lock = page_lock
        self.keep_bytes = keep_bytes
        self._allocate = allocate or (lambda size: np.empty(size, np.uint8))
        self._buffers: list[np.ndarray] = []

    def take(self, size: int) -> np.ndarray:
        """A writable uint8 array of exactly `size` bytes, idle until the caller lets it go."""
        if size < POOLED_FROM:
            return np.empty(size, np.uint8)
        for buffer in self._buffers:
            # A pooled buffer no array refers to: the pool, this loop and the call hold it.
            if size <= buffer.size <= 2 * size and sys.getrefcount(buffer) == 3:
                return buffer[:size]
        capacity = -(-size // _ROUND) * _ROUND
        buffer = self._allocate(capacity)
        if self.page_lock:
            self._lock_pages(buffer)
        self._buffers.append(buffer)
        self._trim()
        return buffer[:size]

    @property
    def held_bytes(self) -> int:
        """Capacity of every pooled buffer, busy or idle."""
        return sum(b.size for b in self._buffers)

    def close(self) -> None:
        """Drop every idle buffer (busy ones go when their last user lets them go)."""
        self._trim(keep=0)

    def _trim(self, keep: int | None = None) -> None:
        budget = self.keep_bytes if keep is None else keep
        held = self.held_bytes
        for buffer in sorted(self._buffers, key=lambda b: -b.size):
            if held <= budget:
                return
            # Held by the pool's list, the sorted list, this loop and the call.
            if sys.getrefcount(buffer) == 4:
                # By identity: list.remove would compare arrays with ==.
                self._buffers = [b for b in self._buffers if b is not buffer]
                held -= buffer.size
                if self.page_lock:
                    cuda_memory.page_unlock(address(buffer))

    def _lock_pages(self, buffer: np.ndarray) -> None:
        try:
            cuda_memory.page_lock(address(buffer), buffer.size)
        except Exception as exc:  # still a good buffer: its copy to the device goes via staging
            log.warning("a body buffer cannot be page-locked (%s); not page-locking any", exc)
            self.page_lock = False


class Body:
    """One request's body as it arrives: into a buffer of its declared length, or a growing one."""

    def __init__(self, buffer: np.ndarray | None) -> None:
        flat: Any = buffer  # numpy arrays are buffers, though numpy's stubs do not say so
        self._view = memoryview(flat) if buffer is not None else None
        self._filled = 0
        self._chunks = bytearray() if buffer is None else None

    @classmethod
    def declared(cls, buffers: BodyBuffers, length: int) -> Body:
        """A body of `length` bytes (Content-Length), received into one buffer."""
        return cls(buffers.take(length))

    @classmethod
    def chunked(cls) -> Body:
        """A body of unknown length (chunked), gathered as it comes."""
        return cls(None)

    @property
    def missing(self) -> int:
        """Bytes of a declared body still to come (0 for a chunked one)."""
        return 0 if self._view is None else len(self._view) - self._filled

    def add(self, chunk: bytes) -> None:
        """Bytes the parser read along with the head: copied in."""
        if self._view is None:
            assert self._chunks is not None
            self._chunks += chunk
            return
        end = self._filled + len(chunk)
        self._view[self._filled : end] = chunk
        self._filled = end

    def space(self) -> memoryview:
        """Where the socket writes the next bytes of a declared body."""
        assert self._view is not None
        return self._view[self._filled :]

    def received(self, nbytes: int) -> bool:
        """The socket wrote `nbytes` into `space()`; True once the body is whole."""
        self._filled += nbytes
        return self.missing == 0

    def finish(self) -> Buffer:
        """The whole body, without a copy."""
        if self._view is None:
            assert self._chunks is not None
            return self._chunks
        return self._view[: self._filled]
