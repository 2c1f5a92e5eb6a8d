"""The Batcher: per-model queues by priority, merged into batches, computed, split back."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dlscale.errors import (
    BackendError,
    DlscaleError,
    InvalidInput,
    QueueFull,
    TimedOut,
    Unavailable,
)
from dlscale.serving.instance import Instance
from dlscale.serving.stats import ModelStats

log = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]


@dataclass(frozen=True)
class BatchPolicy:
    """How one model's requests are queued and merged (from config.toml's [batching])."""

    max_batch_size: int = 0  # 0: the model takes no batch dim; each request runs alone
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    priority_levels: int = 1
    default_priority_level: int = 0  # 0: the lowest level
    max_queue_size: int = 0  # 0: unbounded
    default_timeout_us: int = 0  # 0: none
    adaptive_queue_delay: bool = True  # skip the delay when arrivals are further apart than it

    def level_of(self, priority: int) -> int:
        """Queue index for a request priority (1 highest); 0 asks for the default level."""
        if priority < 0 or priority > self.priority_levels:
            raise InvalidInput(
                f"priority {priority} is out of range: this model has priority levels "
                f"1..{self.priority_levels} (0 for the default)"
            )
        if priority == 0:
            priority = self.default_priority_level or self.priority_levels
        return priority - 1


@dataclass(eq=False)
class _Pending:
    """A request waiting for, or inside, a batch."""

    inputs: Mapping[str, np.ndarray]
    rows: int
    key: tuple[object, ...]  # requests merge only when every non-batch shape and dtype agree
    level: int
    enqueued_ns: int
    future: asyncio.Future[Tensors]
    timer: asyncio.TimerHandle | None = None
    queued: bool = True
    dispatched_ns: int = field(default=0)


class Batcher:
    """Queues requests of one model version and feeds merged batches to its free instances.

    Forming a batch waits for a free instance first: while every instance computes, requests
    keep arriving and the next batch grows by itself. Then it waits at most
    max_queue_delay_us after the oldest request for more rows, stopping early at a preferred
    batch size or at max_batch_size.
    """

    def __init__(
        self, policy: BatchPolicy, instances: Sequence[Instance], stats: ModelStats
    ) -> None:
        if not instances:
            raise ValueError("a batcher needs at least one instance")
        self.policy = policy
        self.stats = stats
        self._instances = list(instances)
        self._queues: list[collections.deque[_Pending]] = [
            collections.deque() for _ in range(policy.priority_levels)
        ]
        self._queued = 0
        # An instance that takes several batches at once (Instance.slots) is queued once per
        # batch it takes: the next batch forms while the last one computes.
        self._free: asyncio.Queue[Instance] = asyncio.Queue()
        for inst in self._instances:
            for _ in range(inst.slots):
                self._free.put_nowait(inst)
        self._arrival = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        self._closing = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._scheduler: asyncio.Task[None] | None = None
        # Smoothed gap between arrivals: waiting out the delay is pointless when no company
        # is expected within it (a lone client would pay the whole delay on every request).
        self._gap_ns = float("inf")
        self._last_arrival_ns = 0

    # -- the caller's side -------------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduling task on the running loop."""
        self._scheduler = asyncio.get_running_loop().create_task(self._schedule())

    async def infer(
        self, inputs: Mapping[str, np.ndarray], priority: int = 0, timeout_us: int = 0
    ) -> Tensors:
        """Queue one request and wait for its outputs (its own rows of the batch it joined)."""
        return await self.submit(inputs, priority, timeout_us)

    def submit(
        self, inputs: Mapping[str, np.ndarray], priority: int = 0, timeout_us: int = 0
    ) -> asyncio.Future[Tensors]:
        """Queue one request; its future resolves to its outputs or to a DlscaleError."""
        if self._closing:
            raise Unavailable("the model is unloading and takes no new requests")
        level = self.policy.level_of(priority)
        if self.policy.max_queue_size and self._queued >= self.policy.max_queue_size:
            raise QueueFull(
                f"the queue is full ({self._queued} requests waiting, max_queue_size "
                f"{self.policy.max_queue_size}); retry later"
            )
        loop = asyncio.get_running_loop()
        batched = self.policy.max_batch_size > 0
        rows = next(iter(inputs.values())).shape[0] if batched and inputs else 1
        key = tuple(
            (name, arr.dtype.str, arr.shape[1:] if batched else arr.shape)
            for name, arr in sorted(inputs.items())
        )
        item = _Pending(inputs, rows, key, level, time.perf_counter_ns(), loop.create_future())
        timeout = timeout_us or self.policy.default_timeout_us
        if timeout:
            item.timer = loop.call_later(timeout / 1e6, self._expire, item, timeout)
        self._queues[level].append(item)
        self._queued += 1
        self.stats.pending += 1
        self._idle.clear()
        self._note_arrival(item.enqueued_ns)
        self._arrival.set()
        item.future.add_done_callback(lambda _: self._forget(item))
        return item.future

    async def close(self) -> None:
        """Refuse new requests, let queued and running ones finish, then stop scheduling."""
        self._closing = True
        await self._idle.wait()
        if self._scheduler is not None:
            self._scheduler.cancel()
            await asyncio.gather(self._scheduler, return_exceptions=True)

    @property
    def queued(self) -> int:
        """Requests waiting for a batch now."""
        return self._queued

    # -- bookkeeping ---------------------------------------------------------------------------

    def worth_waiting(self) -> bool:
        """Whether another request is expected within the queue delay (arrivals come closer)."""
        if not self.policy.adaptive_queue_delay:
            return True
        return self._gap_ns <= self.policy.max_queue_delay_us * 1000

    def _note_arrival(self, now_ns: int) -> None:
        if self._last_arrival_ns:
            gap = now_ns - self._last_arrival_ns
            self._gap_ns = gap if self._gap_ns == float("inf") else 0.8 * self._gap_ns + 0.2 * gap
        self._last_arrival_ns = now_ns

    def _expire(self, item: _Pending, timeout_us: int) -> None:
        if item.queued and not item.future.done():
            waited = (time.perf_counter_ns() - item.enqueued_ns) // 1000
            self._unqueue(item)
            item.future.set_exception(
                TimedOut(
                    f"request timed out in the queue after {waited} us (timeout {timeout_us} us)"
                )
            )

    def _unqueue(self, item: _Pending) -> None:
        if item.queued:
            item.queued = False
            self._queues[item.level].remove(item)
            self._queued -= 1

    def _forget(self, item: _Pending) -> None:
        # Runs when the future resolves, is failed, or is cancelled by a departed client.
        if item.timer is not None:
            item.timer.cancel()
        self._unqueue(item)
        self.stats.pending -= 1
        if self.stats.pending == 0:
            self._idle.set()

    # -- the scheduler's side ----------------------------------------------------------------------

    async def _schedule(self) -> None:
        while True:
            await self._wait_for_work()
            instance = await self._free.get()
            batch = await self._form_batch()
            if not batch:
                self._free.put_nowait(instance)
                continue
            task = asyncio.get_running_loop().create_task(self._run(instance, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _wait_for_work(self) -> None:
        while not self._queued:
            self._arrival.clear()
            await self._arrival.wait()

    def _candidates(self) -> list[_Pending]:
        """Requests that can join the head's batch: highest priority first, then oldest."""
        head = next((q[0] for q in self._queues if q), None)
        if head is None:
            return []
        if self.policy.max_batch_size == 0:
            return [head]
        chosen, rows, limit = [], 0, self.policy.max_batch_size
        # Stop at a full batch: a deep backlog must not make every batch cost a full scan.
        for queue in self._queues:
            for item in queue:
                if item.key == head.key and rows + item.rows <= limit:
                    chosen.append(item)
                    rows += item.rows
                    if rows == limit:
                        return chosen
        return chosen

    async def _form_batch(self) -> list[_Pending]:
        policy = self.policy
        while True:
            chosen = self._candidates()
            if not chosen:
                return []
            rows = sum(i.rows for i in chosen)
            if policy.max_batch_size == 0 or rows >= policy.max_batch_size:
                return self._take(chosen)
            preferred = self._preferred_prefix(chosen)
            if preferred:
                return self._take(preferred)
            oldest = min(i.enqueued_ns for i in chosen)
            wait_s = (oldest + policy.max_queue_delay_us * 1000 - time.perf_counter_ns()) / 1e9
            if wait_s <= 0 or not self.worth_waiting():
                return self._take(chosen)
            self._arrival.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrival.wait(), wait_s)

    def _preferred_prefix(self, chosen: list[_Pending]) -> list[_Pending]:
        """The longest prefix of `chosen` whose rows make up a preferred batch size, if any."""
        wanted = set(self.policy.preferred_batch_sizes)
        best: list[_Pending] = []
        rows = 0
        for n, item in enumerate(chosen, start=1):
            rows += item.rows
            if rows in wanted:
                best = chosen[:n]
        return best

    def _take(self, chosen: list[_Pending]) -> list[_Pending]:
        now = time.perf_counter_ns()
        for item in chosen:
            self._unqueue(item)
            item.dispatched_ns = now
            self.stats.queue.add(now - item.enqueued_ns)
        return [i for i in chosen if not i.future.done()]

    async def _run(self, instance: Instance, batch: list[_Pending]) -> None:
        try:
            await self._compute(instance, batch)
        finally:
            self._free.put_nowait(instance)

    async def _compute(self, instance: Instance, batch: list[_Pending]) -> None:
        t0 = time.perf_counter_ns()
        rows = sum(i.rows for i in batch)
        if len(batch) == 1:
            merged = dict(batch[0].inputs)
        else:
            names = batch[0].inputs.keys()
            merged = {n: np.concatenate([i.inputs[n] for i in batch]) for n in names}
        t1 = time.perf_counter_ns()
        try:
            outputs = await instance.infer(merged)
            t2 = time.perf_counter_ns()
            parts = self._split(outputs, batch, rows)
        except DlscaleError as exc:
            self._fail(batch, exc)
            return
        except Exception as exc:  # a backend bug must fail its batch, not the server
            log.exception("instance %s failed a batch of %d rows", instance.name, rows)
            self._fail(batch, BackendError(f"the model failed on a batch of {rows}: {exc!r}"))
            return
        t3 = time.perf_counter_ns()
        self.stats.record_batch(rows, t1 - t0, t2 - t1, t3 - t2)
        for item, part in zip(batch, parts, strict=True):
            if not item.future.done():
                item.future.set_result(part)

    def _split(self, outputs: Tensors, batch: list[_Pending], rows: int) -> list[Tensors]:
        if self.policy.max_batch_size == 0:
            return [outputs]
        for name, arr in outputs.items():
            if arr.ndim == 0 or arr.shape[0] != rows:
                raise BackendError(
                    f"output {name!r} has shape {list(arr.shape)}, but the batch had {rows} rows"
                )
        parts, start = [], 0
        for item in batch:
            end = start + item.rows
            parts.append({n: a[start:end] for n, a in outputs.items()})
            start = end
        return parts

    @staticmethod
    def _fail(batch: list[_Pending], exc: DlscaleError) -> None:
        for item in batch:
            if not item.future.done():
                item.future.set_exception(exc)
