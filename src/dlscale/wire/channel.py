"""The one transport between the server's processes: typed messages, tensors out of band.

Every channel between the server's processes (REST workers, Python model workers) carries frozen
dataclasses, pickled with protocol 5. Buffers of at least OUT_OF_BAND_BYTES (numpy arrays' data)
travel out of band when the sender can place them in shared memory: the frame then carries their
descriptors (segment key, offset, size) and the receiver resolves each to the bytes it names.
The segments are the server's own (wire/segments.py: named by its one rule, refused by the region
registry). Every other buffer is pickled in band. The frame: FRAME (payload and descriptor
lengths), the pickled descriptors, the pickled payload. Both ends are this server's own processes
over a socketpair or a pipe, so unpickling trusts its peer as the process trusts itself.

Errors cross as themselves (`portable`): a DlscaleError keeps its class, its message and its
attributes (a user traceback); one that does not survive pickling becomes a DlscaleError of its
text.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from dlscale.errors import DlscaleError

FRAME = struct.Struct("<QI")
#: Buffers at least this long are sent out of band when the sender can place them, by default:
#: a REST worker's body is read in place only where that beats pickling it. A Python model's pipe
#: places every numeric tensor (`min_bytes=1`): its pipe then carries only their descriptors.
OUT_OF_BAND_BYTES = 64 * 1024
#: (segment key, offset, size) of a buffer in shared memory.
Descriptor = tuple[str, int, int]
#: Where an out-of-band buffer goes: its descriptor, or None to pickle it in band.
Place = Callable[[memoryview], Descriptor | None]
#: The bytes a descriptor names, on the receiving side.
Resolve = Callable[[Descriptor], memoryview]
M = TypeVar("M")


def expect(kind: type[M], message: object) -> M:
    """`message` when it is a `kind`; a peer that sends anything else breaks the channel."""
    if not isinstance(message, kind):
        raise ConnectionError(f"expected a {kind.__name__} message, got {type(message).__name__}")
    return message


def portable(exc: BaseException) -> BaseException:
    """The error itself when it survives pickling, else a DlscaleError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return DlscaleError(str(exc))
    return exc


def encode(
    message: Any, place: Place | None = None, min_bytes: int = OUT_OF_BAND_BYTES
) -> list[bytes]:
    """The frame of `message`; `place` puts buffers of at least `min_bytes` in shared memory
    (None: all in band)."""
    descriptors: list[Descriptor] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        spot = place(raw) if place is not None and raw.nbytes >= min_bytes else None
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


def send(
    conn: Connection, message: Any, place: Place | None = None, min_bytes: int = OUT_OF_BAND_BYTES
) -> None:
    """Send `message` over a pipe as one frame (`encode`)."""
    conn.send_bytes(b"".join(encode(message, place, min_bytes)))


def receive(conn: Connection, resolve: Resolve | None = None) -> Any:
    """The next message on a pipe (EOFError when the peer is gone)."""
    frame = conn.recv_bytes()
    size, meta_size = FRAME.unpack_from(frame)
    start = FRAME.size + meta_size
    if start + size != len(frame):
        raise ConnectionError("a frame whose lengths do not match its size")
    return decode(frame[FRAME.size : start], frame[start:], resolve)


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
