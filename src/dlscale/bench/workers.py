"""Worker processes that send, receive and check a run's requests while LoadGen issues here.

LoadGen issues queries and keeps its accounts in this process (`PoolSut`). Each worker process
opens its own client to the target, makes the same samples (the same function, data and seed)
and answers with completions: which queries, when the request went out and came back, the error
if any, and in accuracy runs the outputs. Timestamps come from `perf_counter_ns`, a system-wide
monotonic clock, so a sample's latency is still measured from LoadGen's issue in this process to
its answer in a worker. A worker that dies has its outstanding samples completed as errors, so
LoadGen never waits for an answer that cannot come.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from dlscale.bench.data import SampleSet, load_samples
from dlscale.bench.loadgen import Exchange, Item, Recorder, complete, exchange, group_queries
from dlscale.bench.scenarios import RunSettings, Scenario
from dlscale.bench.targets import ModelInfo, RemoteTarget
from dlscale.errors import BenchError

#: Seconds a worker may take to start, connect and make its samples.
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to open the session's target and samples (sent once, pickled)."""

    #: A target like the session's, not open yet (so that it pickles): each worker opens its own.
    target: RemoteTarget
    info: ModelInfo
    data: Path | None
    sample_count: int
    seed: int


@dataclass(frozen=True)
class _Run:
    """A run starts: whether outputs come back, and this worker's requests in flight (0: any)."""

    accuracy: bool
    limit: int


@dataclass(frozen=True)
class _Issue:
    """Requests to send, each a group of (query id, sample index), issued at `issued_ns`."""

    issued_ns: int
    groups: list[list[Item]]


@dataclass(frozen=True)
class _Done:
    """One request's completion, as a worker reports it."""

    items: list[Item]
    issued_ns: int
    exchange: Exchange


_STOP = "stop"


class WorkerPool:
    """`count` worker processes, each with its own client to the session's target."""

    def __init__(self, spec: WorkerSpec, count: int) -> None:
        context = multiprocessing.get_context("spawn")  # never fork a process that runs threads
        self.connections: list[Connection] = []
        self._processes: list[Any] = []
        try:
            for n in range(count):
                mine, theirs = context.Pipe()
                process = context.Process(
                    target=worker_main, args=(theirs, spec), name=f"bench-worker-{n}", daemon=True
                )
                process.start()
                theirs.close()
                self.connections.append(mine)
                self._processes.append(process)
            for n, conn in enumerate(self.connections):
                _await_ready(n, conn)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Ask each worker to stop, wait a little, then end those that do not."""
        for conn in self.connections:
            with contextlib.suppress(OSError):
                conn.send(_STOP)
        for process in self._processes:
            process.join(10)
            if process.is_alive():
                process.terminate()
                process.join(5)
        for conn in self.connections:
            conn.close()
        self.connections, self._processes = [], []


def _await_ready(n: int, conn: Connection) -> None:
    if not conn.poll(START_TIMEOUT_S):
        raise BenchError(f"bench worker {n} did not start within {START_TIMEOUT_S:g} s")
    try:
        status, detail = conn.recv()
    except EOFError:
        raise BenchError(f"bench worker {n} exited while starting") from None
    if status != "ready":
        raise BenchError(f"bench worker {n}: {detail}")


def shares(concurrency: int, workers: int) -> list[int]:
    """Requests in flight per worker: `concurrency` in all, spread as evenly as it divides."""
    return [
        concurrency // workers + (1 if n < concurrency % workers else 0) for n in range(workers)
    ]


class PoolSut:
    """LoadGen's SUT over worker processes: issues here, completions from a receiving thread."""

    def __init__(
        self,
        connections: list[Connection],
        info: ModelInfo,
        settings: RunSettings,
        recorder: Recorder,
    ) -> None:
        self.info = info
        self.settings = settings
        self.recorder = recorder
        self._connections = connections
        limited = settings.scenario is Scenario.OFFLINE and settings.concurrency > 0
        limits = (
            shares(settings.concurrency, len(connections)) if limited else [0] * len(connections)
        )
        # Workers given no share of a small concurrency get no requests at all.
        self._active = [n for n, limit in enumerate(limits) if limit or not limited]
        #: Requests sent and not yet answered, by worker: {first query id: (items, issued_ns)}.
        self._outstanding: list[dict[int, tuple[list[Item], int]]] = [{} for _ in connections]
        self._next = 0
        self._send_lock = threading.RLock()
        self._complete_lock = threading.Lock()
        self._stopping = threading.Event()
        for n, (conn, limit) in enumerate(zip(connections, limits, strict=True)):
            try:
                conn.send(_Run(settings.accuracy, limit))
            except OSError:
                self._fail_worker(n, f"bench worker {n} is gone")
        self._receiver = threading.Thread(target=self._receive, name="bench-receiver", daemon=True)
        self._receiver.start()

    def issue_queries(self, queries: list[Any]) -> None:
        """LoadGen's callback: group the queries into requests and hand them to the workers."""
        issued_ns = time.perf_counter_ns()
        items = [(q.id, q.index) for q in queries]
        self.recorder.issued += len(items)
        per_worker: dict[int, list[list[Item]]] = {}
        with self._send_lock:
            for group in group_queries(items, self.info, self.settings):
                n = self._active[self._next % len(self._active)]
                self._next += 1
                per_worker.setdefault(n, []).append(group)
                self._outstanding[n][group[0][0]] = (group, issued_ns)
            for n, groups in per_worker.items():
                try:
                    self._connections[n].send(_Issue(issued_ns, groups))
                except OSError:
                    self._fail_worker(n, f"bench worker {n} is gone")

    def flush_queries(self) -> None:
        """LoadGen's flush callback: workers send as soon as they receive, nothing to flush."""

    def close(self) -> None:
        """After the run: stop the receiving thread (every sample has been completed)."""
        self._stopping.set()
        self._receiver.join()

    def _receive(self) -> None:
        while not self._stopping.is_set():
            for conn in wait(self._connections, timeout=0.05):
                assert isinstance(conn, Connection)
                n = self._connections.index(conn)
                try:
                    batch: list[_Done] = conn.recv()
                except (EOFError, OSError):
                    self._fail_worker(n, f"bench worker {n} exited")
                    continue
                for done in batch:
                    self._complete(n, done.items, done.exchange, done.issued_ns)

    def _complete(self, n: int, items: list[Item], done: Exchange, issued_ns: int) -> None:
        with self._complete_lock:
            if self._outstanding[n].pop(items[0][0], None) is None:
                return  # already failed with its worker: each sample is completed once
            complete(self.recorder, items, done, issued_ns, self.settings.accuracy)

    def _fail_worker(self, n: int, message: str) -> None:
        with self._send_lock:
            # Later requests go to the others (to the last one all the same: they fail fast).
            self._active = [a for a in self._active if a != n] or self._active
        now = time.perf_counter_ns()
        for items, issued_ns in list(self._outstanding[n].values()):
            self._complete(n, items, Exchange([], message, now, now), issued_ns)


