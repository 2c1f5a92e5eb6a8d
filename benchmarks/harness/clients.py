"""A closed-loop HTTP load client: N streams, each one keep-alive connection, one request at a time.

Every server is measured with this same client. It sends a prebuilt request, waits for the whole
response (parsed with httptools), records the latency, and sends the next at once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httptools
import numpy as np


@dataclass
class LoadResult:
    """What one closed-loop run measured (after its warm-up)."""

    concurrency: int
    duration_s: float
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""

    @property
    def throughput(self) -> float:
        """Successful requests per second."""
        return len(self.latencies_s) / self.duration_s if self.duration_s else 0.0

    def percentile_ms(self, q: float) -> float:
        """Latency percentile in milliseconds."""
        if not self.latencies_s:
            return float("nan")
        return float(np.percentile(self.latencies_s, q) * 1e3)

    def summary(self) -> dict[str, float]:
        """Throughput, p50, p99 and errors as plain numbers."""
        return {
            "throughput": round(self.throughput, 1),
            "p50_ms": round(self.percentile_ms(50), 3),
            "p99_ms": round(self.percentile_ms(99), 3),
            "requests": len(self.latencies_s),
            "errors": self.errors,
        }


def build_request(
    host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None = None
) -> bytes:
    """The bytes of one POST request with a keep-alive connection."""
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        f"Content-Length: {len(body)}",
        "Content-Type: application/json",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _Stream(asyncio.Protocol):
    """One connection; `request()` sends the prebuilt bytes and waits for the full answer."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.body: list[bytes] = []
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: False once an answer said `connection: close` (a server's requests-per-connection
        #: cap): the stream opens a new connection, as an HTTP client does.
        self.keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("the server closed the connection"))
        if not self.lost.done():
            self.lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.waiter is not None
        self.keep_alive = self.parser.should_keep_alive()
        self.waiter.set_result((self.parser.get_status_code(), b"".join(self.body)))
        self.body = []

    def request(self, wire: bytes) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(wire)
        return self.waiter


async def closed_loop(
    host: str,
    port: int,
    wire: bytes | list[bytes],
    concurrency: int,
    duration_s: float,
    warmup_s: float = 1.0,
) -> LoadResult:
    """Run `concurrency` streams for warm-up plus `duration_s`; count what completes after warm-up.

    `wire` is one prebuilt request or several that streams cycle through.
    """
    loop = asyncio.get_running_loop()
    requests = wire if isinstance(wire, list) else [wire]
    result = LoadResult(concurrency, duration_s)
    start = time.perf_counter()
    measure_from = start + warmup_s
    stop_at = measure_from + duration_s

    async def stream(index: int) -> None:
        transport, proto = await loop.create_connection(_Stream, host, port)
        n = index
        try:
            while (t0 := time.perf_counter()) < stop_at:
                if not proto.keep_alive:
                    transport.close()
                    transport, proto = await loop.create_connection(_Stream, host, port)
                status, body = await proto.request(requests[n % len(requests)])
                n += 1
                t1 = time.perf_counter()
                # Count what completes inside the window: in a closed loop that is the rate.
                if not measure_from <= t1 < stop_at:
                    continue
                if status == 200:
                    result.latencies_s.append(t1 - t0)
                else:
                    result.errors += 1
                    result.first_error = result.first_error or f"{status}: {body[:200]!r}"
        finally:
            transport.close()

    await asyncio.gather(*(stream(i) for i in range(concurrency)))
    return result
