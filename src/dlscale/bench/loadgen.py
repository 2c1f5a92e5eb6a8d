"""LoadGen adapters: the query sample library and the system under test, bridged to asyncio.

LoadGen calls `issue_queries` on threads of its own and blocks the caller of StartTest. The
target lives on an asyncio loop in a dedicated thread (`LoopThread`); issued queries cross over
with `call_soon_threadsafe`, and each completion calls `QuerySamplesComplete` from that loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

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
    latencies_ns: list[int] = field(default_factory=list)
    first_done_ns: int = 0
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


class SystemUnderTest:
    """LoadGen's SUT: sends each issued query to the target and reports it complete."""

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

    # -- on the event loop -----------------------------------------------------------------------

    def _dispatch(self, items: list[tuple[int, int]], issued_ns: int) -> None:
        self.recorder.issued += len(items)
        scenario = self.settings.scenario
        if scenario is Scenario.OFFLINE:
            size = self.info.batch_limit(self.settings.batch_size)
            groups = [items[i : i + size] for i in range(0, len(items), size)]
            if self.settings.concurrency and self._limit is None:
                self._limit = asyncio.Semaphore(self.settings.concurrency)
        elif scenario is Scenario.MULTISTREAM and self.info.batch_limit(len(items)) == len(items):
            groups = [items]
        else:
            groups = [[item] for item in items]
        for group in groups:
            task = asyncio.get_running_loop().create_task(self._send(group, issued_ns))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, items: list[tuple[int, int]], issued_ns: int) -> None:
        if self._limit is not None:
            async with self._limit:
                await self._exchange(items, issued_ns)
        else:
            await self._exchange(items, issued_ns)

    async def _exchange(self, items: list[tuple[int, int]], issued_ns: int) -> None:
        indices = [index for _, index in items]
        per_sample: list[dict[str, np.ndarray]] = []
        try:
            if self.info.batched:
                outputs = await self.target.infer(self.samples.rows(indices))
                per_sample = [{n: a[i] for n, a in outputs.items()} for i in range(len(items))]
            else:
                outputs = await self.target.infer(self.samples.one(indices[0]))
                per_sample = [outputs]
        except Exception as exc:  # any failure is the target's: count it, never stall LoadGen
            self.recorder.error(f"{type(exc).__name__}: {exc}", len(items))
            per_sample = []
        done_ns = time.perf_counter_ns()
        self._record(items, per_sample, issued_ns, done_ns)

    def _record(
        self,
        items: list[tuple[int, int]],
        per_sample: list[dict[str, np.ndarray]],
        issued_ns: int,
        done_ns: int,
    ) -> None:
        rec = self.recorder
        rec.first_done_ns = rec.first_done_ns or done_ns
        rec.last_done_ns = done_ns
        rec.completed += len(items)
        rec.latencies_ns.extend([done_ns - issued_ns] * len(items))
        keep: list[np.ndarray] = []
        responses = []
        for n, (query_id, index) in enumerate(items):
            if self.settings.accuracy and per_sample:
                rec.outputs[index] = per_sample[n]
                # The first output's bytes go to LoadGen's accuracy log, as MLPerf SUTs do.
                first = np.ascontiguousarray(next(iter(per_sample[n].values())))
                keep.append(first)
                ptr = first.__array_interface__["data"][0]
                responses.append(lg.QuerySampleResponse(query_id, ptr, first.nbytes))
            else:
                responses.append(lg.QuerySampleResponse(query_id, 0, 0))
        lg.QuerySamplesComplete(responses)


def run_loadgen(
    target: Target,
    info: ModelInfo,
    samples: SampleSet,
    settings: RunSettings,
    loop: LoopThread,
    log_dir: Path,
    recorder: Recorder | None = None,
) -> Recorder:
    """One LoadGen test (blocking this thread); its logs go to `log_dir`."""
    recorder = recorder or Recorder()
    sut_impl = SystemUnderTest(target, info, samples, settings, loop, recorder)
    log_dir.mkdir(parents=True, exist_ok=True)
    output = lg.LogOutputSettings()
    output.outdir = str(log_dir)
    output.copy_summary_to_stdout = False
    log_settings = lg.LogSettings()
    log_settings.log_output = output
    log_settings.enable_trace = False
    count = len(samples)
    sut = lg.ConstructSUT(sut_impl.issue_queries, sut_impl.flush_queries)
    qsl = lg.ConstructQSL(count, count, _noop, _noop)
    try:
        recorder.start_ns = time.perf_counter_ns()
        lg.StartTestWithLogSettings(sut, qsl, settings.to_loadgen(count), log_settings)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    return recorder


def _noop(_indices: list[int]) -> None:
    """Samples live in memory from the start: loading and unloading them is free."""