def worker_main(conn: Connection, spec: WorkerSpec) -> None:
    """A worker process: open the target, then answer runs until told to stop."""
    asyncio.run(_Worker(conn, spec).serve())


class _Worker:
    """One worker's event loop: requests in, completions out, over its pipe to the bench."""

    def __init__(self, conn: Connection, spec: WorkerSpec) -> None:
        self.conn = conn
        self.spec = spec
        self.info = spec.info
        self.target = spec.target
        self.samples: SampleSet | None = None
        self._accuracy = False
        self._limit: asyncio.Semaphore | None = None
        self._done: list[_Done] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped: asyncio.Future[None] | None = None

    async def serve(self) -> None:
        """Open, say ready (or why not), then serve until the bench says stop or goes away."""
        spec = self.spec
        try:
            await self.target.open()
            self.samples = load_samples(self.info, spec.data, spec.sample_count, spec.seed)
        except Exception as exc:  # the bench reports it; the worker has nothing more to do
            self.conn.send(("failed", f"{type(exc).__name__}: {exc}"))
            await self.target.close()
            return
        self.conn.send(("ready", len(self.samples)))
        loop = asyncio.get_running_loop()
        self._stopped = loop.create_future()
        loop.add_reader(self.conn.fileno(), self._read)
        try:
            await self._stopped
            loop.remove_reader(self.conn.fileno())
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            await self.target.close()

    def _read(self) -> None:
        try:
            while self.conn.poll():
                self._handle(self.conn.recv())
        except (EOFError, OSError):
            self._stop()

    def _handle(self, message: Any) -> None:
        if isinstance(message, _Issue):
            loop = asyncio.get_running_loop()
            for group in message.groups:
                task = loop.create_task(self._send(group, message.issued_ns))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        elif isinstance(message, _Run):
            self._accuracy = message.accuracy
            self._limit = asyncio.Semaphore(message.limit) if message.limit else None
        elif message == _STOP:
            self._stop()

    def _stop(self) -> None:
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)

    async def _send(self, items: list[Item], issued_ns: int) -> None:
        assert self.samples is not None
        async with self._limit or contextlib.nullcontext():
            done = await exchange(self.target, self.info, self.samples, items)
        if not self._accuracy:
            done = replace(done, per_sample=[])  # outputs cross back only when they are checked
        if not self._done:
            asyncio.get_running_loop().call_soon(self._flush)
        self._done.append(_Done(items, issued_ns, done))

    def _flush(self) -> None:
        # Every completion of one loop iteration crosses in one message.
        batch, self._done = self._done, []
        try:
            self.conn.send(batch)
        except OSError:
            self._stop()
