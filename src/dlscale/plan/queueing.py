"""Queueing model of a batching server: Poisson arrivals, a dynamic batcher, batch service times.

A short discrete-event simulation with a fixed seed, not a formula: a bulk-service queue whose
batches close on size or on the oldest request's delay has no closed-form p99. The simulation
does one step per batch (a bisection finds who joins it), so 10,000 requests take milliseconds,
and every load reuses the same random draws scaled by 1/rate, so curves are smooth in the load.
Why this and not an approximation is in docs/plan.md.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from dlscale.errors import PlanError

#: Seconds one device takes for a batch of the given size, running alone.
ServiceTime = Callable[[int], float]

DEFAULT_REQUESTS = 10_000
DEFAULT_SEED = 20_240_607
_WARMUP_SHARE = 0.05
#: Weight of the newest gap in the batcher's smoothed gap between arrivals (serving/batcher.py).
GAP_SMOOTHING = 0.2


@dataclass(frozen=True)
class BatchingServer:
    """`devices` devices with `instances_per_device` model instances each, behind one queue.

    The batcher works as dlscale's (serving/batcher.py): when an instance is free it takes the
    oldest request and closes the batch when `max_batch` requests wait or the oldest has waited
    `max_delay`. With `adaptive_delay` (dlscale's default) it does not wait while the smoothed
    gap between arrivals is longer than `max_delay`; without it, it always waits, as Triton's
    dynamic batcher does. Instances on one device share it, so a batch takes
    `instances_per_device` times its lone service time: more instances overlap work, they do
    not add compute. With `service_spread` (measured times divided by their mean, e.g. from
    repeated runs) each batch takes its mean time times one of them, drawn at random; without
    it every batch of a size takes exactly its mean.
    """

    service_time: ServiceTime
    max_batch: int
    max_delay: float
    devices: int = 1
    instances_per_device: int = 1
    adaptive_delay: bool = True
    service_spread: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.devices < 1 or self.instances_per_device < 1:
            raise PlanError("max batch, devices and instances must each be at least 1")
        if self.max_delay < 0:
            raise PlanError(f"max queue delay must be non-negative, got {self.max_delay}")
        if any(not 0 < f < math.inf for f in self.service_spread):
            raise PlanError("service spread factors must be positive and finite")

    @cached_property
    def batch_times(self) -> tuple[float, ...]:
        """Seconds a batch of b rows (index b, 0 unused) holds an instance on a shared device."""
        share = self.instances_per_device
        return (0.0, *(self.service_time(b) * share for b in range(1, self.max_batch + 1)))

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

    @property
    def saturated(self) -> bool:
        """Whether the rate is at or above what the server can sustain."""
        return math.isinf(self.p99)


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
    """The batcher's smoothed gap after each arrival of `_unit_arrivals` (infinite after one)."""
    times = _unit_arrivals(n, seed)
    out, gap = [math.inf], math.inf
    for k in range(1, n):
        new = times[k] - times[k - 1]
        gap = new if math.isinf(gap) else (1 - GAP_SMOOTHING) * gap + GAP_SMOOTHING * new
        out.append(gap)
    return tuple(out)


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
    # The batcher waits only while the smoothed gap is at most the delay; in rate-1 units:
    smoothed = _unit_smoothed_gaps(requests, seed) if server.adaptive_delay else None
    patience = server.max_delay * rate
    big, delay, cost = server.max_batch, server.max_delay, server.batch_times
    # Spread factors rescaled to mean 1: the spread must not change the mean service time.
    spread = [
        f * len(server.service_spread) / sum(server.service_spread) for f in server.service_spread
    ]
    draws = _uniform_draws(requests, seed) if spread else ()
    free = [0.0] * (server.devices * server.instances_per_device)  # a heap of free times
    sizes: list[int] = []
    finishes: list[float] = []
    replace, i, n = heapq.heapreplace, 0, requests
    while i < n:
        head = arrivals[i]
        start = free[0] if free[0] > head else head
        last = i + big - 1
        if last < n and arrivals[last] <= start:
            close, j = start, i + big
        else:
            deadline = head + delay
            if last < n and arrivals[last] < deadline:
                deadline = arrivals[last]
            if smoothed is not None and deadline > start:
                deadline = _stop_waiting(arrivals, smoothed, patience, start, deadline, i)
            close = start if start > deadline else deadline
            j = min(bisect_right(arrivals, close, i, n), i + big)
        took = cost[j - i]
        if spread:
            took *= spread[int(draws[len(sizes)] * len(spread))]
        finish = close + took
        replace(free, finish)
        sizes.append(j - i)
        finishes.append(finish)
        i = j
    done = np.repeat(np.asarray(finishes), sizes)
    latency = (done - np.asarray(arrivals))[int(n * _WARMUP_SHARE) :]
    p50, p99 = np.percentile(latency, [50, 99])
    mean = float(latency.mean())
    return LoadResult(rate, mean, float(p50), float(p99), n / len(sizes), utilization)


def _stop_waiting(
    arrivals: list[float],
    smoothed: tuple[float, ...],
    patience: float,
    start: float,
    deadline: float,
    head: int,
) -> float:
    """When an adaptive batcher stops waiting for company: at `start`, an arrival, or `deadline`.

    It stops at the first moment its smoothed gap between arrivals exceeds the delay.
    """
    seen = bisect_right(arrivals, start, head) - 1  # the latest arrival the batcher has seen
    if smoothed[seen] > patience:
        return start
    for k in range(seen + 1, len(arrivals)):
        if arrivals[k] >= deadline:
            break
        if smoothed[k] > patience:
            return arrivals[k]
    return deadline


def peak_rate(
    server: BatchingServer,
    p99_bound: float,
    requests: int = DEFAULT_REQUESTS,
    steps: int = 10,
) -> float:
    """The highest arrival rate (requests/s) whose p99 stays within `p99_bound` seconds.

    Bisection between a near-idle load and saturation. A server that misses the bound when
    almost idle (one request waiting the full delay, served alone) gets 0: a deployment must
    hold its SLO at low load too.
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
