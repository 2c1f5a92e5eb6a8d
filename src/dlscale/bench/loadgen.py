"""LoadGen adapters: the query sample library and the system under test, bridged to asyncio.

LoadGen calls `issue_queries` on threads of its own and blocks the caller of StartTest. The
target lives on an asyncio loop in a dedicated thread (`LoopThread`); issued queries cross over
with `call_soon_threadsafe`, and each completion calls `QuerySamplesComplete` from that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import mlperf_loadgen as lg
import numpy as np

from dlscale.bench.data import SampleSet
from dlscale.bench.scenarios import RunSettings, Scenario
from dlscale.bench.targets import ModelInfo, Target

T = TypeVar("T")
#: First error messages kept for the report; later ones are only counted.
KEPT_ERRORS = 5


class LoopThread:
    """An asyncio event loop running in a thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="bench-loop", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the loop and wait for its result here."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        """Stop the loop and join its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


@dataclass
class Recorder:
    """What one run observed, written by the loop thread and read by the progress line."""

    start_ns: int = field(default_factory=time.perf_counter_ns)
    issued: int = 0
    completed: int = 0
    #: LoadGen's latency of each sample: from its query's issue to its completion.
    latencies_ns: list[int] = field(default_factory=list)
    #: Each request's time on the wire: from sending it to its answer (the sweep's latency).
    request_ns: list[int] = field(default_factory=list)
    last_done_ns: int = 0
    errors: int = 0
    first_errors: list[str] = field(default_factory=list)
    #: Accuracy runs: each sample's outputs, by QSL index.
    outputs: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)

    def error(self, message: str, samples: int) -> None:
        """Count failed samples, keeping the first few messages."""
        self.errors += samples
        if len(self.first_errors) < KEPT_ERRORS:
            self.first_errors.append(message)

    def throughput(self) -> float | None:
        """Completed samples per second, from the first issue to the last completion."""
        span = (self.last_done_ns - self.start_ns) / 1e9
        return self.completed / span if self.completed and span > 0 else None


class LoadGenSut(Protocol):
    """What LoadGen calls: this process's SUT, the worker pool's or the generative bench's."""

    def issue_queries(self, queries: list[Any]) -> None: ...

    def flush_queries(self) -> None: ...


#: A query's LoadGen id and its sample's index in the query sample library.
Item = tuple[int, int]


@dataclass(frozen=True)
class Exchange:
    """One request's fate: each sample's outputs (empty on failure), the error, its timing."""

    per_sample: list[dict[str, np.ndarray]]
    error: str | None
    sent_ns: int
    done_ns: int


def group_queries(items: list[Item], info: ModelInfo, settings: RunSettings) -> list[list[Item]]:
    """The requests issued queries become: Offline in batches, MultiStream whole, else one each."""
    scenario = settings.scenario
    if scenario is Scenario.OFFLINE:
        size = info.batch_limit(settings.batch_size)
        return [items[i : i + size] for i in range(0, len(items), size)]
    if scenario is Scenario.MULTISTREAM and info.batch_limit(len(items)) == len(items):
        return [items]
    return [[item] for item in items]


async def exchange(
    target: Target, info: ModelInfo, samples: SampleSet, items: list[Item]
) -> Exchange:
    """Send one request for `items` and split its answer per sample; failures are counted."""
    indices = [index for _, index in items]
    sent_ns = time.perf_counter_ns()
    try:
        outputs = await target.infer(samples.request(info.batched, indices))
        if info.batched:
            per_sample = [{n: a[i] for n, a in outputs.items()} for i in range(len(items))]
        else:
            per_sample = [outputs]
    except Exception as exc:  # any failure is the target's: count it, never stall LoadGen
        return Exchange([], f"{type(exc).__name__}: {exc}", sent_ns, time.perf_counter_ns())
    return Exchange(per_sample, None, sent_ns, time.perf_counter_ns())


def complete(
    recorder: Recorder, items: list[Item], done: Exchange, issued_ns: int, accuracy: bool
) -> None:
    """Record one request's samples and tell LoadGen they are complete (each exactly once)."""
    rec = recorder
    if done.error is not None:
        rec.error(done.error, len(items))
    rec.last_done_ns = max(rec.last_done_ns, done.done_ns)
    rec.completed += len(items)
    rec.latencies_ns.extend([done.done_ns - issued_ns] * len(items))
    rec.request_ns.append(done.done_ns - done.sent_ns)
    keep: list[np.ndarray] = []
    responses = []
    for n, (query_id, index) in enumerate(items):
        if accuracy and done.per_sample:
            rec.outputs[index] = done.per_sample[n]
            # The first output's bytes go to LoadGen's accuracy log, as MLPerf SUTs do.
            first = np.ascontiguousarray(next(iter(done.per_sample[n].values())))
            keep.append(first)
            ptr = first.__array_interface__["data"][0]
            responses.append(lg.QuerySampleResponse(query_id, ptr, first.nbytes))
        else:
            responses.append(lg.QuerySampleResponse(query_id, 0, 0))
    lg.QuerySamplesComplete(responses)


class SystemUnderTest:
    """LoadGen's SUT in this process: sends each issued query to the target on the bench's loop."""

    def __init__(
        self,
        target: Target,
        info: ModelInfo,
        samples: SampleSet,
        settings: RunSettings,
        loop: LoopThread,
        recorder: Recorder,
    ) -> None:
        self.target = target
        self.info = info
        self.samples = samples
        self.settings = settings
        self.loop = loop
        self.recorder = recorder
        self._tasks: set[asyncio.Task[None]] = set()
        self._limit: asyncio.Semaphore | None = None

    def issue_queries(self, queries: list[Any]) -> None:
        """LoadGen's callback (its thread): hand the queries to the event loop."""
        issued_ns = time.perf_counter_ns()
        items = [(q.id, q.index) for q in queries]
        self.loop.loop.call_soon_threadsafe(self._dispatch, items, issued_ns)

    def flush_queries(self) -> None:
        """LoadGen's flush callback: nothing is held back, so nothing to flush."""

    def close(self) -> None:
        """After the run: every task has completed (LoadGen waited for them), nothing to stop."""

    # -- on the event loop -----------------------------------------------------------------------

    def _dispatch(self, items: list[Item], issued_ns: int) -> None:
        self.recorder.issued += len(items)
        if self.settings.scenario is Scenario.OFFLINE and self.settings.concurrency:
            self._limit = self._limit or asyncio.Semaphore(self.settings.concurrency)
        for group in group_queries(items, self.info, self.settings):
            task = asyncio.get_running_loop().create_task(self._send(group, issued_ns))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, items: list[Item], issued_ns: int) -> None:
        async with self._limit or contextlib.nullcontext():
            done = await exchange(self.target, self.info, self.samples, items)
        complete(self.recorder, items, done, issued_ns, self.settings.accuracy)


def run_loadgen(sut_impl: LoadGenSut, count: int, settings: RunSettings, log_dir: Path) -> None:
    """One LoadGen test over `count` samples (blocking this thread); its logs go to `log_dir`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    output = lg.LogOutputSettings()
    output.outdir = str(log_dir)
    output.copy_summary_to_stdout = False
    log_settings = lg.LogSettings()
    log_settings.log_output = output
    log_settings.enable_trace = False
    sut = lg.ConstructSUT(sut_impl.issue_queries, sut_impl.flush_queries)
    qsl = lg.ConstructQSL(count, count, _noop, _noop)
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings.to_loadgen(count), log_settings)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)


def _noop(_indices: list[int]) -> None:
    """Samples live in memory from the start: loading and unloading them is free."""
