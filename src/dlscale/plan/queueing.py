"""Queueing model of a batching server: Poisson arrivals, a dynamic batcher, batch service times.

A short discrete-event simulation with a fixed seed, not a formula: a bulk-service queue whose
batches close on size or on the oldest request's delay has no closed-form p99. The batcher is
dlscale's own: the simulation applies the rules of `serving.policy.BatchPolicy`, the ones the
server's Batcher applies, to one-row requests of one priority. It does one step per batch (a
bisection finds who joins it), so 10,000 requests take milliseconds, and every load reuses the
same random draws scaled by 1/rate, so curves are smooth in the load. Why this and not an
approximation is in docs/plan.md.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from dlscale.errors import PlanError
from dlscale.models.config_sections import BatchingConfig
from dlscale.serving.policy import ArrivalGaps, BatchPolicy, Company

#: Seconds one device takes for a batch of the given size, running alone.
ServiceTime = Callable[[int], float]

DEFAULT_REQUESTS = 10_000
DEFAULT_SEED = 20_240_607
_WARMUP_SHARE = 0.05


def batching_policy(max_batch: int, max_delay: float, adaptive_delay: bool = True) -> BatchPolicy:
    """The server's policy for a max batch and a queue delay in seconds (rounded to whole µs).

    config.toml gives the delay in whole microseconds, so the planner plans with those.
    """
    if max_delay < 0:
        raise PlanError(f"max queue delay must be non-negative, got {max_delay}")
    config = BatchingConfig(
        max_queue_delay_us=round(max_delay * 1e6), adaptive_queue_delay=adaptive_delay
    )
    return BatchPolicy(max_batch, config)


@dataclass(frozen=True, eq=False)
class BatchingServer:
    """`devices` devices with `instances_per_device` model instances each, behind one queue.

    The batcher is dlscale's, with `policy` (serving/policy.py): when an instance is free it
    takes the oldest requests and sends them once they fill a batch or a preferred size, once
    the oldest has waited the queue delay, or at once when the adaptive delay expects no
    company (the smoothed gap between arrivals is longer than the delay, or the request
    arrived alone in flight after a lone batch: `Company`). Instances on one
    device share it, so a batch takes `instances_per_device` times its lone service time: more
    instances overlap work, they do not add compute. With `service_spread` (measured times
    divided by their mean, e.g. from repeated runs) each batch takes its mean time times one of
    them, drawn at random; without it every batch of a size takes exactly its mean.
    """

    service_time: ServiceTime
    policy: BatchPolicy
    devices: int = 1
    instances_per_device: int = 1
    service_spread: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.devices < 1 or self.instances_per_device < 1:
            raise PlanError("max batch, devices and instances must each be at least 1")
        if any(not 0 < f < math.inf for f in self.service_spread):
            raise PlanError("service spread factors must be positive and finite")

    @property
    def max_batch(self) -> int:
        """The most requests (of one row each) in a batch."""
        return self.policy.max_batch_size

    @cached_property
    def _identity(self) -> tuple[object, ...]:
        """All a run reads of the server: servers equal in it batch and serve alike.

        `service_time` is read through `batch_times` only, so two curves with the same times
        (tenants of one model, whatever their loads) make equal servers: `peak_rate`'s cache
        key.
        """
        policy = self.policy
        batching = policy.batching.model_dump_json()
        shape = (self.devices, self.instances_per_device, self.service_spread)
        return (self.batch_times, policy.max_batch_size, batching, *shape)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BatchingServer) and self._identity == other._identity

    def __hash__(self) -> int:
        return hash(self._identity)

    @cached_property
    def batch_times(self) -> tuple[float, ...]:
        """Seconds a batch of b rows (index b, 0 unused) holds an instance on a shared device."""
        share = self.instances_per_device
        return (0.0, *(self.service_time(b) * share for b in range(1, self.max_batch + 1)))

    @cached_property
    def sent_at_once(self) -> tuple[int, ...]:
        """With c one-row requests waiting (index c), how many the policy sends at once."""
        return tuple(self.policy.closing_prefix((1,) * c) for c in range(self.max_batch + 1))

    @cached_property
    def next_closing(self) -> tuple[int, ...]:
        """With c one-row requests waiting (index c), the fewest above c that close a batch."""
        top = self.max_batch
        above = [top] * (top + 1)
        for c in range(top - 1, -1, -1):
            above[c] = c + 1 if self.policy.closes_at(c + 1) else above[c + 1]
        return tuple(above)

    @property
    def capacity(self) -> float:
        """Requests/s with every instance busy on batches of its most efficient size.

        No rate at or above it can be sustained. Where larger batches are no cheaper per row
        (a CPU with no batching gain), greedy batching can saturate below it; the simulation
        then shows the growing queue.
        """
        instances = self.devices * self.instances_per_device
        return instances * max(b / t for b, t in enumerate(self.batch_times) if b)


@dataclass(frozen=True)
class LoadResult:
    """Latency of a batching server at one arrival rate; infinite past saturation."""

    rate: float
    mean: float
    p50: float
    p99: float
    mean_batch: float
    utilization: float


@lru_cache(maxsize=8)
def _unit_arrivals(n: int, seed: int) -> tuple[float, ...]:
    """Arrival times of a rate-1 Poisson process; scaled by 1/rate for any other rate."""
    gaps = np.random.default_rng(seed).standard_exponential(n)
    return tuple(np.cumsum(gaps).tolist())


@lru_cache(maxsize=8)
def _uniform_draws(n: int, seed: int) -> tuple[float, ...]:
    """One uniform draw in [0, 1) per batch, shared by every load (common random numbers)."""
    return tuple(np.random.default_rng(seed + 1).random(n).tolist())


@lru_cache(maxsize=8)
def _unit_smoothed_gaps(n: int, seed: int) -> tuple[float, ...]:
    """The batcher's smoothed gap after each arrival of `_unit_arrivals`, in rate-1 units."""
    return _smoothed_gaps(_unit_arrivals(n, seed))


