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


async def probe(
    target: Target,
    info: ModelInfo,
    samples: SampleSet,
    batch_size: int,
    concurrency: int,
    seconds: float = 1.0,
) -> Probe:
    """Warm the target up and measure it; a target that fails here fails the bench at once."""
    latencies = []
    deadline = time.perf_counter() + seconds / 2
    n = 0
    while time.perf_counter() < deadline or n < 3:
        t0 = time.perf_counter()
        await _send(target, info, samples, [n % len(samples)])
        latencies.append(time.perf_counter() - t0)
        n += 1
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
        if info.batched:
            await target.infer(samples.rows(indices))
        else:
            await target.infer(samples.one(indices[0]))
    except BenchError as exc:
        raise BenchError(f"{target.label}: model {info.name!r} fails to infer: {exc}") from None
    except Exception as exc:  # the in-process target raises the server's own errors
        raise BenchError(f"{target.label}: model {info.name!r} fails to infer: {exc}") from None
