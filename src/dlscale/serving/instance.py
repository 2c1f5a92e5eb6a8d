"""An Instance: one loaded copy of a model on one device, computing off the event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast, overload

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
        #: Which batches run on the event loop (known once loaded; `InlineRows`).
        self.inline = InlineRows()
        #: Whether its backend's unload stops a running batch (known once loaded).
        self.stops_batches = False
        self._lane = Lane(name)

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
            # A backend that takes several batches at once gets a thread for each, started
            # here, off the loop, as the first one was.
            self._lane.grow(max(1, self.backend.capabilities.concurrency))
            return then(self.backend) if then is not None else None

        result = await asyncio.to_thread(self._lane.call, load_then)
        capabilities = self.backend.capabilities
        self.slots = max(1, capabilities.concurrency)
        self.takes_requests = capabilities.takes_requests
        self.inline = InlineRows(capabilities.inline_rows, capabilities.inline_measured)
        self.stops_batches = capabilities.stops_batches
        return result

    def start(
        self,
        inputs: Mapping[str, np.ndarray],
        then: Then,
        context: contextvars.Context | None = None,
    ) -> None:
        """Compute one batch (in `context`, when given: a traced request's, see `_within`), then
        call `then(outputs, None)` or `then(None, error)` on the loop: a callback, not a
        coroutine, for the batcher (a task per batch cost it more; BENCHMARKS.md, issue 39's
        third pass).

        A batch the instance's `inline` allows is computed on the event loop, at its next turn
        (as a batch's own task would have): the thread hop would cost more than the compute
        (`InlineRows`). Its errors reach `then` as from the thread, timed the same way.
        """
        traced = tracing.on()
        if traced:
            _trace(tracing.BACKEND_IN, inputs)
        rows = _rows(inputs)
        if self.inline.allows(rows):
            asyncio.get_running_loop().call_soon(self._on_loop, inputs, traced, then, context)
        else:
            call = _within(context, self.backend.infer)
            done = functools.partial(self._from_thread, rows, traced, then)
            self._lane.submit(_timed, (call, inputs), done)

    def _on_loop(
        self,
        inputs: Mapping[str, np.ndarray],
        traced: bool,
        then: Then,
        context: contextvars.Context | None,
    ) -> None:
        start = time.perf_counter()
        try:
            outputs = _within(context, self.backend.infer)(inputs)
        except BaseException as exc:  # the batch's outcome, as from the thread
            self.inline.observe_loop(time.perf_counter() - start)
            then(None, exc)
            return
        self.inline.observe_loop(time.perf_counter() - start)
        self._finish(outputs, traced, then)

    def _from_thread(
        self,
        rows: int,
        traced: bool,
        then: Then,
        timed: tuple[dict[str, np.ndarray], float, float] | None,
        error: BaseException | None,
    ) -> None:
        if timed is None:
            then(None, error)
            return
        outputs, wall, cpu = timed
        self.inline.observe_thread(rows, wall, cpu)
        self._finish(outputs, traced, then)

    @staticmethod
    def _finish(outputs: dict[str, np.ndarray], traced: bool, then: Then) -> None:
        if traced:
            _trace(tracing.BACKEND_OUT, outputs)
        then(outputs, None)

    def start_requests(
        self,
        requests: Sequence[Mapping[str, np.ndarray]],
        then: Callable[[list[RequestResult] | None, BaseException | None], None],
        context: contextvars.Context | None = None,
    ) -> None:
        """Compute one batch given as its requests' inputs, then call `then(results, None)`
        (one result or error per request) or `then(None, error)` on the loop."""
        # The backend declared `takes_requests`, so it has the method (no probing).
        backend = cast(RequestsBackend, self.backend)
        self._lane.submit(_within(context, backend.infer_requests), (requests,), then)

    async def close(self, grace_s: float | None = None) -> None:
        """Unload the backend and stop the thread.

        The unload runs in the instance's thread, after the batch running there. When the
        backend can stop a batch (`stops_batches`) and that batch outlives `grace_s`, the unload
        is called at once from another thread: a hung model's worker is killed, and its batch
        fails. The unload itself (a model's finalize) is never cut short by the grace.
        """
        if self.slots == 1 and (grace_s is None or not self.stops_batches):
            # One trip: the thread takes one call at a time, so the unload runs after the batch
            # running there without a trip to wait for it first; each eviction of a load on
            # demand paid that trip on the cold request's path (docs/memory.md).
            await self._lane.run(self.backend.unload)
            self._lane.stop()
            return
        drained = self._lane.run(_nothing)
        if grace_s is not None and self.stops_batches:
            done, _ = await asyncio.wait([drained], timeout=grace_s)
            if not done:
                log.warning(
                    "instance %s: a batch outlived the unload's grace: stopping it", self.name
                )
                await asyncio.to_thread(self.backend.unload)
        await drained
        await self._lane.run(self.backend.unload)
        self._lane.stop()


class Lane:
    """An instance's threads: each takes the next call from one queue, so a lane of one thread
    runs its calls one at a time, in the order given (the unload after the last batch).

    What `loop.run_in_executor` on a ThreadPoolExecutor does, less its machinery: no
    concurrent.futures.Future with its Condition, no future chained to it, no idle semaphore.
    Counted under callgrind, that hop cost about 119,000 instructions a call and this one
    17,000; over gRPC a batch holds one request, so each request paid it (BENCHMARKS.md, issue
    39's third pass). The threads are daemons: an instance never closed must not hold the
    interpreter at exit (the executor's joined them through a private hook).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def grow(self, threads: int) -> None:
        """Have at least `threads` threads. Starting one waits until it runs (a GIL hand-off),
        so the first starts off the loop where it can (`call` from a worker thread)."""
        while len(self._threads) < threads:
            name = f"{self.name}_{len(self._threads)}"
            thread = threading.Thread(target=self._serve, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def submit(
        self,
        func: Callable[..., T],
        args: tuple[object, ...],
        then: Callable[[T | None, BaseException | None], None],
    ) -> None:
        """`func(*args)` in a thread of the lane, then `then(result, None)` or `then(None,
        error)` on the running loop."""
        if not self._threads:
            self.grow(1)
        self._calls.put((asyncio.get_running_loop(), then, func, args))

    def run(self, func: Callable[..., T], *args: object) -> asyncio.Future[T]:
        """`func(*args)` in a thread of the lane; its outcome on the running loop's future."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self.submit(func, args, functools.partial(_settle, future))
        return future

    def call(self, func: Callable[[], T]) -> T:
        """`func()` in a thread of the lane, waited for here (a thread, not the loop)."""
        self.grow(1)
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._calls.put((None, functools.partial(_settle, done), func, ()))
        return done.result()

    def stop(self) -> None:
        """Let each thread end once the calls already given have run."""
        for _ in self._threads:
            self._calls.put(None)
        self._threads = []

    def _serve(self) -> None:
        take = self._calls.get
        while (call := take()) is not None:
            loop, then, func, args = call
            try:
                result, error = func(*args), None
            except BaseException as exc:  # the caller's to handle, as an executor's would be
                result, error = None, exc
            if loop is None:
                then(result, error)
            else:  # a loop closed (before or meanwhile) has nobody left to tell
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(then, result, error)
            del call, then, result, error  # not held while the thread waits for the next


#: What a computed batch is handed to: its outputs and None, or None and its error.
Then = Callable[[dict[str, np.ndarray] | None, BaseException | None], None]
#: A call given to a lane: the loop to answer on (None: answered in the thread), what to call
#: with the outcome, the function and its arguments.
_Call = tuple[
    asyncio.AbstractEventLoop | None,
    Callable[[Any, BaseException | None], None],
    Callable[..., Any],
    tuple[object, ...],
]


def _settle(
    future: asyncio.Future[Any] | concurrent.futures.Future[Any],
    result: object,
    error: BaseException | None,
) -> None:
    if future.done():  # its caller left
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


#: What a batch may cost to run on the event loop (seconds), as its thread's CPU when measured
#: in the thread: the order of the hop it saves, and of `Capabilities.inline_rows`' budget.
BOUND_S = 100e-6
#: The most its smoothed wall time on the loop may be: the same compute measured there costs
#: more (a 7 us Identity takes 30-65 us in a busy server: caches the loop's other work evicted,
#: the host preempting the loop's thread).
LOOP_MEAN_S = 2 * BOUND_S
#: The most wall time a batch cheap in the thread may take: the bound, and the wait for the GIL
#: after the runtime's call (the interpreter's switch interval, 5 ms by default).
THREAD_WALL_S = BOUND_S + 0.005
#: The most one batch may hold the loop, twice in a row: a busy host preempts the loop's thread
#: for hundreds of microseconds in one batch of twenty, but rarely for this long twice.
LOOP_MOST_S = 1e-3
#: The weight of each batch on the loop in the smoothed wall time (each counts at most
#: LOOP_MOST_S, so that one preemption alone does not take the mean over the bound).
SMOOTHING = 1 / 16
#: Batches measured cheap in the thread before the first batch runs on the loop.
FIRST_FAST = 8
#: The most cheap batches asked for after repeated slow turns on the loop.
MOST_FAST = 2**16
#: Batches in a row over LOOP_MOST_S on the loop that send the batches back to the thread.
SLOW_IN_A_ROW = 2
#: Batches on the loop after which a turn back to the thread counts as the host's doing, not
#: the model's: learnt again from `FIRST_FAST` cheap batches, not twice as many as last time.
LONG_TURN = 1024


class InlineRows:
    """The rows of the largest batch an instance may compute on the event loop now.

    The hop to the instance's thread and back costs a tiny model more than its compute (an ONNX
    Identity over [32, 16] computes in ~7 us; the hop costs tens of microseconds of CPU and, on
    a busy loop, up to the switch interval of waiting for the GIL). A backend that allows it
    (`Capabilities.inline_measured`) has a batch run on the loop once `FIRST_FAST` batches of at
    least its rows were cheap in the thread: the thread's CPU under `BOUND_S` (its wall time
    includes the wait for the GIL), its wall time under `THREAD_WALL_S` (a model that waits
    rather than computes stays out). On the loop, a smoothed wall time over `LOOP_MEAN_S`, or
    two batches in a row over `LOOP_MOST_S`, send them back to the thread, to be learnt again from
    twice as many when that came within `LONG_TURN` batches (docs/configuration.md, "Tiny
    batches run on the event loop").
    """

    def __init__(self, declared: int = 0, measured: bool = False) -> None:
        #: The backend's own bound (`Capabilities.inline_rows`): always kept.
        self.declared = max(0, declared)
        #: Whether the bound is learnt from measured batches too (`inline_measured`).
        self.measured = measured
        self.rows = self.declared
        self._needed = FIRST_FAST
        self._fast = 0  # thread batches measured cheap since the last turn back
        self._largest = 0  # the rows of the largest of them
        self._slow = 0  # batches in a row over LOOP_MOST_S on the loop
        self._turn = 0  # batches on the loop since the last turn back
        self._mean = 0.0  # their smoothed wall time

    def allows(self, rows: int) -> bool:
        """Whether a batch of `rows` runs on the event loop."""
        return self.rows > 0 and rows <= self.rows

    def observe_thread(self, rows: int, wall_s: float, cpu_s: float) -> None:
        """A batch of `rows` took `wall_s` in the instance's thread, `cpu_s` of its CPU."""
        if self.measured and cpu_s <= BOUND_S and wall_s <= THREAD_WALL_S:
            self._fast += 1
            self._largest = max(self._largest, rows)
            if self._fast >= self._needed:
                self.rows = max(self.declared, self._largest)

    def observe_loop(self, wall_s: float) -> None:
        """A batch took `wall_s` on the event loop."""
        if not self.measured:
            return
        self._turn += 1
        self._mean += (min(wall_s, LOOP_MOST_S) - self._mean) * SMOOTHING
        self._slow = self._slow + 1 if wall_s > LOOP_MOST_S else 0
        if self._slow >= SLOW_IN_A_ROW or self._mean > LOOP_MEAN_S:  # back to the thread
            self.rows = self.declared
            short = self._turn < LONG_TURN
            self._needed = min(self._needed * 2, MOST_FAST) if short else FIRST_FAST
            self._fast = self._largest = self._slow = self._turn = 0
            self._mean = 0.0


def _nothing() -> None:
    """A call that returns once the instance's thread has finished what came before it."""


def _rows(inputs: Mapping[str, np.ndarray]) -> int:
    """A batch's rows: its inputs' longest first dimension (a scalar counts as one)."""
    rows = 0  # a loop, not max(generator, default=0): once a batch, and the keyword costs
    for array in inputs.values():
        rows = max(rows, array.shape[0] if array.ndim else 1)
    return rows


def _timed(func: Callable[[T], R], arg: T) -> tuple[R, float, float]:
    """`func(arg)`, the seconds it took and the seconds of CPU its thread spent on it."""
    start, cpu = time.perf_counter(), time.thread_time()
    out = func(arg)
    return out, time.perf_counter() - start, time.thread_time() - cpu


def _trace(stage: str, arrays: Mapping[str, np.ndarray]) -> None:
    for array in arrays.values():
        if isinstance(array, np.ndarray) and array.dtype != object:
            tracing.record(stage, array)


def _within(context: contextvars.Context | None, func: Callable[[T], R]) -> Callable[[T], R]:
    """`func`, run in `context` when given: a lane's thread has a context of its own (not the
    caller's), and a traced request's batch passes its own, so that the model calls made from
    the instance thread (BLS) continue its trace."""
    return func if context is None else functools.partial(_run_in, context, func)


def _run_in(context: contextvars.Context, func: Callable[[T], R], arg: T) -> R:
    return context.run(func, arg)
