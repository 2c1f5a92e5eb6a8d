"""How a model calls other models of the server (Triton's BLS), from an instance thread."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from dlscale.errors import Unavailable
from dlscale.types import InferenceRequest, InferenceResponse

#: The inference path models call other models through (the DataPlane's `infer`).
InferCall = Callable[[InferenceRequest], Coroutine[Any, Any, InferenceResponse]]


class ServerCaller:
    """A ModelCaller for backends whose models call models: from an instance thread, the call
    runs on the server's event loop (validation, batching, statistics as for any request) and
    the thread waits for its answer. Each (model, version) called is noted in `called`: the
    response cache keys the caller's answers on their loads too."""

    def __init__(
        self,
        path: Callable[[], InferCall | None],
        loop: asyncio.AbstractEventLoop,
        called: set[tuple[str, str]],
    ) -> None:
        self._path = path
        self._loop = loop
        self._called = called

    def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Infer on the server's loop; raises the request's DlscaleError."""
        call = self._path()
        if call is None:
            raise Unavailable("this server has no inference path for models to call")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:  # waiting here would stop the loop that must answer
            raise Unavailable("a model called another from the event loop; call from a thread")
        # Noted before the call: an answer computed from it is never keyed without it.
        self._called.add((request.model_name, request.model_version))
        return asyncio.run_coroutine_threadsafe(call(request), self._loop).result()
