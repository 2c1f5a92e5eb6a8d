"""An Instance: one loaded copy of a model on one device, computing off the event loop."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, cast

import numpy as np

from dlscale.backends import Backend
from dlscale.backends.base import RequestResult, RequestsBackend
from dlscale.serving.inline import InlineRows
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
        #: Which batches run on the event loop (known once loaded; serving/inline.py).
        self.inline = InlineRows()
        #: Whether its backend's unload stops a running batch (known once loaded).
        self.stops_batches = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def call(self, func: object, *args: object) -> object:
        """Run a blocking call in this instance's thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, func, *args)  # type: ignore[arg-type]

    async def load(self) -> None:
        """Load the backend in this instance's thread (slow: files, sessions, compilation)."""
        await self.call(self.backend.load)
        capabilities = self.backend.capabilities
        self.slots = max(1, capabilities.concurrency)
        self.takes_requests = capabilities.takes_requests
        self.inline = InlineRows(capabilities.inline_rows, capabilities.inline_measured)
        self.stops_batches = capabilities.stops_batches
        if self.slots > 1:
            old = self._executor
            self._executor = ThreadPoolExecutor(
                max_workers=self.slots, thread_name_prefix=self.name
            )
            old.shutdown(wait=False)

    async def infer(
        self, inputs: Mapping[str, np.ndarray], context: contextvars.Context | None = None
    ) -> dict[str, np.ndarray]:
        """Compute one batch (in `context`, when given: a traced request's, see `_within`).

        A batch the instance's `inline` allows is computed here, on the event loop: the thread
        hop would cost more than the compute (serving/inline.py). Its errors reach the caller
        as from the thread, and the batcher times it the same way.
        """
        traced = tracing.on()
        if traced:
            _trace(tracing.BACKEND_IN, inputs)
        rows = _rows(inputs)
        if self.inline.allows(rows):
            start = time.perf_counter()
            try:
                outputs = self.backend.infer(inputs)
            finally:
                self.inline.observe(rows, time.perf_counter() - start, on_loop=True)
        else:
            loop = asyncio.get_running_loop()
            call = _within(context, self.backend.infer)
            outputs, seconds = await loop.run_in_executor(self._executor, _timed, call, inputs)
            self.inline.observe(rows, seconds, on_loop=False)
        if traced:
            _trace(tracing.BACKEND_OUT, outputs)
        return outputs

    @property
    def inline_rows(self) -> int:
        """The rows of the largest batch computed on the event loop now (0: none)."""
        return self.inline.rows

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


def _timed(func: Callable[[T], R], arg: T) -> tuple[R, float]:
    """`func(arg)` and the seconds it took, timed in the thread that runs it."""
    start = time.perf_counter()
    return func(arg), time.perf_counter() - start


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
