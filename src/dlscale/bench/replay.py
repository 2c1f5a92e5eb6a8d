"""An open loop over a trace: each request goes at its time, whatever earlier ones are doing.

The loop sleeps until a request's offset, starts it as a task of its own and moves on; no answer
is awaited before the next send, so a slow or saturated server meets the load the trace says, as
users would send it (a closed loop would slow down with the server and hide the burst). Requests
in flight are bounded (`max_in_flight`): past it a request is counted as failed (`client_cap`),
not queued in the client, where its wait would be charged to the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from dlscale.bench.goodput import Outcome
from dlscale.bench.trace import TraceRequest
from dlscale.errors import BenchError

#: Seconds a request may take before it is counted as failed (`timeout`).
REQUEST_TIMEOUT_S = 60.0
#: Requests in flight at most (each holds a task and a connection).
MAX_IN_FLIGHT = 4096

Send = Callable[[TraceRequest], Awaitable[object]]


async def replay(
    requests: Sequence[TraceRequest],
    send: Send,
    start: float,
    max_in_flight: int = MAX_IN_FLIGHT,
) -> list[Outcome]:
    """Send each request at `start` (the loop's clock, time.monotonic) plus its offset; the
    outcomes in the trace's order."""
    loop = asyncio.get_running_loop()
    outcomes: list[Outcome | None] = [None] * len(requests)
    in_flight = 0

    async def one(i: int, r: TraceRequest, sent: float) -> None:
        nonlocal in_flight
        try:
            await asyncio.wait_for(send(r), REQUEST_TIMEOUT_S)
            latency: float | None = loop.time() - sent
            error = ""
        except Exception as exc:  # every failure is counted by kind, none stops the load
            latency, error = None, error_kind(exc)
        finally:
            in_flight -= 1
        outcomes[i] = Outcome(r.offset_s, sent - start, r.model, r.tenant, latency, error)

    tasks = []
    for i, r in enumerate(requests):
        delay = start + r.offset_s - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = loop.time()
        if in_flight >= max_in_flight:
            outcomes[i] = Outcome(r.offset_s, sent - start, r.model, r.tenant, None, "client_cap")
            continue
        in_flight += 1
        tasks.append(asyncio.create_task(one(i, r, sent)))
    await asyncio.gather(*tasks)
    return [o for o in outcomes if o is not None]


def error_kind(exc: BaseException) -> str:
    """A failure's kind for the report: `http_<status>`, `timeout`, `connection` or `other`."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    text = str(exc)
    if isinstance(exc, BenchError) and "HTTP " in text:
        status = text.split("HTTP ", 1)[1][:3]
        if status.isdigit():
            return f"http_{status}"
    lowered = text.lower()
    if any(word in lowered for word in ("connect", "disconnect", "reset", "refused")):
        return "connection"
    return "other"
