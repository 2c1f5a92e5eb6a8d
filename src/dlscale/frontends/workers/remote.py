"""The Plane of a REST worker process: every call forwarded to the process that owns the models.

The owner answers with its own DataPlane (frontends/workers/host.py), so health, metadata,
statistics, the repository and the shared-memory registry read the same whichever process a client
reached. Synchronous methods are blocking calls over their own channel: they are short, and the REST
routes call them synchronously. Inference and model control go over the asynchronous channel, with
inputs that lie in this worker's shared-memory segments sent in place
(frontends/workers/messages.py).
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
from collections.abc import Mapping
from typing import Any

from dlscale.errors import DlscaleError, Unavailable
from dlscale.frontends.workers import messages as ipc
from dlscale.serving.regions.registry import RegionKind, RegionStatus, SharedMemoryRegistry
from dlscale.types import (
    InferenceRequest,
    InferenceResponse,
    ModelConfigView,
    ModelMetadata,
    ModelStatistics,
    RepositoryEntry,
    ServerMetadata,
    TensorSpec,
)

GONE = "the server is stopping (its model process is gone)"


class Calls:
    """Blocking calls to the owner, one at a time, over their own socket."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self._sock = sock
        self._lock = threading.Lock()

    def __call__(self, method: str, *args: Any) -> Any:
        """The owner's answer to `method(*args)`, or its error raised here."""
        with self._lock:
            try:
                self._sock.sendall(b"".join(ipc.encode((method, args))))
                ok, value = ipc.read_blocking(self._sock)
            except OSError:
                raise Unavailable(GONE) from None
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Close the socket (the owner's side ends)."""
        self._sock.close()


class ForwardedRegistry(SharedMemoryRegistry):
    """The owner's shared-memory registry, seen from a worker: one namespace for all processes."""

    def __init__(self, calls: Calls, enabled: bool, max_regions: int) -> None:
        super().__init__(enabled, max_regions)
        self._calls = calls

    @property
    def cuda_ready(self) -> bool:
        """Whether the owner can register CUDA regions."""
        return bool(self._calls("registry.cuda_ready"))

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Register in the owner."""
        self._calls("registry.register_system", name, key, offset, byte_size)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Register in the owner."""
        self._calls("registry.register_cuda", name, raw_handle, device_id, byte_size)

    def status(self, kind: RegionKind, name: str = "") -> list[RegionStatus]:
        """The owner's regions."""
        return list(self._calls("registry.status", kind, name))

    def users(self, name: str) -> int:
        """Requests holding region `name` in the owner."""
        return int(self._calls("registry.users", name))

    def unregister(self, kind: RegionKind, name: str = "") -> None:
        """Unregister in the owner."""
        self._calls("registry.unregister", kind, name)


class RemotePlane:
    """A Plane whose every call the owner answers (see the module's docstring)."""

    def __init__(
        self, calls: Calls, segments: ipc.Segments, allow_shm: bool, max_regions: int
    ) -> None:
        self._calls = calls
        self.segments = segments
        self.shared_memory: SharedMemoryRegistry = ForwardedRegistry(calls, allow_shm, max_regions)
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        #: Set when the owner closed the channel (it stopped or died): the worker stops too.
        self.gone = asyncio.Event()

    async def connect(self, sock: socket.socket) -> None:
        """Open the asynchronous channel and start reading the owner's answers."""
        reader, self._writer = await asyncio.open_unix_connection(sock=sock)
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))

    async def announce(self, port: int) -> None:
        """Tell the owner this worker listens (on `port`)."""
        assert self._writer is not None
        self._writer.writelines(ipc.encode(("listening", port)))
        await self._writer.drain()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                ident, ok, value = await ipc.read(reader, self.segments.view)
                future = self._pending.pop(ident, None)
                if future is None or future.done():
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(Unavailable(GONE))
            self._pending.clear()
            self.gone.set()

    async def _send(self, method: str, *args: Any, space: ipc.Descriptor | None = None) -> Any:
        if self._writer is None or self.gone.is_set():
            raise Unavailable(GONE)
        ident = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        dropped, self.segments.dropped = self.segments.dropped, []
        message = (ident, method, args, space, dropped)
        try:
            self._writer.writelines(ipc.encode(message, self.segments.locate))
            await self._writer.drain()
        except ConnectionError:
            raise Unavailable(GONE) from None
        return await future

    def refuse_early(self, name: str, version: str = "") -> DlscaleError | None:
        """None: a round trip per request would cost more than it saves; the owner refuses."""
        return None

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Inference in the owner; outputs come back into the body's segment when they fit."""
        response: InferenceResponse = await self._send("infer", request, space=self._space(request))
        return response

    def _space(self, request: InferenceRequest) -> ipc.Descriptor | None:
        for array in request.inputs.values():
            if array.nbytes >= ipc.OUT_OF_BAND_BYTES and array.dtype != object:
                spot = self.segments.locate(array)
                segment = self.segments.segment(spot[0]) if spot is not None else None
                if segment is not None and spot is not None:
                    return spot[0], 0, segment.nbytes
        return None

    async def load_model(
        self, name: str, parameters: Mapping[str, str | bytes] | None = None
    ) -> None:
        """Load in the owner."""
        await self._send("load_model", name, dict(parameters) if parameters else None)

    async def unload_model(self, name: str) -> None:
        """Unload in the owner."""
        await self._send("unload_model", name)

    def live(self) -> bool:
        """The owner's liveness (False when it is gone)."""
        try:
            return bool(self._calls("live"))
        except Unavailable:
            return False

    def ready(self) -> bool:
        """The owner's readiness (False when it is gone)."""
        try:
            return bool(self._calls("ready"))
        except Unavailable:
            return False

    def server_metadata(self) -> ServerMetadata:
        """The owner's."""
        value: ServerMetadata = self._calls("server_metadata")
        return value

    def model_ready(self, name: str, version: str = "") -> bool:
        """The owner's."""
        return bool(self._calls("model_ready", name, version))

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        """The owner's."""
        value: ModelMetadata = self._calls("model_metadata", name, version)
        return value

    def model_config(self, name: str, version: str = "") -> ModelConfigView:
        """The owner's."""
        value: ModelConfigView = self._calls("model_config", name, version)
        return value

    def single_input(self, name: str, version: str = "") -> tuple[TensorSpec, bool]:
        """The owner's."""
        value: tuple[TensorSpec, bool] = self._calls("single_input", name, version)
        return value

    def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        """The owner's."""
        return list(self._calls("repository_index", ready_only))

    def statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        """The owner's."""
        return list(self._calls("statistics", name, version))

    def trace_settings(
        self, model: str = "", changes: Mapping[str, Any] | None = None
    ) -> dict[str, str | list[str]]:
        """The owner's (changed there)."""
        return dict(self._calls("trace_settings", model, dict(changes) if changes else None))

    def log_settings(self, changes: Mapping[str, Any] | None = None) -> dict[str, str | bool | int]:
        """The owner's (changed there)."""
        return dict(self._calls("log_settings", dict(changes) if changes else None))

    async def close(self) -> None:
        """Close both channels."""
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
        self._calls.close()
