"""The Plane of a REST worker process: every call forwarded to the process that owns the models.

The owner answers with its own plane (frontends/workers/host.py), so health, metadata,
statistics, the repository and the shared-memory registry read the same whichever process a client
reached. Every Plane method is forwarded over the asynchronous channel (`RemotePlane.ask`, which
the frontends' view, frontends/plane.py's `Asked`, uses for the synchronous ones), with inputs
that lie in this worker's shared-memory segments sent in place (wire/channel.py); the event
loop never waits on the owner. The forwards are built from `PLANE_METHODS`, not written per
method. The registry's operations, synchronous in the extensions' routes, go over their own
blocking channel, and the REST API runs them off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import socket
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from dlscale.errors import DlscaleError, Unavailable
from dlscale.frontends.plane import PLANE_METHODS, REGISTRY_METHODS, Plane, PlaneMethod
from dlscale.frontends.workers import messages as ipc
from dlscale.serving.regions.registry import SharedMemoryRegistry
from dlscale.types import InferenceRequest, InferenceResponse
from dlscale.wire import channel
from dlscale.wire.segments import Segments

GONE = "the server is stopping (its model process is gone)"
#: The health methods a gone owner answers with False (neither live nor ready) rather than GONE.
HEALTH = ("live", "ready")


class Calls:
    """Blocking calls to the owner, one at a time, over their own socket (off the event loop)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self._sock = sock
        self._lock = threading.Lock()

    def __call__(self, method: str, *args: Any) -> Any:
        """The owner's answer to `method(*args)`, or its error raised here."""
        with self._lock:
            try:
                self._sock.sendall(b"".join(channel.encode(ipc.PlaneCall(method, args))))
                reply = channel.expect(ipc.Reply, channel.read_blocking(self._sock))
            except OSError:
                raise Unavailable(GONE) from None
        if not reply.ok:
            raise reply.value
        return reply.value

    def close(self) -> None:
        """Close the socket (the owner's side ends)."""
        self._sock.close()


class ForwardedRegistry(SharedMemoryRegistry):
    """The owner's shared-memory registry, seen from a worker: one namespace for all processes.

    Each operation the extensions' routes make (`REGISTRY_METHODS`) is the owner's, asked over
    the blocking channel; the forwards are built from that list (`_registry_forward`)."""

    def __init__(self, calls: Calls, enabled: bool, max_regions: int) -> None:
        super().__init__(enabled, max_regions)
        self._calls = calls


