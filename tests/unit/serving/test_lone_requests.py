"""A request alone in flight does not wait for company; requests that come together batch.

The real Batcher runs on an event loop of virtual time (its clock jumps from timer to timer),
with instance stand-ins that hold a batch of b rows for s(b) of that clock: each request's
queue wait is read exactly (0: it was sent the moment it came), never measured.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import numpy as np
from tests.unit.plan.test_queueing_vs_batcher import Sleeper, VirtualClockLoop

from dlscale.models.config import BatchingConfig
from dlscale.serving.batcher import Batcher
from dlscale.serving.observe.stats import ModelStats, RequestTimes
from dlscale.serving.policy import BatchPolicy

T = TypeVar("T")
DELAY_US = 1_000_000  # a second: a request that waits it is plain to see in virtual time


def _service(rows: int) -> float:
    """1 ms a batch and 0.1 ms a row."""
    return 1e-3 + 1e-4 * rows


def _in_virtual_time(main: Callable[[Batcher], Awaitable[T]], max_batch: int = 8) -> T:
    async def run() -> T:
        loop = asyncio.get_running_loop()
        policy = BatchPolicy(max_batch, BatchingConfig(max_queue_delay_us=DELAY_US))
        batcher = Batcher(policy, [Sleeper("s-0", _service)], ModelStats("m", "1"), loop.time)  # type: ignore[list-item]
        batcher.start()
        try:
            return await main(batcher)
        finally:
            await batcher.close()

    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


async def _one(batcher: Batcher) -> tuple[int, float]:
    """Send one row and wait for it: the size of its batch and its wait in the queue (s)."""
    times = RequestTimes()
    out = await batcher.infer({"x": np.zeros((1, 1), np.float32)}, times=times)
    return int(out["rows"][0]), (times.compute_start - times.queue_start) / 1e9


async def _client(batcher: Batcher, requests: int, think: float = 0.0) -> list[tuple[int, float]]:
    """A closed-loop client: the next request `think` seconds after the answer is in."""
    served = []
    for _ in range(requests):
        served.append(await _one(batcher))
        await asyncio.sleep(think)
    return served


def test_a_lone_closed_loop_client_never_waits_the_delay() -> None:
    # Its requests come 1.1 ms apart, far within the 1 s delay: the smoothed gap between
    # arrivals expects company, yet none can come while the client waits on its answer.
    served = _in_virtual_time(lambda b: _client(b, 20))
    assert served == [(1, 0.0)] * 20


def test_requests_that_come_together_still_batch() -> None:
    async def main(batcher: Batcher) -> list[tuple[int, float]]:
        await _client(batcher, 3)  # a lone spell first: the rule is on
        return await asyncio.gather(*(_one(batcher) for _ in range(5)))

    # Five in flight at once: they wait the delay together and go as one batch.
    assert _in_virtual_time(main, max_batch=16) == [(5, DELAY_US / 1e6)] * 5


def test_after_a_batch_with_company_a_lone_request_waits_once() -> None:
    async def main(batcher: Batcher) -> list[tuple[int, float]]:
        await asyncio.gather(*(_one(batcher) for _ in range(8)))  # a full batch of 8
        return await _client(batcher, 3)

    # The first wave's clients may be about to come back: the first lone request waits the
    # delay for them; it went out alone, so the next ones do not.
    assert _in_virtual_time(main) == [(1, DELAY_US / 1e6), (1, 0.0), (1, 0.0)]


def test_a_closed_loop_of_many_clients_keeps_full_batches() -> None:
    async def main(batcher: Batcher) -> list[tuple[int, float]]:
        # Each client takes its own time to send again (10 to 80 us): after each batch the
        # first request back finds the model idle, with the other seven on their way.
        clients = (_client(batcher, 10, think=1e-5 * (k + 1)) for k in range(8))
        runs = await asyncio.gather(*clients)
        return [served for run in runs for served in run]

    served = _in_virtual_time(main)
    # Every batch is full, none waits the delay: the first back waits for the others, since
    # the batch before had company.
    assert {size for size, _ in served} == {8}
    assert max(wait for _, wait in served) < DELAY_US / 1e6


def test_requests_that_trickle_in_while_a_batch_computes_wait_for_company() -> None:
    async def main(batcher: Batcher) -> list[tuple[int, float]]:
        # Eight clients whose requests come 0.2 ms apart, each while the one before computes
        # (a batch takes 1.1 ms or more): none of them is alone, though each would be by the
        # time the batch before it ends.
        async def client(k: int) -> list[tuple[int, float]]:
            await asyncio.sleep(2e-4 * k)
            return await _client(batcher, 5)

        runs = await asyncio.gather(*(client(k) for k in range(8)))
        return [served for run in runs for served in run]

    sizes = [size for size, _ in _in_virtual_time(main)]
    # The first goes alone (a fresh, idle model); the others wait for company and fill batches.
    assert sizes.count(1) == 1 and sizes.count(7) + sizes.count(8) == len(sizes) - 1
