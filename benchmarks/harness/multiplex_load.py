"""The many-models mix as one client sends it to any server: dlscale and Ray Serve's multiplexing.

Every request goes to /v2/models/<model>/infer with the model also in Ray's
`serve_multiplexed_model_id` header (dlscale reads the path, Ray's proxy the header), the same
OIP JSON body, over the harness's keep-alive HTTP streams (clients.py). Two loads:

- open: each request of the seeded Zipf/Poisson schedule (dlscale.bench.multimodel.Mix) leaves
  at its time, whatever the answers do; its latency counts from that time, so a server that
  falls behind is charged for it (open_loop.py's rule);
- closed: `concurrency` streams send the schedule's models in its order, the next one as soon
  as an answer comes, for a fixed time: the server's ceiling on the mix.

A request is resident or cold as `dlscale bench multimodel` counts it: by the server's
repository index as last sampled (every 100 ms) before it left (IndexSampler).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterator

from benchmarks.harness.clients import _Stream, build_request
from benchmarks.harness.servers import HOST
from dlscale.bench.multimodel import IndexSampler, Sent

#: Ray Serve's HTTP proxy routes a request to a replica holding this model (constants.py).
HEADER = "serve_multiplexed_model_id"


def wires(port: int, models: tuple[str, ...], body: bytes) -> dict[str, bytes]:
    """Each model's request, path and header naming it."""
    return {
        m: build_request(HOST, port, f"/v2/models/{m}/infer", body, {HEADER: m}) for m in models
    }


class Streams:
    """Idle keep-alive connections to one port, reused, a new one opened when none is idle."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[_Stream] = []

    async def send(self, wire: bytes) -> int:
        """The answer's status (0 when the connection failed)."""
        while self.idle and self.idle[-1].lost.done():  # closed by the server while idle
            self.idle.pop()
        try:
            if self.idle:
                proto = self.idle.pop()
            else:
                loop = asyncio.get_running_loop()
                _, proto = await loop.create_connection(_Stream, HOST, self.port)
            status, _ = await proto.request(wire)
        except OSError:  # refused, reset, or closed before the answer
            return 0
        if proto.keep_alive and not proto.lost.done():
            self.idle.append(proto)
        elif proto.transport is not None:
            proto.transport.close()
        return status

    def close(self) -> None:
        """Close every idle connection."""
        for proto in self.idle:
            if proto.transport is not None:
                proto.transport.close()


def _cold(sampler: IndexSampler, model: str) -> bool:
    latest = sampler.latest()
    return latest is None or model not in latest.ready


async def open_mix(
    port: int,
    schedule: list[tuple[float, str]],
    requests: dict[str, bytes],
    sampler: IndexSampler,
    drain_s: float = 60.0,
) -> list[Sent]:
    """Each request at its time; one unanswered `drain_s` after the last is status 0."""
    streams = Streams(port)
    sent: list[Sent] = []
    start = time.perf_counter()

    async def one(at: float, model: str) -> None:
        cold = _cold(sampler, model)
        status = await streams.send(requests[model])
        sent.append(Sent(at, model, time.perf_counter() - start - at, status, cold))

    tasks: dict[asyncio.Task[None], tuple[float, str]] = {}
    for at, model in schedule:
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks[asyncio.create_task(one(at, model))] = (at, model)
    _, late = await asyncio.wait(tasks, timeout=drain_s)
    for task in late:
        task.cancel()
        at, model = tasks[task]
        sent.append(Sent(at, model, time.perf_counter() - start - at, 0, _cold(sampler, model)))
    await asyncio.gather(*late, return_exceptions=True)
    streams.close()
    return sorted(sent, key=lambda s: s.at)


async def closed_mix(
    port: int,
    order: list[str],
    requests: dict[str, bytes],
    sampler: IndexSampler,
    concurrency: int,
    duration_s: float,
    drain_s: float = 60.0,
) -> list[Sent]:
    """`concurrency` streams taking the next model of `order` (cycled) for `duration_s`; the
    requests that complete inside the window (streams still waiting `drain_s` after it are
    dropped)."""
    models: Iterator[str] = itertools.cycle(order)
    sent: list[Sent] = []
    start = time.perf_counter()
    stop_at = start + duration_s

    async def stream() -> None:
        streams = Streams(port)
        try:
            while (t0 := time.perf_counter()) < stop_at:
                model = next(models)
                cold = _cold(sampler, model)
                status = await streams.send(requests[model])
                if (t1 := time.perf_counter()) < stop_at:
                    sent.append(Sent(t0 - start, model, t1 - t0, status, cold))
        finally:
            streams.close()

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(
            asyncio.gather(*(stream() for _ in range(concurrency))), duration_s + drain_s
        )
    return sorted(sent, key=lambda s: s.at)
