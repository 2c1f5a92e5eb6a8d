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

from dlscale.models.config_sections import BatchingConfig
from dlscale.serving.batcher import Batcher
from dlscale.serving.observe.stats import ModelStats, RequestTimes
from dlscale.serving.policy import PROBE_FIRST, BatchPolicy

T = TypeVar("T")
DELAY_US = 1_000_000  # a second: a request that waits it is plain to see in virtual time
#: How long a frontend that hands the server one call at a time takes to hand over the next
#: while the loop is free (the crowd test).
HAND_OVER = 1e-4


def _service(rows: int) -> float:
    """1 ms a batch and 0.1 ms a row."""
    return 1e-3 + 1e-4 * rows


def _in_virtual_time(
    main: Callable[[Batcher], Awaitable[T]],
    max_batch: int = 8,
    service: Callable[[int], float] = _service,
) -> T:
    async def run() -> T:
        loop = asyncio.get_running_loop()
        policy = BatchPolicy(max_batch, BatchingConfig(max_queue_delay_us=DELAY_US))
        batcher = Batcher(policy, [Sleeper("s-0", service)], ModelStats("m", "1"), loop.time)  # type: ignore[list-item]
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


def test_a_lone_closed_loop_client_waits_the_delay_only_to_probe() -> None:
    # Its requests come 1.1 ms apart, far within the 1 s delay: the smoothed gap between
    # arrivals expects company, yet none can come while the client waits on its answer. Only
    # the probes wait (policy.py, `Company`): the 16th request, then 32 requests later (a probe
    # that found none doubles the interval), then 64 later.
    served = _in_virtual_time(lambda b: _client(b, 120))
    waited = [i for i, (_, wait) in enumerate(served) if wait]
    assert waited == [PROBE_FIRST - 1, 3 * PROBE_FIRST - 1, 7 * PROBE_FIRST - 1]
    assert {size for size, _ in served} == {1} and {wait for _, wait in served} == {0, 1.0}


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


def test_a_crowd_handed_over_one_call_at_a_time_finds_company_by_a_probe() -> None:
    async def main(batcher: Batcher) -> list[tuple[int, float]]:
        # Eight clients behind a frontend that hands the server one call at a time, as grpcio
        # does: the next call only once the one before is answered, or once the loop is free
        # again for `HAND_OVER` seconds because it waits. Each batch computes in no time (as a
        # tiny model on the event loop does), so nothing is ever in flight as a call arrives.
        served: list[tuple[int, float]] = []
        waiting = 8  # clients whose next call waits to be handed over
        running: set[asyncio.Task[tuple[int, float]]] = set()
        while len(served) < 200:
            if waiting:
                waiting -= 1
                running.add(asyncio.ensure_future(_one(batcher)))
            done, _ = await asyncio.wait(running, timeout=HAND_OVER, return_when="FIRST_COMPLETED")
            for task in done:
                running.discard(task)
                served.append(task.result())
                waiting += 1  # its client sends again
        return served

    sizes = [size for size, _ in _in_virtual_time(main, service=lambda rows: 0.0)]
    # Alone at first (each call arrives at an idle model after a lone batch), until the probe:
    # it waits, the next call comes in meanwhile, and from then on the batches fill.
    first = next(i for i, size in enumerate(sizes) if size > 1)
    assert sizes[:first] == [1] * first and first < PROBE_FIRST
    assert all(size > 1 for size in sizes[first:-1])
    assert sizes.count(8) > len(sizes) // 10
