"""The Batcher: per-model queues by priority, merged into batches, computed, split back."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dlscale.errors import BackendError, DlscaleError, QueueFull, TimedOut, Unavailable
from dlscale.serving.instance import Instance
from dlscale.serving.observe.stats import ModelStats, RequestTimes
from dlscale.serving.policy import ArrivalGaps, BatchPolicy
from dlscale.serving.qos.gate import Seat, TenantQos
from dlscale.serving.qos.scheduler import Demand, Grant

log = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]


@dataclass(eq=False)
class _Pending:
    """A request waiting for, or inside, a batch."""

    inputs: Mapping[str, np.ndarray]
    rows: int
    key: tuple[object, ...]  # requests merge only when every non-batch shape and dtype agree
    level: int
    enqueued: float  # seconds on the batcher's clock
    future: asyncio.Future[Tensors]
    times: RequestTimes | None = None  # filled in as the request is queued and computed
    timer: asyncio.TimerHandle | None = None
    queued: bool = True
    #: Called once the batcher no longer reads the inputs (they may be views of shared memory).
    release: Callable[[], None] | None = None


@dataclass(frozen=True)
class _Slot:
    """A device slot held for one batch: given back with what the batch took."""

    seat: Seat
    grant: Grant
    start: float
    capped: bool = False


class Batcher:
    """Queues requests of one model version and feeds merged batches to its free instances.

    Forming a batch waits for a free instance first: while every instance computes, requests
    keep arriving and the next batch grows by itself. Then the policy (serving/policy.py)
    says when the batch goes: at max_batch_size or a preferred size, once the oldest request
    has waited max_queue_delay_us, or at once when no company is expected.

    With `qos` (serving/qos/gate.py), requests first pass the model's admission limits, and a
    ready batch waits for a slot on its instance's device, which may cap its rows.

    `clock` gives seconds: perf_counter by default, since uvloop's `loop.time()` moves in whole
    milliseconds; a test that runs the loop on a simulated clock passes that clock (and the
    device gates must read the same one).
    """

    def __init__(
        self,
        policy: BatchPolicy,
        instances: Sequence[Instance],
        stats: ModelStats,
        clock: Callable[[], float] = time.perf_counter,
        qos: TenantQos | None = None,
    ) -> None:
        if not instances:
            raise ValueError("a batcher needs at least one instance")
        self.policy = policy
        self.stats = stats
        self.qos = qos
        self._clock = clock
        self._instances = list(instances)
        self._queues: list[collections.deque[_Pending]] = [
            collections.deque() for _ in range(policy.batching.priority_levels)
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
        self._gaps = ArrivalGaps()  # for the adaptive queue delay

    # -- the caller's side -------------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduling task on the running loop."""
        self._scheduler = asyncio.get_running_loop().create_task(self._schedule())

    async def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        priority: int = 0,
        timeout_us: int = 0,
        times: RequestTimes | None = None,
    ) -> Tensors:
        """Queue one request and wait for its outputs (its own rows of the batch it joined)."""
        return await self.submit(inputs, priority, timeout_us, times=times)

    def refuse_early(self) -> DlscaleError | None:
        """The refusal `submit` would raise now by the model's [qos] admission, or None."""
        if self.qos is None or self.qos.admission is None:
            return None
        return self.qos.admission.refuse_early(self.stats.pending, self._clock())

    def submit(
        self,
        inputs: Mapping[str, np.ndarray],
        priority: int = 0,
        timeout_us: int = 0,
        release: Callable[[], None] | None = None,
        times: RequestTimes | None = None,
    ) -> asyncio.Future[Tensors]:
        """Queue one request; its future resolves to its outputs or to a DlscaleError.

        `release` is called once the batcher is done with the inputs: when the request leaves
        the queue without being computed, or when the batch it joined has been computed (which
        may be after its future was cancelled). Not called when submit raises. `times`, when
        given, receives the queue and compute timestamps of the request.
        """
        if self._closing:
            raise Unavailable("the model is unloading and takes no new requests")
        level = self.policy.level_of(priority)
        limit = self.policy.batching.max_queue_size
        if limit and self._queued >= limit:
            raise QueueFull(
                f"the queue is full ({self._queued} requests waiting, max_queue_size "
                f"{limit}); retry later"
            )
        if self.qos is not None and self.qos.admission is not None:
            self.qos.admission.admit(self.stats.pending, self._clock())
        loop = asyncio.get_running_loop()
        batched = self.policy.batched
        rows = next(iter(inputs.values())).shape[0] if batched and inputs else 1
        # Arrays of one type only merge: host arrays with host arrays, device ones with device.
        key = tuple(
            (name, type(arr), arr.dtype.str, arr.shape[1:] if batched else arr.shape)
            for name, arr in sorted(inputs.items())
        )
        item = _Pending(inputs, rows, key, level, self._clock(), loop.create_future(), times)
        item.release = release
        if times is not None:
            times.queue_start = _ns(item.enqueued)
        timeout = timeout_us or self.policy.batching.default_timeout_us
        if timeout:
            item.timer = loop.call_later(timeout / 1e6, self._expire, item, timeout)
        self._queues[level].append(item)
        self._queued += 1
        self.stats.pending += 1
        self._idle.clear()
        self._gaps.note(item.enqueued)
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

    def _expire(self, item: _Pending, timeout_us: int) -> None:
        if item.queued and not item.future.done():
            waited = _ns(self._clock() - item.enqueued) // 1000
            self._unqueue(item)
            self._done_with(item)
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

    @staticmethod
    def _done_with(item: _Pending) -> None:
        release, item.release = item.release, None
        if release is not None:
            release()

    def _forget(self, item: _Pending) -> None:
        # Runs when the future resolves, is failed, or is cancelled by a departed client.
        if item.timer is not None:
            item.timer.cancel()
        if item.queued:  # left the queue without a batch: its inputs are read no more
            self._unqueue(item)
            self._done_with(item)
        self.stats.pending -= 1
        if self.stats.pending == 0:
            self._idle.set()

    # -- the scheduler's side ----------------------------------------------------------------------

    async def _schedule(self) -> None:
        while True:
            await self._wait_for_work()
            instance = await self._free.get()
            seat = self.qos.seats.get(instance.name) if self.qos is not None else None
            batch, slot = await self._form_batch(seat)
            if not batch:
                if slot is not None:  # every request taken had left meanwhile
                    slot.seat.release(slot.grant, 0, 0.0)
                self._free.put_nowait(instance)
                continue
            task = asyncio.get_running_loop().create_task(self._run(instance, batch, slot))
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
        if not self.policy.batched:
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

    def _ready(self, now: float) -> tuple[list[_Pending], int, float]:
        """The candidates, how many the policy sends now (0: wait), and the oldest's arrival."""
        chosen = self._candidates()
        if not chosen:
            return [], 0, now
        oldest, rows = min(i.enqueued for i in chosen), [i.rows for i in chosen]
        return chosen, self.policy.to_send(rows, oldest, now, self._gaps.smoothed), oldest

    def _demand(self, now: float) -> Demand | None:
        """The next batch's demand for a device slot, when the policy would send it now."""
        chosen, send, oldest = self._ready(now)
        if not send:
            return None
        return Demand(oldest, sum(i.rows for i in chosen[:send]), chosen[0].rows)

    async def _form_batch(self, seat: Seat | None) -> tuple[list[_Pending], _Slot | None]:
        while True:
            now = self._clock()
            chosen, send, oldest = self._ready(now)
            if send and seat is not None and seat.active:
                demand = Demand(oldest, sum(i.rows for i in chosen[:send]), chosen[0].rows)
                return await self._granted(seat, demand)
            if send:
                slot = _Slot(seat, seat.start_off(), now) if seat is not None else None
                return self._take(chosen[:send], now), slot
            if seat is not None:
                seat.withdraw()  # a slot kept for this model on release is not wanted yet
            if not chosen:
                return [], None
            self._arrival.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrival.wait(), self.policy.close_by(oldest) - now)

    async def _granted(self, seat: Seat, demand: Demand) -> tuple[list[_Pending], _Slot | None]:
        """The batch once the device's scheduler gives it a slot, within the rows granted."""
        grant = await seat.acquire(demand)
        now = self._clock()
        # Requests kept arriving (or left) while the batch waited: form it again. The slot is
        # used even where the policy would now wait (the head left, a younger one leads).
        chosen = self._candidates()
        if not chosen:
            seat.release(grant, 0, 0.0)
            return [], None
        oldest, gap = min(i.enqueued for i in chosen), self._gaps.smoothed
        rows = [i.rows for i in chosen]
        cut = _within(rows, grant.max_rows)
        send = self.policy.to_send(rows[:cut], oldest, now, gap) or cut
        uncapped = self.policy.to_send(rows, oldest, now, gap) or len(rows)
        return self._take(chosen[:send], now), _Slot(seat, grant, now, cut < uncapped)

    def _take(self, chosen: list[_Pending], now: float) -> list[_Pending]:
        waited = self.qos.waited if self.qos is not None else None
        batch = []
        for item in chosen:
            self._unqueue(item)
            if item.future.done():
                self._done_with(item)
                continue
            if waited is not None:
                waited.observe(now - item.enqueued)
            batch.append(item)
        return batch

    async def _run(self, instance: Instance, batch: list[_Pending], slot: _Slot | None) -> None:
        try:
            await self._compute(instance, batch)
        finally:
            if slot is not None:
                self._release(slot, batch)
            self._free.put_nowait(instance)
            for item in batch:
                self._done_with(item)

    def _release(self, slot: _Slot, batch: list[_Pending]) -> None:
        """Give the device slot back, saying whether this model has its next batch ready.

        Otherwise a model with one instance would never be waiting when its own batch ends:
        its next batch forms only once the instance is back, after the slot went to another.
        """
        now = self._clock()
        single = self.qos is not None and len(self.qos.devices()) == 1
        then = self._demand(now) if single and slot.seat.active else None
        rows = sum(i.rows for i in batch)
        latencies = [now - i.enqueued for i in batch]
        slot.seat.release(slot.grant, rows, now - slot.start, slot.capped, then, latencies)

    async def _compute(self, instance: Instance, batch: list[_Pending]) -> None:
        t0 = self._clock()
        rows = sum(i.rows for i in batch)
        if len(batch) == 1:
            merged = dict(batch[0].inputs)
        else:
            names = batch[0].inputs.keys()
            merged = {n: np.concatenate([i.inputs[n] for i in batch]) for n in names}
        t1 = self._clock()
        try:
            outputs = await instance.infer(merged)
            t2 = self._clock()
            parts = self._split(outputs, batch, rows)
        except DlscaleError as exc:
            self._fail(batch, exc)
            return
        except Exception as exc:  # a backend bug must fail its batch, not the server
            log.exception("instance %s failed a batch of %d rows", instance.name, rows)
            self._fail(batch, BackendError(f"the model failed on a batch of {rows}: {exc!r}"))
            return
        t3 = self._clock()
        self.stats.record_batch(rows, _ns(t1 - t0), _ns(t2 - t1), _ns(t3 - t2))
        stamps = (_ns(t0), _ns(t1), _ns(t2), _ns(t3))
        for item, part in zip(batch, parts, strict=True):
            if item.times is not None:
                times = item.times
                (
                    times.compute_start,
                    times.compute_input_end,
                    times.compute_output_start,
                    times.compute_end,
                ) = stamps
            if not item.future.done():
                item.future.set_result(part)

    def _split(self, outputs: Tensors, batch: list[_Pending], rows: int) -> list[Tensors]:
        if not self.policy.batched:
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


def _within(rows: Sequence[int], limit: int) -> int:
    """How many leading requests fit in `limit` rows; the first always (it cannot be split)."""
    total = 0
    for n, r in enumerate(rows):
        total += r
        if total > limit:
            return max(n, 1)
    return len(rows)


def _ns(seconds: float) -> int:
    """Statistics keep nanoseconds, as Triton's do."""
    return round(seconds * 1e9)
