"""The planner's simulation and the server's real Batcher batch one arrival trace the same way.

The real `serving.batcher.Batcher` runs on an event loop whose clock jumps to its next timer
instead of sleeping (the Batcher reads that clock too), with instance stand-ins that hold a
batch of b rows for s(b) seconds of it; `plan.queueing.replay` runs the same policy over the
same arrivals. Every request must land in a batch of the same size after the same queue wait.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from dlscale.models.config_sections import BatchingConfig
from dlscale.plan.queueing import BatchingServer, replay
from dlscale.serving.batcher import Batcher
from dlscale.serving.instance import Then
from dlscale.serving.observe.stats import ModelStats, RequestTimes
from dlscale.serving.policy import BatchPolicy

ServiceTime = Callable[[int], float]


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock starts at 0 and jumps to its next timer instead of waiting."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.now


class _JumpingSelector(selectors.BaseSelector):
    """Polls the loop's real file descriptors without blocking; a wait moves the clock instead."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        self._loop = loop
        self._real = selectors.DefaultSelector()

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # nothing scheduled and nothing ready: a real loop would hang
            raise RuntimeError("the virtual clock has no timer to jump to")
        self._loop.now += timeout  # the loop asked to wait until its next timer
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()


class Sleeper:
    """An instance stand-in: a batch of b rows holds it for s(b) seconds of the loop's clock.

    The Batcher needs only an instance's `name`, `slots` (batches it takes at once: one, as the
    simulation's instances) and `start`. Each row's outputs say the size of the batch it ran in
    and when that batch started.
    """

    def __init__(self, name: str, service: ServiceTime) -> None:
        self.name = name
        self.service = service
        self.slots = 1
        self.takes_requests = False

    def start(self, inputs: Mapping[str, np.ndarray], then: Then, context: Any = None) -> None:
        start_by_infer(self.infer(inputs), then)

    async def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = len(inputs["x"])
        started = asyncio.get_running_loop().time()
        await asyncio.sleep(self.service(rows))
        return {"rows": np.full(rows, rows), "started": np.full(rows, started)}


def start_by_infer(computing: Coroutine[Any, Any, dict[str, np.ndarray]], then: Then) -> None:
    """`Instance.start` (what the Batcher calls) for a stand-in that computes in a coroutine:
    its outcome is handed to `then` on the loop, as the instance's thread hands it."""

    def done(task: asyncio.Task[dict[str, np.ndarray]]) -> None:
        error = task.exception()
        if error is None:
            then(task.result(), None)
        else:
            then(None, error)

    asyncio.ensure_future(computing).add_done_callback(done)


@dataclass(frozen=True)
class Served:
    """What each request of a trace saw: its batch's size and its wait in the queue (s)."""

    sizes: list[int]
    waits: list[float]
    queue_ns: int  # the Batcher's own statistics: total queue time in nanoseconds
    batches: int


def batcher_serves(
    policy: BatchPolicy, instances: int, service: ServiceTime, arrivals: list[float]
) -> Served:
    """The real Batcher serves one-row requests arriving at `arrivals`, in virtual time."""

    async def run() -> Served:
        loop = asyncio.get_running_loop()
        sleepers = [Sleeper(f"sleeper-{k}", service) for k in range(instances)]
        batcher = Batcher(policy, sleepers, ModelStats("m", "1"), clock=loop.time)
        batcher.start()
        futures, times = [], [RequestTimes() for _ in arrivals]
        for t, stamps in zip(arrivals, times, strict=True):
            await asyncio.sleep(t - loop.time())
            futures.append(batcher.submit({"x": np.zeros((1, 1), np.float32)}, times=stamps))
        outputs = await asyncio.gather(*futures)
        await batcher.close()
        sizes = [int(o["rows"][0]) for o in outputs]
        waits = [float(o["started"][0]) - t for o, t in zip(outputs, arrivals, strict=True)]
        queue_ns = sum(s.compute_start - s.queue_start for s in times)
        return Served(sizes, waits, queue_ns, batcher.stats.execution_count)

    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


def planner_predicts(
    policy: BatchPolicy, instances: int, service: ServiceTime, arrivals: list[float]
) -> Served:
    """The planner's simulation of the same trace."""
    # Each stand-in computes on its own: as many devices, not instances sharing one device.
    batches = replay(BatchingServer(service, policy, devices=instances), arrivals)
    sizes = [size for size in batches.sizes for _ in range(size)]
    pairs = zip(batches.closes, batches.sizes, strict=True)
    closes = [close for close, size in pairs for _ in range(size)]
    waits = [c - t for c, t in zip(closes, arrivals, strict=True)]
    return Served(sizes, waits, round(sum(waits) * 1e9), len(batches.sizes))


