"""The owner's side of a REST worker process: its calls answered by this process's Plane.

A worker (frontends/workers/process.py) holds two channels to the owner: `requests`, asynchronous,
for every Plane method (frontends/plane.py's `PLANE_METHODS`), and `calls`, blocking on the
worker's side, for the shared-memory registry's operations (`REGISTRY_METHODS`). Only what the
declaration names is answered. Requests from a worker enter the owner's Plane like any other: the
DataPlane validates, schedules and batches them. Inputs the worker received into its shared-memory
segments are read in place here (each segment mapped once as a `SystemRegion`); large outputs are
written back into the request's own segment when they fit, else pickled in band.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

from dlscale.errors import DlscaleError
from dlscale.frontends.plane import METHODS, PLANE_METHODS, REGISTRY_METHODS, Plane
from dlscale.frontends.workers import messages as ipc
from dlscale.serving.regions.system import SystemRegion, shm_path
from dlscale.serving.streams import aclose
from dlscale.wire import channel
from dlscale.wire.segments import filling

log = logging.getLogger("dlscale.http")

#: What a worker may call over the blocking channel: the registry's operations, and the
#: synchronous Plane methods (a fallback; the frontends ask those over the asynchronous channel).
CALLS = frozenset(
    {f"registry.{name}" for name in REGISTRY_METHODS}
    | {m.name for m in PLANE_METHODS if not m.asynchronous and not m.stream}
)


class PlaneHost:
    """Answers one worker's channels from `plane` until the worker closes them."""

    def __init__(self, plane: Plane) -> None:
        self.plane = plane
        #: Set once the worker listens; its port is then in `port`.
        self.listening = asyncio.Event()
        self.port = 0
        #: Inference and model-control calls (the asynchronous methods) answered for this worker.
        self.answered = 0
        self._segments: dict[str, SystemRegion] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: Streams open for this worker, by their call's ident (a `Cancel` closes one).
        self._streams: dict[int, asyncio.Task[None]] = {}

    async def serve(self, calls: socket.socket, requests: socket.socket) -> None:
        """Serve both channels; returns when the worker is gone (exited or crashed)."""
        reader, writer = await asyncio.open_unix_connection(sock=requests)
        calls_task = asyncio.get_running_loop().create_task(self._serve_calls(calls))
        try:
            while True:
                message = await channel.read(reader, self._resolve)
                if isinstance(message, ipc.Listening):
                    self.port = message.port
                    self.listening.set()
                    continue
                if isinstance(message, ipc.Cancel):
                    if (stream := self._streams.get(message.ident)) is not None:
                        stream.cancel()  # closes the stream: the sequence is freed
                    continue
                call = channel.expect(ipc.PlaneCall, message)
                method = METHODS.get(call.method)
                answer = self._stream if method is not None and method.stream else self._answer
                task = asyncio.get_running_loop().create_task(answer(writer, call))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                if answer == self._stream:
                    self._streams[call.ident] = task
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the worker is gone (or broke the channel)
        finally:
            for stream in self._streams.values():
                stream.cancel()  # their clients went with the worker: free their sequences
            calls_task.cancel()
            writer.close()
            # Requests in flight still finish in the DataPlane; their answers have nowhere to go.
            for segment in self._segments.values():
                self.plane.shared_memory.unreserve(segment.identity)
            self._segments.clear()

    async def _answer(self, writer: asyncio.StreamWriter, call: ipc.PlaneCall) -> None:
        for key in call.dropped:
            if (segment := self._segments.pop(key, None)) is not None:
                self.plane.shared_memory.unreserve(segment.identity)
        method = METHODS.get(call.method)
        try:
            if method is None:
                raise DlscaleError(f"a worker asked for {call.method!r}")
            value = getattr(self.plane, method.name)(*call.args, **call.kwargs)
            if method.asynchronous:
                value = await value
            reply = ipc.Reply(call.ident, True, value)
        except Exception as exc:  # the worker's REST API maps it as it would here
            reply = ipc.Reply(call.ident, False, channel.portable(exc))
        if method is not None and method.asynchronous:
            self.answered += 1
        if writer.is_closing():
            return  # the worker is gone (its segments with it): the answer has nowhere to go
        space = call.space
        try:
            place = filling(self._region(space[0]).view(0, space[2]), space[0]) if space else None
        except (OSError, DlscaleError):  # the segment went with its worker: answer in band
            place = None
        with contextlib.suppress(ConnectionError):
            writer.writelines(channel.encode(reply, place))
            await writer.drain()

    async def _stream(self, writer: asyncio.StreamWriter, call: ipc.PlaneCall) -> None:
        """Send each response of a stream as a `Part`, then the `Reply` that ends it."""
        try:
            responses = getattr(self.plane, call.method)(*call.args)
            try:
                async for response in responses:
                    writer.writelines(channel.encode(ipc.Part(call.ident, response)))
                    await writer.drain()
            finally:
                await aclose(responses)
            reply = ipc.Reply(call.ident, True, None)
        except asyncio.CancelledError:
            return  # the worker's client left (Cancel) or the worker is gone: nothing to say
        except Exception as exc:
            reply = ipc.Reply(call.ident, False, channel.portable(exc))
        finally:
            self._streams.pop(call.ident, None)
        self.answered += 1
        with contextlib.suppress(ConnectionError):
            writer.writelines(channel.encode(reply))
            await writer.drain()

    async def _serve_calls(self, sock: socket.socket) -> None:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        try:
            while True:
                call = channel.expect(ipc.PlaneCall, await channel.read(reader))
                try:
                    reply = ipc.Reply(call.ident, True, self._call(call.method, call.args))
                except Exception as exc:
                    reply = ipc.Reply(call.ident, False, channel.portable(exc))
                writer.writelines(channel.encode(reply))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _call(self, method: str, args: tuple[Any, ...]) -> Any:
        if method not in CALLS:
            raise DlscaleError(f"a worker asked for {method!r}")
        owner: Any = self.plane
        if method.startswith("registry."):
            owner, method = self.plane.shared_memory, method.removeprefix("registry.")
        attribute = getattr(owner, method)
        return attribute(*args) if callable(attribute) else attribute

    def _region(self, key: str) -> SystemRegion:
        region = self._segments.get(key)
        if region is None:
            size = shm_path(key).stat().st_size
            region = self._segments[key] = SystemRegion(key, 0, size)
            self.plane.shared_memory.reserve(region.identity)  # never a client's region
        return region

    def _resolve(self, spot: channel.Descriptor) -> memoryview:
        key, offset, size = spot
        return self._region(key).view(offset, size)