class RemotePlane:
    """A Plane whose every call the owner answers (see the module's docstring)."""

    def __init__(self, calls: Calls, segments: Segments, allow_shm: bool, max_regions: int) -> None:
        self._calls = calls
        self.segments = segments
        self.shared_memory: SharedMemoryRegistry = ForwardedRegistry(calls, allow_shm, max_regions)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        #: Open streams' responses (`ipc.Part`), each ended by its call's `ipc.Reply`.
        self._streams: dict[int, asyncio.Queue[ipc.Part | ipc.Reply]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        #: Set when the owner closed the channel (it stopped or died): the worker stops too.
        self.gone = asyncio.Event()

    def as_plane(self) -> Plane:
        """This proxy as the frontends' Plane (its forwards are built from PLANE_METHODS)."""
        return cast(Plane, self)

    async def connect(self, sock: socket.socket) -> None:
        """Open the asynchronous channel and start reading the owner's answers."""
        reader, self._writer = await asyncio.open_unix_connection(sock=sock)
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))

    async def announce(self, port: int) -> None:
        """Tell the owner this worker listens (on `port`)."""
        assert self._writer is not None
        self._writer.writelines(channel.encode(ipc.Listening(port)))
        await self._writer.drain()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                reply = await channel.read(reader, self.segments.view)
                if isinstance(reply, ipc.Part | ipc.Reply) and reply.ident in self._streams:
                    self._streams[reply.ident].put_nowait(reply)
                    continue
                if isinstance(reply, ipc.Part):
                    continue  # sent before the owner read this worker's Cancel: dropped
                reply = channel.expect(ipc.Reply, reply)
                future = self._pending.pop(reply.ident, None)
                if future is None or future.done():
                    continue
                if reply.ok:
                    future.set_result(reply.value)
                else:
                    future.set_exception(reply.value)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(Unavailable(GONE))
            self._pending.clear()
            for ident, stream in self._streams.items():
                stream.put_nowait(ipc.Reply(ident, False, Unavailable(GONE)))
            self.gone.set()

    async def ask(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The owner's answer to Plane method `method` (it refuses any other name); inference
        inputs travel in place."""
        if self.gone.is_set() and method in HEALTH:
            return False
        if self._writer is None or self.gone.is_set():
            raise Unavailable(GONE)
        request = args[0] if method == "infer" and args else None
        space = self._space(request) if isinstance(request, InferenceRequest) else None
        ident = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        await self._send(ipc.PlaneCall(method, args, kwargs, ident, space))
        return await future

    async def ask_stream(self, method: str, *args: Any) -> AsyncIterator[Any]:
        """The owner's responses to stream method `method`; closing it early (the client
        left) tells the owner, which closes its stream and frees the sequence."""
        if self._writer is None or self.gone.is_set():
            raise Unavailable(GONE)
        ident = next(self._ids)
        stream: asyncio.Queue[ipc.Part | ipc.Reply] = asyncio.Queue()
        self._streams[ident] = stream
        ended = False
        try:
            await self._send(ipc.PlaneCall(method, args, {}, ident))
            while True:
                message = await stream.get()
                if isinstance(message, ipc.Part):
                    yield message.value
                    continue
                ended = True
                if not message.ok:
                    raise message.value
                return
        finally:
            del self._streams[ident]
            if not ended and not self.gone.is_set():
                with contextlib.suppress(Unavailable):
                    await self._send(ipc.Cancel(ident))

    async def _send(self, message: ipc.PlaneCall | ipc.Cancel) -> None:
        """Write one message to the owner; its segments dropped since the last call go along."""
        assert self._writer is not None
        if isinstance(message, ipc.PlaneCall):
            dropped, self.segments.dropped = tuple(self.segments.dropped), []
            message = dataclasses.replace(message, dropped=dropped)
        try:
            self._writer.writelines(channel.encode(message, self.segments.locate))
            await self._writer.drain()
        except ConnectionError:
            raise Unavailable(GONE) from None

    def refuse_early(self, name: str, version: str = "") -> DlscaleError | None:
        """None: a round trip per request would cost more than it saves; the owner refuses."""
        return None

    def _space(self, request: InferenceRequest) -> channel.Descriptor | None:
        """The body segment of a request, where the owner may write its outputs back."""
        for array in request.inputs.values():
            if array.nbytes >= channel.OUT_OF_BAND_BYTES and array.dtype != object:
                spot = self.segments.locate(array)
                segment = self.segments.segment(spot[0]) if spot is not None else None
                if segment is not None and spot is not None:
                    return spot[0], 0, segment.nbytes
        return None

    async def close(self) -> None:
        """Close both channels."""
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
        self._calls.close()


def _forward(method: PlaneMethod) -> Callable[..., Any]:
    """RemotePlane's method `method`: awaited over the asynchronous channel.

    A synchronous method called directly (not through frontends/plane.py's `Asked`) goes over
    the blocking channel instead; the frontends never do so.
    """
    name = method.name
    if method.stream:

        def forward_stream(self: RemotePlane, *args: Any) -> AsyncIterator[InferenceResponse]:
            return self.ask_stream(name, *args)

        forward_stream.__name__ = name
        return forward_stream
    if method.asynchronous:

        async def forward_async(self: RemotePlane, *args: Any, **kwargs: Any) -> Any:
            return await self.ask(name, *args, **kwargs)

        forward_async.__name__ = name
        return forward_async

    def forward(self: RemotePlane, *args: Any) -> Any:
        try:
            return self._calls(name, *args)
        except Unavailable:
            if name in HEALTH:
                return False
            raise

    forward.__name__ = name
    return forward


for _method in PLANE_METHODS:
    if _method.forwarded:
        setattr(RemotePlane, _method.name, _forward(_method))


def _registry_forward(name: str) -> Any:
    """ForwardedRegistry's operation `name`: the owner's answer (a property where the
    registry's own is one: `cuda_ready`)."""
    asked = f"registry.{name}"

    def forward(self: ForwardedRegistry, *args: Any) -> Any:
        return self._calls(asked, *args)

    forward.__name__ = name
    own = getattr(SharedMemoryRegistry, name)
    return property(forward) if isinstance(own, property) else forward


for _name in REGISTRY_METHODS:
    setattr(ForwardedRegistry, _name, _registry_forward(_name))
