"""A short warm-up that also tells LoadGen what to expect (latency of one sample, throughput)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from dlscale.bench.data import SampleSet
from dlscale.bench.targets import ModelInfo, Target
from dlscale.errors import BenchError


@dataclass(frozen=True)
class Probe:
    """What the warm-up measured: one sample's median latency, and samples per second."""

    latency_s: float
    throughput: float


#: How a Server run's rate is chosen when the user gives none (docs/bench.md).
DEFAULT_RATE_RULE = (
    "the lesser of a quarter of the warm-up's batched throughput and half the rate of one "
    "client sending one sample at a time"
)


def default_server_rate(measured: Probe) -> float:
    """A Server rate the target can be expected to hold, from the warm-up alone.

    A Server query is one sample in its own request, so the batched throughput overstates what
    it can take (in the demo's one process, 4x over: the run was INVALID at a quarter of it).
    One client sending one sample at a time reaches 1/latency, a rate the target reached with
    no concurrency at all; half of it leaves room for Poisson arrivals to bunch.
    """
    one_at_a_time = 0.5 / measured.latency_s if measured.latency_s > 0 else measured.throughput
    return max(1.0, round(min(measured.throughput / 4, one_at_a_time), 1))


async def probe(
    target: Target,
    info: ModelInfo,
    samples: SampleSet,
    batch_size: int,
    concurrency: int,
    seconds: float = 1.0,
) -> Probe:
    """Warm the target up and measure it; a target that fails here fails the bench at once."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds / 2
    while time.perf_counter() < deadline or len(latencies) < 3:
        t0 = time.perf_counter()
        await _send(target, info, samples, [len(latencies) % len(samples)])
        latencies.append(time.perf_counter() - t0)
    latencies.sort()
    rows = info.batch_limit(batch_size)
    done = 0
    start = time.perf_counter()
    stop = start + seconds / 2

    async def worker(k: int) -> None:
        nonlocal done
        i = k
        while time.perf_counter() < stop:
            await _send(target, info, samples, [(i + j) % len(samples) for j in range(rows)])
            done += rows
            i += rows

    await asyncio.gather(*(worker(k) for k in range(max(1, concurrency))))
    elapsed = time.perf_counter() - start
    return Probe(latencies[len(latencies) // 2], done / elapsed if elapsed > 0 else 0.0)


async def _send(target: Target, info: ModelInfo, samples: SampleSet, indices: list[int]) -> None:
    try:
        await target.infer(samples.request(info.batched, indices))
    except Exception as exc:  # the in-process target raises the server's own errors
        raise BenchError(f"{target.label}: model {info.name!r} fails to infer: {exc}") from None
