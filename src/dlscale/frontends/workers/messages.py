"""Messages between REST worker processes and the process that owns the models.

The messages are the dataclasses below (`Listening`, `Call`, `Reply`; `Part` and `Cancel` for
streams); each is pickled (protocol 5).
Its large buffers (numpy arrays' data) travel out of band in POSIX shared memory when they already
lie there: a worker receives large request bodies into shared-memory segments (`Segments`, given to
the body pool), so an input decoded from a body is sent as (segment key, offset, size) and the owner
maps the segment as a system shared-memory region (`serving.regions.system.SystemRegion`) and reads
the tensor in place. Every other buffer is pickled in band. The frame on the socket: FRAME (payload
and descriptor lengths), the pickled descriptors, the pickled payload. Both ends are this server's
own processes over a socketpair, so unpickling trusts its peer as the process trusts itself.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import pickle
import socket
import struct
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from dlscale.serving.regions.system import shm_path
from dlscale.wire import segments

log = logging.getLogger("dlscale.http")

FRAME = struct.Struct("<QI")
#: Buffers at least this long are sent out of band when they lie in shared memory.
OUT_OF_BAND_BYTES = 64 * 1024
#: (segment key, offset, size) of a buffer in shared memory.
Descriptor = tuple[str, int, int]
#: Where an out-of-band buffer goes: its descriptor, or None to pickle it in band.
Place = Callable[[memoryview], Descriptor | None]
Resolve = Callable[[Descriptor], memoryview]
M = TypeVar("M")


@dataclass(frozen=True)
class Listening:
    """Worker to owner: the worker listens on `port` (its frontend started)."""

    port: int


@dataclass(frozen=True)
class Call:
    """Worker to owner: call a Plane method (`registry.<name>`: the shared-memory registry's).

    On the asynchronous channel `ident` pairs the reply with its call; `space` is the request's
    own body segment, where the owner may write large outputs back; `dropped` lists the segments
    the worker unlinked since its last call, which the owner unmaps.
    """

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    ident: int = 0
    space: Descriptor | None = None
    dropped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reply:
    """Owner to worker: the answer to call `ident`, or (ok False) the error it raised."""

    ident: int
    ok: bool
    value: Any


@dataclass(frozen=True)
class Part:
    """Owner to worker: one response of the stream that call `ident` opened (a Plane method
    declared `stream`); the stream ends with the call's `Reply` (ok, or the error that ended it)."""

    ident: int
    value: Any


@dataclass(frozen=True)
class Cancel:
    """Worker to owner: the client of stream `ident` left; the owner closes the stream, which
    frees the request's sequence in its engine at once."""

    ident: int


def expect(kind: type[M], message: object) -> M:
    """`message` when it is a `kind`; a peer that sends anything else breaks the channel."""
    if not isinstance(message, kind):
        raise ConnectionError(f"expected a {kind.__name__} message, got {type(message).__name__}")
    return message


def encode(message: Any, place: Place | None = None) -> list[bytes]:
    """The frame of `message`; `place` puts large buffers in shared memory (None: all in band)."""
    descriptors: list[Descriptor] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        spot = place(raw) if place is not None and raw.nbytes >= OUT_OF_BAND_BYTES else None
        if spot is None:
            return True  # in band
        descriptors.append(spot)
        return False

    payload = pickle.dumps(message, protocol=5, buffer_callback=out_of_band)
    meta = pickle.dumps(descriptors, protocol=5)
    return [FRAME.pack(len(payload), len(meta)), meta, payload]


def decode(meta: bytes, payload: bytes, resolve: Resolve | None) -> Any:
    """The message of a frame's two parts; `resolve` maps descriptors to the bytes they name."""
    descriptors: list[Descriptor] = pickle.loads(meta)
    if descriptors and resolve is None:
        raise ValueError("a message with shared-memory buffers where none are expected")
    buffers = [resolve(d) for d in descriptors] if resolve is not None else []
    return pickle.loads(payload, buffers=buffers)


async def read(reader: asyncio.StreamReader, resolve: Resolve | None = None) -> Any:
    """The next message on a stream (IncompleteReadError when the peer is gone)."""
    size, meta_size = FRAME.unpack(await reader.readexactly(FRAME.size))
    meta = await reader.readexactly(meta_size)
    return decode(meta, await reader.readexactly(size), resolve)


def read_blocking(sock: socket.socket) -> Any:
    """The next message on a blocking socket (ConnectionError when the peer is gone)."""
    size, meta_size = FRAME.unpack(_exactly(sock, FRAME.size))
    meta = _exactly(sock, meta_size)
    return decode(meta, _exactly(sock, size), None)


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the peer closed the channel")
        got += n
    return bytes(data)


def address(buffer: memoryview | np.ndarray) -> int:
    """Where a buffer's first byte lies in this process."""
    if isinstance(buffer, np.ndarray):
        return int(buffer.ctypes.data)
    return int(np.frombuffer(buffer, np.uint8).ctypes.data)


class Segments:
    """Shared-memory segments one worker creates for request bodies; unlinked when dropped.

    `allocate` is the body pool's allocator (frontends/rest/body.py): the pool reuses a segment
    once nothing refers to it, so a segment stays the worker's until its request is answered.
    Names start with `prefix`, so the owner can remove what a crashed worker left (`sweep`), and
    hold a random token, so that no one else can guess them (to register one as a region).
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        #: key -> (first address, size, the segment's array, weakly)
        self._live: dict[str, tuple[int, int, weakref.ref[np.ndarray]]] = {}
        #: Keys dropped since the owner was last told (it unmaps them).
        self.dropped: list[str] = []

    def allocate(self, size: int) -> np.ndarray:
        """A new segment of `size` bytes as a writable uint8 array."""
        # A random token makes the name unguessable: no other process can name it in a region.
        key = segments.new_name(self.prefix)
        path = shm_path(key)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        array = np.frombuffer(mapping, np.uint8)
        self._live[key] = (address(array), size, weakref.ref(array))
        weakref.finalize(array, self._drop, key, path)
        return array

    def _drop(self, key: str, path: Path) -> None:
        self._live.pop(key, None)
        path.unlink(missing_ok=True)
        self.dropped.append(key)

    def locate(self, buffer: memoryview | np.ndarray) -> Descriptor | None:
        """The descriptor of a buffer inside one of the segments, else None."""
        start = address(buffer)
        for key, (first, size, _) in self._live.items():
            if first <= start and start + buffer.nbytes <= first + size:
                return key, start - first, buffer.nbytes
        return None

    def segment(self, key: str) -> np.ndarray | None:
        """The live array of segment `key` (None once dropped)."""
        entry = self._live.get(key)
        return entry[2]() if entry is not None else None

    def view(self, spot: Descriptor) -> memoryview:
        """The bytes a descriptor names in one of these segments."""
        key, offset, size = spot
        array = self.segment(key)
        if array is None:
            raise ValueError(f"segment {key!r} is gone")
        return array[offset : offset + size].data

    def close(self) -> None:
        """Unlink every segment's name (mappings go with their last array)."""
        for key in list(self._live):
            shm_path(key).unlink(missing_ok=True)


#: Unlink the segments under a prefix (what a crashed worker left); the one rule's.
sweep = segments.sweep
