"""An open-loop HTTP load: requests sent at the times of a seeded Poisson schedule.

Unlike the closed loop (clients.py), a slow answer does not delay the next request: each one
leaves at its scheduled time on an idle keep-alive connection (a new one when none is idle),
and its latency counts from that scheduled time, so a client that fell behind is charged to
the server, not hidden (no coordinated omission). The same seed gives every server the same
arrivals.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from benchmarks.harness.clients import LoadResult, _Stream


def poisson_schedule(rate: float, duration_s: float, seed: int) -> list[float]:
    """Arrival times (seconds from the start) of a Poisson process at `rate` per second."""
    rng = np.random.default_rng(seed)
    # Enough gaps for the whole window with a wide margin; the tail past it is cut.
    gaps = rng.exponential(1.0 / rate, int(rate * duration_s * 1.5) + 100)
    times = np.cumsum(gaps)
    return [float(t) for t in times[times < duration_s]]


async def open_loop(
    host: str,
    port: int,
    wire: bytes,
    schedule: list[float],
    warmup_s: float,
    drain_s: float = 30.0,
) -> LoadResult:
    """Send `wire` at each time of `schedule`; count the requests scheduled after `warmup_s`.

    The throughput is the answers to those over the time from `warmup_s` to the last answer:
    a server that keeps up answers at the schedule's rate, one that falls behind at less. A
    request unanswered `drain_s` after the last arrival is given up and counted as an error.
    """
    loop = asyncio.get_running_loop()
    result = LoadResult(concurrency=0, duration_s=0.0)
    idle: list[_Stream] = []
    start = time.perf_counter()

    async def send(due: float, measured: bool) -> None:
        while idle and idle[-1].lost.done():  # closed by the server while idle
            idle.pop()
        if idle:
            proto = idle.pop()
        else:
            _, proto = await loop.create_connection(_Stream, host, port)
        try:
            status, body = await proto.request(wire)
        except ConnectionError as error:
            status, body = 0, str(error).encode()
        latency = time.perf_counter() - due
        if not proto.lost.done():
            idle.append(proto)
        if not measured:
            return
        if status == 200:
            result.latencies_s.append(latency)
        else:
            result.errors += 1
            result.first_error = result.first_error or f"{status}: {body[:200]!r}"

    tasks = {}
    for offset in schedule:
        due = start + offset
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks[asyncio.create_task(send(due, offset >= warmup_s))] = offset >= warmup_s
    _, late = await asyncio.wait(tasks, timeout=drain_s)
    result.duration_s = max(time.perf_counter() - start - warmup_s, 1e-9)
    for task in late:
        task.cancel()
        if tasks[task]:
            result.errors += 1
            result.first_error = result.first_error or f"no answer {drain_s:g} s after the last"
    await asyncio.gather(*late, return_exceptions=True)
    for proto in idle:
        if proto.transport is not None:
            proto.transport.close()
    return result
