"""The Batcher: per-model queues by priority, merged into batches, computed, split back."""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from dlscale.errors import DlscaleError, TimedOut, Unavailable
from dlscale.serving import batches
from dlscale.serving.batches import Pending, Tensors, fail, merge, merge_key, ns, outcome, within
from dlscale.serving.instance import Instance
from dlscale.serving.observe.otel import CURRENT
from dlscale.serving.observe.stats import ModelStats, RequestTimes
from dlscale.serving.policy import ArrivalGaps, BatchPolicy, Company
from dlscale.serving.qos.slots import TenantQos
from dlscale.serving.queue import RequestQueue
from dlscale.serving.slots import Demand, InstancePool, Slot, SlotPool
from dlscale.serving.wake_timer import WakeTimer


class Batcher:
    """Queues requests of one model version and feeds merged batches to its free instances.

    The policy (serving/policy.py) says when a batch would go: at max_batch_size or a
    preferred size, once the oldest request has waited max_queue_delay_us, or at once when no
    company is expected (arrivals further apart than the delay, or a request that arrived
    alone in flight after a lone batch and is still alone: `Company`). Then the batcher waits
    once for a slot (serving/slots.py): a free instance, and with `qos` its device's grant,
    which may cap its rows. It forms the batch once the slot is there: while every instance
    computes, requests keep arriving and the next batch grows by itself.

    With `qos` (serving/qos/slots.py), requests first pass the model's admission limits, and
    the slot pool reads the batch to schedule from `demand` when the device decides.

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
        self._queues: list[collections.deque[Pending]] = [
            collections.deque() for _ in range(policy.batching.priority_levels)
        ]
        self.queued = 0  # requests waiting for a batch now
        #: Bumped whenever a request joins or leaves the queues: the candidates walked last
        #: (`_walked`) stand while it is unchanged (the scheduler asks several times a batch).
        self._changes = 0
        self._walked: tuple[int, list[Pending], list[int], float] = (-1, [], [], 0.0)
        self._sends = (-1, 0)  # likewise, how many of them the policy sent (`_ready`)
        self._pool: SlotPool
        if qos is not None:
            qos.attach(self._instances)
            self._pool = qos
        else:
            self._pool = InstancePool(self._instances, policy.max_batch_size)
        #: What the scheduler awaits while it waits: resolved by an arrival (what the policy
        #: decides by has changed) or by the oldest request's delay.
        self._wake: asyncio.Future[None] | None = None
        self._timer: WakeTimer | None = None  # the delay's timer, once started (`start`)
        #: Batches computing now, by their id (the shutdown's cut reaches them).
        self._running: dict[int, list[Pending]] = {}
        #: Admission, bounds, timeouts and draining: the rules every kind of model queues by.
        self.queue = RequestQueue(policy, stats, qos.admission if qos else None, clock)
        self._scheduler: asyncio.Task[None] | None = None
        self._gaps = ArrivalGaps()  # for the adaptive queue delay
        self._company = Company()  # likewise
        self._computing = 0  # requests in batches sent and not yet finished
        self._batched = policy.batched  # asked once per request: read once here
        self._timeouts = bool(policy.batching.default_timeout_us)  # likewise

    # -- the caller's side -------------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduling task on the running loop."""
        loop = asyncio.get_running_loop()
        # The queue delay in microseconds on the real clock (wake_timer.py); a simulated one
        # (a test's) moves with the loop's own timers.
        if self._clock is time.perf_counter and WakeTimer.available():
            self._timer = WakeTimer(loop)
        self._scheduler = loop.create_task(self._schedule())

    async def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        priority: int = 0,
        timeout_us: int = 0,
        times: RequestTimes | None = None,
    ) -> Tensors:
        """Queue one request and wait for its outputs (its own rows of the batch it joined)."""
        return await self.submit(inputs, priority, timeout_us, times=times)

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
        level = self.queue.admit(priority, self.queued)
        batched = self._batched
        rows = next(iter(inputs.values())).shape[0] if batched and inputs else 1
        now = self._clock()
        alone = self._company.arrives_alone(self.queued + self._computing)
        future = asyncio.get_running_loop().create_future()
        key = merge_key(inputs, batched)
        # Every field in order, no keywords: a call with keywords builds a dict per request.
        item = Pending(inputs, rows, key, level, now, future, times, None, True, alone, release,
                       CURRENT.get())  # fmt: skip
        if times is not None:
            times.queue_start = ns(now)
        if timeout_us or self._timeouts:  # most requests have no timer to set
            item.timer = self.queue.expire(timeout_us, self._expire, item)
        self._queues[level].append(item)
        self.queued += 1
        self._changes += 1
        self._gaps.note(now)
        wake = self._wake  # the scheduler sleeps: what the policy decides by has changed
        if wake is not None and not wake.done():
            wake.set_result(None)
        item.future.add_done_callback(functools.partial(self._forget, item))
        return item.future

    def fail(self, error: DlscaleError) -> None:
        """Its model can serve no more: refuse new requests and fail the queued ones at once
        with `error` (batches running end by their own outcome); `close` still follows."""
        self.queue.refuse(error)
        self._fail_queued(error)

    def cut(self, error: DlscaleError) -> None:
        """The shutdown's grace is over: every request queued or in a batch computing ends now
        with `error` (a batch still computing finishes in its instance; its answers are not
        delivered)."""
        self._fail_queued(error)
        for batch in list(self._running.values()):
            fail(batch, error)

    async def close(self, grace_s: float | None = None) -> None:
        """Refuse new requests, let queued and running ones finish, then stop scheduling.

        With `grace_s`, wait that long at most: the requests still queued are then answered
        Unavailable, and batches still running are left to their instances' close (which stops
        a hung model's batch).
        """
        if not await self.queue.close(grace_s):
            self._fail_queued(
                Unavailable(
                    f"the model unloaded before this request was computed (grace {grace_s:g} s)"
                )
            )
        if self._scheduler is not None:
            self._scheduler.cancel()
            await asyncio.gather(self._scheduler, return_exceptions=True)
        if self._timer is not None:
            self._timer.close()

    # -- bookkeeping ---------------------------------------------------------------------------

    def _expire(self, item: Pending, timeout_us: int) -> None:
        if item.queued and not item.future.done():
            waited = ns(self._clock() - item.enqueued) // 1000
            self._unqueue(item)
            self._done_with(item)
            item.future.set_exception(
                TimedOut(
                    f"request timed out in the queue after {waited} us (timeout {timeout_us} us)"
                )
            )

    def _fail_queued(self, error: DlscaleError) -> None:
        """Every request still queued fails with `error` (its future's callback unqueues it)."""
        for queue in self._queues:
            fail(list(queue), error)

    def _unqueue(self, item: Pending) -> None:
        if item.queued:
            item.queued = False
            self._queues[item.level].remove(item)
            self.queued -= 1
            self._changes += 1

    @staticmethod
    def _done_with(item: Pending) -> None:
        release, item.release = item.release, None
        if release is not None:
            release()

    def _forget(self, item: Pending, _: object = None) -> None:
        # Runs when the future resolves, is failed, or is cancelled by a departed client.
        if item.timer is not None:
            item.timer.cancel()
        if item.queued:  # left the queue without a batch: its inputs are read no more
            self._unqueue(item)
            self._done_with(item)
        self.queue.done()

    # -- the scheduler's side ----------------------------------------------------------------------

    async def _schedule(self) -> None:
        while True:
            await self._until_ready()
            seen = self._changes
            slot = self._pool.take_now(self) or await self._pool.take(self)
            # An instance alone: company may still be worth waiting for, unless no request
            # came or left meanwhile: then the policy's answer stands (the clock alone never
            # holds back a batch the policy sends, and a batch ending only makes one go sooner).
            if not slot.scheduled and self._changes != seen:
                await self._until_ready(holding=True)
            batch, capped = self._form(slot)
            if not batch:  # every request had left meanwhile
                slot.done()
                continue
            waited_out = self._clock() >= self.policy.close_by(min(i.enqueued for i in batch))
            self._company.sent(len(batch), self.queued + self._computing, waited_out)
            self._computing += len(batch)
            self._send(slot, batch, capped)

    async def _until_ready(self, holding: bool = False) -> None:
        """Wait until the policy would send a batch: requests arrive, the oldest's delay ends.

        `holding` a slot, also until no request is left (the slot goes back unused). The
        policy is asked again once a slot is there, as the planner's simulation asks it when an
        instance is free: the smoothed gap between arrivals may have changed meanwhile.
        """
        while True:
            now = self._clock()
            chosen, _, send, oldest = self._ready(now)
            if send or (holding and not chosen):
                return
            await self._sleep(self.policy.close_by(oldest) - now if chosen else None)

    async def _sleep(self, timeout: float | None) -> None:
        """Until an arrival wakes it (`submit`) or `timeout` seconds. A future and a timer, not
        `wait_for` on an Event (a task per wait): the scheduler sleeps up to once per arrival.
        Nothing changes between the policy's answer and this wait (one thread), so no wake can
        be missed."""
        loop = asyncio.get_running_loop()
        self._wake = wake = loop.create_future()
        later = self._timer or loop
        timer = None if timeout is None else later.call_later(timeout, _resolve, wake)
        try:
            await wake
        finally:
            self._wake = None
            if timer is not None:
                timer.cancel()

    def _candidates(self) -> tuple[list[Pending], list[int], float]:
        """Requests that can join the head's batch (highest priority first, then oldest), their
        rows, and the oldest one's arrival: one walk, since the scheduler asks at every arrival,
        and none while no request joined or left since the last (nor the lists: not changed)."""
        changes, chosen, rows, oldest = self._walked
        if changes == self._changes:
            return chosen, rows, oldest
        chosen, rows, oldest = self._walk()
        self._walked = (self._changes, chosen, rows, oldest)
        return chosen, rows, oldest

    def _walk(self) -> tuple[list[Pending], list[int], float]:
        for queue in self._queues:  # the head: the first of the highest level that waits
            if queue:
                head = queue[0]
                break
        else:
            return [], [], 0.0
        if not self._batched:
            return [head], [head.rows], head.enqueued
        chosen: list[Pending] = []
        rows: list[int] = []
        total, oldest, key, limit = 0, head.enqueued, head.key, self.policy.max_batch_size
        # Stop at a full batch: a deep backlog must not make every batch cost a full scan.
        for queue in self._queues:
            for item in queue:
                if item.key == key and total + item.rows <= limit:
                    chosen.append(item)
                    rows.append(item.rows)
                    total += item.rows
                    if item.enqueued < oldest:  # a lower level's may be older than the head
                        oldest = item.enqueued
                    if total == limit:
                        return chosen, rows, oldest
        return chosen, rows, oldest

    def _ready(self, now: float) -> tuple[list[Pending], list[int], int, float]:
        """The candidates, their rows, how many the policy sends now (0: wait), and the oldest's
        arrival."""
        chosen, rows, oldest = self._candidates()
        if not chosen:
            return [], [], 0, now
        if self._sends[0] == self._changes:  # the policy sent them and none joined or left
            return chosen, rows, self._sends[1], oldest  # since: the clock never holds them back
        alone = chosen[0].alone and self.queued + self._computing == 1
        gap = 0.0 if self._company.expected else self._gaps.smoothed  # `Company.expected`
        send = self.policy.to_send(rows, oldest, now, gap, alone)
        if send:
            self._sends = (self._changes, send)
        return chosen, rows, send, oldest

    def demand(self, now: float) -> Demand | None:
        """The batch that would go now (DemandSource): what a device scheduler weighs."""
        chosen, rows, send, oldest = self._ready(now)
        if not chosen:
            return None
        # Waiting for a slot, the batch goes once it comes even where the policy would now
        # wait (its head left, a younger request leads): all the candidates count.
        send = send or len(chosen)
        return Demand(oldest, sum(rows[:send]), rows[0])

    def _form(self, slot: Slot) -> tuple[list[Pending], bool]:
        """The batch to send in `slot`, and whether the slot's rows cut it short.

        Formed once the slot is there: requests kept arriving (or left) while it was awaited.
        """
        chosen, rows, _ = self._candidates()
        if not chosen:
            return [], False
        # The slot is there, so the batch goes: a prefix that closes a batch (full or a
        # preferred size) within its rows, or else all that fit (the policy's `to_send` once it
        # sends, whatever the clock and the gaps say).
        closing = self.policy.closing_prefix
        cut = within(rows, slot.max_rows)
        send = closing(rows[:cut] if cut < len(rows) else rows) or cut
        uncapped = send if cut == len(rows) else closing(rows) or len(rows)
        return self._take(chosen[:send], self._clock()), cut < uncapped

    def _take(self, chosen: list[Pending], now: float) -> list[Pending]:
        waited = self.qos.waited if self.qos is not None else None
        batch = []
        queues = self._queues
        self._changes += 1
        for item in chosen:
            item.queued = False  # `_unqueue`, written out: once per request
            queues[item.level].remove(item)
            self.queued -= 1
            if item.future.done():
                self._done_with(item)
                continue
            if waited is not None:
                waited.observe(now - item.enqueued)
            batch.append(item)
        return batch

    def _send(self, slot: Slot, batch: list[Pending], capped: bool) -> None:
        """Start computing `batch` in `slot`; `_computed` takes its outcome. Callbacks, not a
        task per batch: over gRPC a batch holds one to three requests, and a task's making,
        steps and registry cost it more than the batch's bookkeeping (docs/serving-grpc.md)."""
        context = batches.traced_context(batch)
        self._running[id(batch)] = batch
        instance = slot.instance
        t0 = self._clock()
        try:
            by_request = instance.takes_requests  # the backend sees each request's own inputs
            requests = [i.inputs for i in batch] if by_request else []
            merged = {} if by_request else merge(batch)
            then = functools.partial(self._computed, slot, batch, capped, t0, self._clock())
            if by_request:
                instance.start_requests(requests, then, context)
            else:
                instance.start(merged, then, context)
        except Exception as exc:  # the batch fails, not the scheduler
            self._computed(slot, batch, capped, t0, t0, None, exc)

    def _computed(
        self,
        slot: Slot,
        batch: list[Pending],
        capped: bool,
        t0: float,
        t1: float,
        outputs: Tensors | Sequence[Tensors | DlscaleError] | None,
        error: BaseException | None,
    ) -> None:
        """The batch's outcome (outputs, each request's results, or an error) delivered."""
        t2 = self._clock()
        rows = 0
        for item in batch:  # a loop, not `sum` over a generator: once a batch
            rows += item.rows
        try:
            parts = outcome(slot.instance.name, batch, rows, outputs, error, self._batched)
            if parts is not None:
                stamps = s0, s1, s2, s3 = ns(t0), ns(t1), ns(t2), ns(self._clock())
                self.stats.record_batch(rows, s1 - s0, s2 - s1, s3 - s2)
                batches.deliver(batch, parts, stamps, rows)
        finally:
            del self._running[id(batch)]
            now = self._clock()
            # Before the slot goes back: a request that arrives next must see the model idle.
            self._computing -= len(batch)
            slot.done(rows, [now - i.enqueued for i in batch], capped)
            for item in batch:
                if item.release is not None:  # most requests hold no region
                    self._done_with(item)


def _resolve(wake: asyncio.Future[None]) -> None:
    if not wake.done():
        wake.set_result(None)
