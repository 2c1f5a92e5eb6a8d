"""How a model calls other models of the server (Triton's BLS), from an instance thread."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, cast

from dlscale.errors import BackendError, DlscaleError, Unavailable
from dlscale.types import InferenceRequest, InferenceResponse

#: The inference path models call other models through (the DataPlane's `infer`).
InferCall = Callable[[InferenceRequest], Coroutine[Any, Any, InferenceResponse]]
#: Every response of a called model, whichever kind it is (what `exec(decoupled=True)` reads).
StreamCall = Callable[[InferenceRequest], AsyncIterator[InferenceResponse]]
#: Responses of a called stream that may wait for the calling thread to take them.
STREAM_BUFFER = 64
_END = object()


@dataclass(frozen=True)
class CallPaths:
    """The server's paths that models call models through: one answer, or every response."""

    infer: InferCall
    answers: StreamCall


class CallRoute:
    """Where the models of one manager send their calls to other models (Triton's BLS).

    The manager takes it at construction and hands it to each load's `ServerCaller`; the plane
    that serves requests is built over the manager, so after it, and the composition root
    connects the route to that plane's paths. Until then a model's call is refused.
    """

    def __init__(self) -> None:
        self._paths: CallPaths | None = None

    def connect(self, paths: CallPaths) -> None:
        """Send the models' calls down these paths (a plane built over the same manager)."""
        self._paths = paths

    def infer(self) -> InferCall:
        """The path of a call that wants one answer."""
        return self._connected("inference").infer

    def answers(self) -> StreamCall:
        """The path of a call that reads every response."""
        return self._connected("stream").answers

    def _connected(self, kind: str) -> CallPaths:
        if self._paths is None:
            raise Unavailable(f"this server has no {kind} path for models to call")
        return self._paths


class ServerCaller:
    """A ModelCaller for backends whose models call models: from an instance thread, the call
    runs on the server's event loop (validation, batching, statistics as for any request) and
    the thread waits for its answer. Each (model, version) called is noted in `called`: the
    response cache keys the caller's answers on their loads too."""

    def __init__(
        self, route: CallRoute, loop: asyncio.AbstractEventLoop, called: set[tuple[str, str]]
    ) -> None:
        self._route = route
        self._loop = loop
        self._called = called

    def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Infer on the server's loop; raises the request's DlscaleError."""
        call = self._route.infer()
        self._check_thread(request)
        return asyncio.run_coroutine_threadsafe(call(request), self._loop).result()

    def stream(self, request: InferenceRequest) -> Iterator[InferenceResponse]:
        """The responses of a model that streams, as it sends them (Triton's
        `exec(decoupled=True)`); leaving the iterator early ends the called stream."""
        call = self._route.answers()
        self._check_thread(request)
        handed: queue.Queue[object] = queue.Queue(STREAM_BUFFER)

        async def pump() -> None:
            end: object = _END
            try:
                async for response in call(request):
                    await asyncio.to_thread(handed.put, response)  # waits for the taker
            except DlscaleError as exc:
                end = exc
            except Exception as exc:  # the taker must hear of any end
                end = BackendError(f"the stream of model {request.model_name!r} failed: {exc}")
            await asyncio.to_thread(handed.put, end)

        running = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while (item := handed.get()) is not _END:
                if isinstance(item, DlscaleError):
                    raise item
                yield cast(InferenceResponse, item)
        finally:
            running.cancel()  # the caller left early: the called stream is closed
            while not handed.empty():  # frees a put waiting for room, so its thread ends
                handed.get_nowait()

    def _check_thread(self, request: InferenceRequest) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:  # waiting here would stop the loop that must answer
            raise Unavailable("a model called another from the event loop; call from a thread")
        # Noted before the call: an answer computed from it is never keyed without it.
        self._called.add((request.model_name, request.model_version))
