"""Seats in front of a model that streams its answers: its sequences in flight, and its queue.

A generative engine batches at the iteration level by itself, so the dynamic batcher does not
re-batch it; what dlscale keeps is the order in which requests reach it. `Seats` admits at most
the engine's sequence capacity (`max_num_seqs` in [backend_options]) at once; the others wait,
highest priority first, then oldest, each until its timeout (`timeout` parameter, or the
model's default_timeout_us) passes. The model's [qos] limits (max_in_flight, rate_limit) refuse
a request at once, before it waits. OIP requests and OpenAI requests share the one queue.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dlscale.errors import ConfigError, DlscaleError, TimedOut
from dlscale.models.config import ModelConfig
from dlscale.serving.instance import Instance
from dlscale.serving.observe.stats import ModelStats, RequestTimes
from dlscale.serving.observe.tokens import TokenStats
from dlscale.serving.policy import BatchPolicy
from dlscale.serving.qos.admission import Admission
from dlscale.serving.queue import RequestQueue

#: Sequences a generative engine runs at once unless [backend_options] max_num_seqs says
#: otherwise: vLLM's default on CPUs (shared/reference/generative.md).
ENGINE_SEQUENCES = 128
CAPACITY_KEY = "max_num_seqs"


@dataclass(order=True)
class _Waiter:
    level: int
    arrival: int
    seat: asyncio.Future[None] = field(compare=False)


class Seats:
    """One model version's sequences in flight and the requests waiting for one."""

    def __init__(
        self,
        capacity: int,
        policy: BatchPolicy,
        instances: Sequence[Instance],
        stats: ModelStats,
        admission: Admission | None = None,
        generative: bool = False,
    ) -> None:
        #: A generative engine's (its streams follow backends/generative/contract.py): a unary
        #: request gets its stream joined; a decoupled Python model's is refused one.
        self.generative = generative
        self.capacity = capacity
        #: Admission, bounds, timeouts and draining: the rules every kind of model queues by.
        self.queue = RequestQueue(policy, stats, admission)
        self.instances = list(instances)
        self.tokens = TokenStats()
        #: Sequences in flight now, and requests waiting for a seat.
        self.running = 0
        self.waiting = 0
        self._load = [0] * len(self.instances)  # sequences in flight by instance
        self._queue: list[_Waiter] = []
        self._arrivals = itertools.count()
        #: The tasks of the streams in flight or waiting (cancelled at the shutdown's cut).
        self.tasks: set[asyncio.Task[Any]] = set()
        #: Told an instance's sequences in flight whenever they change, before a new one
        #: reaches its engine (a vLLM engine's leases of the device: serving/qos/leases.py).
        self.watch: Callable[[Instance, int], None] | None = None

    @classmethod
    def of(
        cls, config: ModelConfig, instances: Sequence[Instance], stats: ModelStats, engine: bool
    ) -> Seats:
        """The seats a model's config asks for; an engine's default capacity is ENGINE_SEQUENCES,
        a Python model's its instance count (each runs one `execute` at a time)."""
        extra: dict[str, Any] = dict(config.backend_options.model_extra or {})
        default = ENGINE_SEQUENCES if engine else len(instances)
        capacity = extra.get(CAPACITY_KEY, default)
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ConfigError(
                f"model {config.name!r}: field 'backend_options.{CAPACITY_KEY}': expected a "
                f"positive integer, got {capacity!r}"
            )
        admission = Admission(config.name, config.qos, time.perf_counter()) if config.qos else None
        policy = BatchPolicy.of(config)
        return cls(capacity, policy, instances, stats, admission, engine)

    async def enter(self, priority: int, timeout_us: int, times: RequestTimes) -> Instance:
        """Wait for a seat (by priority, then arrival); the instance that runs the sequence.

        Raises QueueFull, TooManyRequests (the [qos] limits) or TimedOut (its timeout passed
        while it waited); a caller cancelled while waiting leaves the queue. The caller owes one
        `leave` once it returns.
        """
        full = self.running >= self.capacity or self.waiting > 0
        level = self.queue.admit(priority, self.waiting, waits=full)
        times.queue_start = time.perf_counter_ns()
        try:
            if full:
                await self._wait(level, timeout_us)
            else:
                self.running += 1
        except BaseException:
            self.queue.done()
            raise
        return self._pick()

    async def _wait(self, level: int, timeout_us: int) -> None:
        """Queue for a seat; `_admit` hands it over (running is counted for the waiter)."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(level, next(self._arrivals), loop.create_future())
        heapq.heappush(self._queue, waiter)
        self.waiting += 1
        timer = self.queue.expire(timeout_us, _expire, waiter.seat)
        try:
            await waiter.seat
        except BaseException:
            seat = waiter.seat
            if seat.done() and not seat.cancelled() and seat.exception() is None:
                self._free()  # handed a seat as its caller left: the next one takes it
            raise
        finally:
            self.waiting -= 1
            if timer is not None:
                timer.cancel()

    def _pick(self) -> Instance:
        """The instance with the fewest sequences in flight."""
        index = min(range(len(self._load)), key=self._load.__getitem__)
        self._load[index] += 1
        self._tell(index)
        return self.instances[index]

    def leave(self, instance: Instance) -> None:
        """A sequence ended (finished, failed, or its client left): its seat goes to the next."""
        index = self.instances.index(instance)
        self._load[index] -= 1
        self._tell(index)
        self._free()
        self.queue.done()

    def _tell(self, index: int) -> None:
        if self.watch is not None:
            self.watch(self.instances[index], self._load[index])

    def _free(self) -> None:
        self.running -= 1
        while self._queue and self.running < self.capacity:
            waiter = heapq.heappop(self._queue)
            if not waiter.seat.done():  # not timed out or cancelled meanwhile
                self.running += 1
                waiter.seat.set_result(None)

    def cut(self) -> None:
        """The shutdown's grace is over: every stream still in flight or waiting is ended."""
        for task in list(self.tasks):
            task.cancel()

    def fail(self, error: DlscaleError) -> None:
        """Its engine can serve no more: refuse new requests and fail those waiting for a seat
        at once with `error` (the engine fails the sequences it holds); closing still follows."""
        self.queue.refuse(error)
        for waiter in self._queue:
            if not waiter.seat.done():
                waiter.seat.set_exception(error)


def _expire(seat: asyncio.Future[None], timeout_us: int) -> None:
    if not seat.done():
        seat.set_exception(
            TimedOut(f"request timed out waiting for a sequence slot (timeout {timeout_us} us)")
        )
