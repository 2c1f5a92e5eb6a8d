"""The loads a run offers: a closed loop at a concurrency, and an open loop on a schedule.

A concurrency point keeps N streams in flight (each worker sends its next request when its last
stream ends), as aiperf's `--concurrency` does. A rate point and a trace replay are open loops:
each request goes out at its offset from the run's start (Poisson arrivals for a rate, drawn
from the seed; the trace's own timestamps for a replay), whether or not earlier ones ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dlscale.bench.generative.client import StreamClient
from dlscale.bench.generative.endpoints import Ask
from dlscale.bench.generative.records import StreamRecord
from dlscale.errors import BenchError

#: Streams in flight at most in an open loop (a bound on the client's own sockets and tasks).
MAX_IN_FLIGHT = 4096


@dataclass(frozen=True)
class Job:
    """One request to send: what it asks, its prompt's tokens, and when (open loops)."""

    ask: Ask
    input_tokens: int
    offset_s: float | None = None


#: Told of each request as it ends, whether it streamed an answer (the bench's progress line).
OnDone = Callable[[bool], None]


async def _one(client: StreamClient, job: Job, on_done: OnDone | None = None) -> StreamRecord:
    record = await client.stream(job.ask, scheduled_s=job.offset_s)
    record.input_tokens = job.input_tokens
    if on_done is not None:
        on_done(record.ok)
    return record


async def closed_loop(
    client: StreamClient, jobs: Sequence[Job], concurrency: int, on_done: OnDone | None = None
) -> list[StreamRecord]:
    """Every job, `concurrency` streams in flight; records in the order they were sent."""
    if concurrency < 1:
        raise BenchError(f"concurrency must be at least 1, not {concurrency}")
    pending = list(reversed(jobs))
    records: list[StreamRecord] = []

    async def worker() -> None:
        while pending:
            job = pending.pop()
            records.append(await _one(client, job, on_done))

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(jobs)))))
    return sorted(records, key=lambda r: r.sent_ns)


async def open_loop(
    client: StreamClient, jobs: Sequence[Job], on_done: OnDone | None = None
) -> list[StreamRecord]:
    """Each job sent at its `offset_s` from now, in offset order; records in sending order."""
    ordered = sorted(jobs, key=lambda j: j.offset_s or 0.0)
    limit = asyncio.Semaphore(MAX_IN_FLIGHT)
    start = time.perf_counter()
    tasks = []

    async def send(job: Job) -> StreamRecord:
        async with limit:
            return await _one(client, job, on_done)

    for job in ordered:
        delay = start + (job.offset_s or 0.0) - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(job)))
        await asyncio.sleep(0)  # let it send before the next is scheduled
    records = await asyncio.gather(*tasks)
    return sorted(records, key=lambda r: r.sent_ns)


def poisson_offsets(count: int, rate: float, seed: int) -> list[float]:
    """Arrival offsets (s) of `count` requests at `rate` per second, exponential gaps, seeded."""
    if not rate > 0:
        raise BenchError(f"a request rate must be positive, not {rate}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, count)
    gaps[0] = 0.0
    return [float(t) for t in np.cumsum(gaps)]