def _smoothed_gaps(times: Sequence[float]) -> tuple[float, ...]:
    """The batcher's smoothed gap between arrivals after each of `times` (infinite after one)."""
    gaps, out = ArrivalGaps(), []
    for t in times:
        gaps.note(t)
        out.append(gaps.smoothed)
    return tuple(out)


@dataclass(frozen=True)
class Batches:
    """The batches of one run in the order they closed; requests join them oldest first."""

    closes: list[float]
    sizes: list[int]
    finishes: list[float]


def simulate(
    server: BatchingServer,
    rate: float,
    requests: int = DEFAULT_REQUESTS,
    seed: int = DEFAULT_SEED,
) -> LoadResult:
    """Latency percentiles of `server` under Poisson arrivals at `rate` requests/s."""
    if rate <= 0:
        raise PlanError(f"arrival rate must be positive, got {rate}")
    utilization = rate / server.capacity
    if utilization >= 1:
        return LoadResult(rate, math.inf, math.inf, math.inf, float(server.max_batch), utilization)
    scale = 1.0 / rate
    arrivals = [t * scale for t in _unit_arrivals(requests, seed)]
    # The smoothed gaps scale with the arrivals: those of the rate-1 trace serve every load.
    smoothed = _unit_smoothed_gaps(requests, seed)
    run = _batches(server, arrivals, smoothed, scale, _uniform_draws(requests, seed))
    done = np.repeat(np.asarray(run.finishes), run.sizes)
    latency = (done - np.asarray(arrivals))[int(requests * _WARMUP_SHARE) :]
    p50, p99 = np.percentile(latency, [50, 99])
    mean = float(latency.mean())
    return LoadResult(rate, mean, float(p50), float(p99), requests / len(run.sizes), utilization)


def replay(server: BatchingServer, arrivals: Sequence[float], seed: int = DEFAULT_SEED) -> Batches:
    """The batches `server` forms from one-row requests arriving at `arrivals` (s, ascending)."""
    times = list(arrivals)
    return _batches(server, times, _smoothed_gaps(times), 1.0, _uniform_draws(len(times), seed))