def poisson(rate: float, n: int = 400, seed: int = 7) -> list[float]:
    """Arrival times of `n` requests of a Poisson stream at `rate` per second."""
    return np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n)).tolist()


def linear(b: int) -> float:
    """1 ms a batch plus 0.25 ms a row."""
    return 1e-3 + 2.5e-4 * b


CASES = {
    # Arrivals ~1 ms apart against a 1 ms delay: the adaptive rule flips both ways.
    "adaptive delay": (BatchPolicy(8, BatchingConfig(max_queue_delay_us=1000)), 1, 1000.0),
    "fixed delay": (
        BatchPolicy(8, BatchingConfig(max_queue_delay_us=1000, adaptive_queue_delay=False)),
        1,
        1000.0,
    ),
    "preferred sizes": (
        BatchPolicy(
            8,
            BatchingConfig(
                max_queue_delay_us=3000, preferred_batch_sizes=[2, 5], adaptive_queue_delay=False
            ),
        ),
        1,
        1500.0,
    ),
    # Arrivals ~3 ms apart against a 20 ms delay: the gap always expects company, so only a
    # request alone in flight (Company) goes before the delay or a full batch.
    "alone in flight": (BatchPolicy(8, BatchingConfig(max_queue_delay_us=20_000)), 1, 300.0),
    "alone in flight, two instances": (
        BatchPolicy(8, BatchingConfig(max_queue_delay_us=20_000)),
        2,
        300.0,
    ),
    # Arrivals ~10 ms apart against a 2 ms delay: mostly alone in flight, so the lone rule's
    # probes (16 lone arrivals, then 32, 64...) wait whatever the gap says.
    "probes": (BatchPolicy(8, BatchingConfig(max_queue_delay_us=2000)), 1, 100.0),
    # Past what batches of 4 can serve on one instance: the queue grows and every batch is full.
    "max batch hit": (BatchPolicy(4, BatchingConfig(max_queue_delay_us=500)), 1, 2500.0),
    "two instances": (BatchPolicy(8, BatchingConfig(max_queue_delay_us=2000)), 2, 2500.0),
    "two instances, preferred": (
        BatchPolicy(16, BatchingConfig(max_queue_delay_us=1500, preferred_batch_sizes=[4])),
        2,
        3000.0,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_the_simulation_batches_a_trace_as_the_batcher_does(case: str) -> None:
    policy, instances, rate = CASES[case]
    arrivals = poisson(rate)
    real = batcher_serves(policy, instances, linear, arrivals)
    model = planner_predicts(policy, instances, linear, arrivals)
    assert model.sizes == real.sizes
    assert model.waits == pytest.approx(real.waits, abs=1e-9)
    assert model.batches == real.batches
    # The Batcher's statistics keep nanoseconds: each wait rounds by at most half of one.
    assert abs(real.queue_ns - model.queue_ns) <= len(arrivals)
    assert len(set(real.sizes)) > 1  # the trace exercises the rule, not one fixed batch size


def test_the_traces_exercise_each_rule() -> None:
    """Each case reaches the rule it is named for (else its comparison would prove little)."""
    policy, instances, rate = CASES["max batch hit"]
    full = batcher_serves(policy, instances, linear, poisson(rate))
    assert full.sizes.count(4) > len(full.sizes) / 2
    policy, instances, rate = CASES["preferred sizes"]
    preferred = batcher_serves(policy, instances, linear, poisson(rate))
    assert {2, 5, 8} <= set(preferred.sizes)
    adaptive = batcher_serves(*CASES["adaptive delay"][:2], linear, poisson(1000.0))
    fixed = batcher_serves(*CASES["fixed delay"][:2], linear, poisson(1000.0))

    def alone(served: Served) -> list[float]:
        return [w for w, s in zip(served.waits, served.sizes, strict=True) if s == 1]

    # Adaptive: some requests go at once when no company is expected, others wait for it.
    assert 0.0 in alone(adaptive) and max(adaptive.sizes) > 1
    # Fixed: a request that ends up alone has waited the whole delay (1 ms) first.
    assert min(alone(fixed)) == pytest.approx(1e-3)
    # Alone in flight: some go as they come, others batch, and a request that comes alone
    # after a batch with company waits the delay (20 ms) once.
    lone = batcher_serves(*CASES["alone in flight"][:2], linear, poisson(300.0))
    assert 0.0 in alone(lone) and max(lone.sizes) > 1
    assert any(w == pytest.approx(0.02) for w in alone(lone))
