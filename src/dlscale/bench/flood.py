"""A noisy neighbor: a closed loop of requests to one target, until it is told to stop."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from dlscale.bench.data import SampleSet
from dlscale.bench.targets import ModelInfo, Target


@dataclass
class FloodLog:
    """When each answer came (perf_counter seconds) and how many rows it held; the failures."""

    done: list[tuple[float, int]] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""

    def rate(self, start: float, end: float) -> float:
        """Rows answered per second between `start` and `end`."""
        if end <= start:
            return 0.0
        return sum(rows for at, rows in self.done if start <= at <= end) / (end - start)


async def flood(
    target: Target,
    info: ModelInfo,
    samples: SampleSet,
    batch: int,
    concurrency: int,
    stop: asyncio.Event,
) -> FloodLog:
    """`concurrency` clients each send a request of `batch` rows as soon as the last is answered.

    A failed request is counted and the client goes on: a neighbor refused by its rate limit
    keeps knocking, as a real one would.
    """
    log = FloodLog()
    rows = info.batch_limit(batch)

    async def client(k: int) -> None:
        i = k * rows
        while not stop.is_set():
            indices = [(i + j) % len(samples) for j in range(rows)]
            i += rows * concurrency
            try:
                await target.infer(samples.request(info.batched, indices))
            except Exception as exc:  # the neighbor's failures are its own; keep flooding
                log.errors += rows
                log.first_error = log.first_error or f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(0.001)  # a refusal is instant: do not spin on it
                continue
            log.done.append((time.perf_counter(), rows))

    await asyncio.gather(*(client(k) for k in range(max(1, concurrency))))
    return log