def _batches(
    server: BatchingServer,
    arrivals: list[float],
    smoothed: Sequence[float],
    scale: float,
    draws: Sequence[float],
) -> Batches:
    """Run the batcher over `arrivals`; `smoothed` gaps are in units of 1/`scale` seconds.

    Each step is one batch, decided as `BatchPolicy.to_send` decides: at the moment an
    instance is free (`start`), the waiting requests that close a batch go; otherwise the batch
    waits for the arrival that completes a closing size, the delay, or (adaptive) the first
    arrival after which no company is expected, whichever comes first; a request that arrives
    alone (`Company`) goes as it arrives.
    """
    policy, cost = server.policy, server.batch_times
    at_once, above = server.sent_at_once, server.next_closing
    # Without the adaptive delay no gap ever stops a wait: skip looking at them.
    gaps_matter = not policy.worth_waiting(math.inf)
    company = Company()
    # Spread factors rescaled to mean 1: the spread must not change the mean service time.
    factors = server.service_spread
    spread = [f * len(factors) / sum(factors) for f in factors]
    free = [0.0] * (server.devices * server.instances_per_device)  # a heap of free times
    closes: list[float] = []
    sizes: list[int] = []
    finishes: list[float] = []
    replace, i, n, top = heapq.heapreplace, 0, len(arrivals), server.max_batch
    while i < n:
        head = arrivals[i]
        start = free[0] if free[0] > head else head
        if i + 1 == n or arrivals[i + 1] > start:
            waiting = 1  # the common case at light load: no bisection
        else:
            waiting = bisect_right(arrivals, start, i, n) - i
            waiting = top if waiting > top else waiting
        if at_once[waiting]:
            close, j = start, i + at_once[waiting]
        else:
            target = above[waiting]
            # Asked first, as the Batcher asks as each request arrives: a probe expects company.
            alone = gaps_matter and _arrives_alone(policy, company, arrivals, free, i)
            deadline, last = policy.close_by(head), i + target - 1
            if last < n and arrivals[last] < deadline:
                deadline = arrivals[last]
            if gaps_matter and deadline > start and not company.expected:
                deadline = _stop_waiting(policy, arrivals, smoothed, scale, i, start, deadline)
            close = start if start > deadline else deadline
            if alone:
                close = head  # every instance is free: the batch starts as it arrives
            j = bisect_right(arrivals, close, i, n)
            j = i + target if j > i + target else j
        took = cost[j - i]
        if spread:
            took *= spread[int(draws[len(sizes)] * len(spread))]
        # In flight beside it as it goes: the requests left waiting, else the batches computing
        # (counted as busy instances: only whether there are any matters).
        others = bisect_right(arrivals, close, j, n) - j
        others = others or sum(1 for f in free if f > close)
        company.sent(j - i, others, close >= policy.close_by(head))
        replace(free, close + took)
        closes.append(close)
        sizes.append(j - i)
        finishes.append(close + took)
        i = j
    return Batches(closes, sizes, finishes)


def _stop_waiting(
    policy: BatchPolicy,
    arrivals: list[float],
    smoothed: Sequence[float],
    scale: float,
    head: int,
    start: float,
    deadline: float,
) -> float:
    """When an adaptive batcher stops waiting for company: at `start`, an arrival, or `deadline`.

    It stops at the first moment the policy expects no company, given the smoothed gap after
    the latest arrival it has seen. (With the policy's smoothing only the check at `start` can
    stop a wait: a gap inside the wait is shorter than the delay, so the smoothed gap cannot
    rise past it. The loop asks at every arrival all the same, as the Batcher does.)
    """
    seen = bisect_right(arrivals, start, head) - 1  # the latest arrival the batcher has seen
    if not policy.worth_waiting(smoothed[seen] * scale):
        return start
    for k in range(seen + 1, len(arrivals)):
        if arrivals[k] >= deadline:
            break
        if not policy.worth_waiting(smoothed[k] * scale):
            return arrivals[k]
    return deadline


def _arrives_alone(
    policy: BatchPolicy, company: Company, arrivals: list[float], free: list[float], head: int
) -> bool:
    """Whether the head goes as it arrives, alone in flight (`Company`): every batch before
    it has ended (each request before it is in one) and none arrives with it."""
    if max(free) > arrivals[head] or policy.worth_waiting(0.0, company.arrives_alone(0)):
        return False
    return head + 1 == len(arrivals) or arrivals[head + 1] > arrivals[head]


@lru_cache(maxsize=1024)
def peak_rate(
    server: BatchingServer,
    p99_bound: float,
    requests: int = DEFAULT_REQUESTS,
    steps: int = 10,
) -> float:
    """The highest arrival rate (requests/s) whose p99 stays within `p99_bound` seconds.

    Bisection between a near-idle load and saturation. A server that misses the bound when
    almost idle (one request waiting the full delay, served alone) gets 0: a deployment must
    hold its SLO at low load too. Kept for servers equal in what a run reads: a plan asks again
    for tenants of one model and p99, whatever their loads.
    """
    if p99_bound <= 0:
        raise PlanError(f"p99 bound must be positive, got {p99_bound}")
    hi = server.capacity
    lo = hi * 1e-3
    if simulate(server, lo, requests).p99 > p99_bound:
        return 0.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        if simulate(server, mid, requests).p99 <= p99_bound:
            lo = mid
        else:
            hi = mid
    return lo
