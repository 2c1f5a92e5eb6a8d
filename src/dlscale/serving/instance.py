"""An Instance: one loaded copy of a model on one device, computing off the event loop."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, cast, overload

import numpy as np

from dlscale.backends import Backend
from dlscale.backends.base import RequestResult, RequestsBackend
from dlscale.wire import tracing

log = logging.getLogger("dlscale.serving")
T = TypeVar("T")
R = TypeVar("R")


class Instance:
    """Runs its backend in threads of its own, so that the event loop keeps serving meanwhile.

    One thread per instance keeps at most one batch in a backend at a time, which is what
    runtimes such as ONNX Runtime expect of a session tuned for intra-op parallelism. A backend
    whose capabilities, once loaded, say it takes more at once (`Capabilities.concurrency`: the
    torch backend on a GPU uploads the next batch while one computes) gets as many threads, and
    the batcher hands it as many batches.
    """

    def __init__(self, backend: Backend, name: str) -> None:
        self.backend = backend
        self.name = name
        #: Batches this instance takes at once (known once loaded).
        self.slots = 1
        #: Whether the backend takes a batch request by request (known once loaded): Triton's
        #: Python models see each request of a batch apart.
        self.takes_requests = False
        #: Batches of at most this many rows run on the event loop (`Capabilities.inline_rows`).
        self.inline_rows = 0
        #: Whether its backend's unload stops a running batch (known once loaded).
        self.stops_batches = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def call(self, func: object, *args: object) -> object:
        """Run a blocking call in this instance's thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, func, *args)  # type: ignore[arg-type]

    @overload
    async def load(self) -> None: ...
    @overload
    async def load(self, then: Callable[[Backend], T]) -> T: ...

    async def load(self, then: Callable[[Backend], T] | None = None) -> T | None:
        """Load the backend in this instance's thread (slow: files, sessions, compilation), then
        run `then(backend)` in the same trip (the warm-up: serving/warmup.py) and return it.

        Handed over from a worker thread: the first call starts the instance's thread, which
        blocks until that thread runs (a GIL hand-off), and on the event loop it stalled every
        request a little at each load on demand. Each trip to a thread costs the loop a submit
        and a callback, and on a busy host a wait for the thread's turn: one trip for the load
        and its warm-up, not three (docs/memory.md)."""

        def load_then() -> T | None:
            self.backend.load()
            return then(self.backend) if then is not None else None

        result = await asyncio.to_thread(lambda: self._executor.submit(load_then).result())
        capabilities = self.backend.capabilities
        self.slots = max(1, capabilities.concurrency)
        self.takes_requests = capabilities.takes_requests
        self.inline_rows = max(0, capabilities.inline_rows)
        self.stops_batches = capabilities.stops_batches
        if self.slots > 1:
            old = self._executor
            self._executor = ThreadPoolExecutor(
                max_workers=self.slots, thread_name_prefix=self.name
            )
            old.shutdown(wait=False)
        return result

    async def infer(
        self, inputs: Mapping[str, np.ndarray], context: contextvars.Context | None = None
    ) -> dict[str, np.ndarray]:
        """Compute one batch (in `context`, when given: a traced request's, see `_within`).

        A batch within the backend's `inline_rows` is computed here, on the event loop: the
        thread hop would cost more than the compute. Its errors reach the caller as from the
        thread, and the batcher times it the same way.
        """
        inline = self.inline_rows > 0 and _rows(inputs) <= self.inline_rows
        if not tracing.on():
            if inline:
                return self.backend.infer(inputs)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self._executor, _within(context, self.backend.infer), inputs
            )
        _trace(tracing.BACKEND_IN, inputs)
        if inline:
            outputs = self.backend.infer(inputs)
        else:
            loop = asyncio.get_running_loop()
            outputs = await loop.run_in_executor(
                self._executor, _within(context, self.backend.infer), inputs
            )
        _trace(tracing.BACKEND_OUT, outputs)
        return outputs

    async def infer_requests(
        self,
        requests: Sequence[Mapping[str, np.ndarray]],
        context: contextvars.Context | None = None,
    ) -> list[RequestResult]:
        """Compute one batch given as its requests' inputs; one result (or error) per request."""
        # The backend declared `takes_requests`, so it has the method (no probing).
        backend = cast(RequestsBackend, self.backend)
        loop = asyncio.get_running_loop()
        call = _within(context, backend.infer_requests)
        return await loop.run_in_executor(self._executor, call, requests)

    async def close(self, grace_s: float | None = None) -> None:
        """Unload the backend and stop the thread.

        The unload runs in the instance's thread, after the batch running there. When the
        backend can stop a batch (`stops_batches`) and that batch outlives `grace_s`, the unload
        is called at once from another thread: a hung model's worker is killed, and its batch
        fails. The unload itself (a model's finalize) is never cut short by the grace.
        """
        drained = asyncio.ensure_future(self.call(_nothing))
        if grace_s is not None and self.stops_batches:
            done, _ = await asyncio.wait([drained], timeout=grace_s)
            if not done:
                log.warning(
                    "instance %s: a batch outlived the unload's grace: stopping it", self.name
                )
                await asyncio.to_thread(self.backend.unload)
        await drained
        await self.call(self.backend.unload)
        self._executor.shutdown(wait=False)


def _nothing() -> None:
    """A call that returns once the instance's thread has finished what came before it."""


def _rows(inputs: Mapping[str, np.ndarray]) -> int:
    """A batch's rows: its inputs' longest first dimension (a scalar counts as one)."""
    return max((a.shape[0] if a.ndim else 1 for a in inputs.values()), default=0)


def _trace(stage: str, arrays: Mapping[str, np.ndarray]) -> None:
    for array in arrays.values():
        if isinstance(array, np.ndarray) and array.dtype != object:
            tracing.record(stage, array)


def _within(context: contextvars.Context | None, func: Callable[[T], R]) -> Callable[[T], R]:
    """`func`, run in `context` when given: a thread of the executor has a context of its own
    (run_in_executor does not carry the caller's), and a traced request's batch passes its
    own, so that the model calls made from the instance thread (BLS) continue its trace."""
    if context is None:
        return func
    return functools.partial(_run_in, context, func)


def _run_in(context: contextvars.Context, func: Callable[[T], R], arg: T) -> R:
    return context.run(func, arg)
