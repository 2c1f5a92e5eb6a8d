"""The Batcher merges requests into batches and splits the answers back, exactly."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from dlscale.backends import BackendOptions, Capabilities
from dlscale.errors import BackendError, InvalidInput, QueueFull, TimedOut, Unavailable
from dlscale.models.config_sections import BatchingConfig
from dlscale.serving.batcher import Batcher
from dlscale.serving.instance import Instance
from dlscale.serving.observe.stats import ModelStats
from dlscale.serving.policy import BatchPolicy
from dlscale.types import Datatype, TensorSpec


class AddOne:
    """A Backend of the test's own: adds one, records batch sizes, can be held or made to fail.

    It stands in for a runtime only where a test must control when a batch finishes; the
    protocol, batcher and instances around it are the real ones.
    """

    concurrency = 1

    def __init__(self) -> None:
        self.path = Path("add-one")
        self.options = BackendOptions()
        self.batches: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_when_rows: int | None = None

    def load(self) -> None:
        pass

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(concurrency=self.concurrency)

    @property
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec("x", Datatype.FP32, (-1, 4))]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("y", Datatype.FP32, (-1, 4))]

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = inputs["x"].shape[0]
        self.batches.append(rows)
        self.entered.set()
        self.gate.wait(10)
        if rows == self.fail_when_rows:
            raise RuntimeError(f"cannot take {rows} rows")
        return {"y": inputs["x"] + 1}

    def unload(self) -> None:
        pass


def _batcher(policy: BatchPolicy, backends: list[AddOne]) -> Batcher:
    instances = [Instance(b, f"test-{i}") for i, b in enumerate(backends)]
    batcher = Batcher(policy, instances, ModelStats("m", "1"))
    batcher.start()
    return batcher


def _rows(n: int, base: float) -> dict[str, np.ndarray]:
    return {"x": np.full((n, 4), base, dtype=np.float32) + np.arange(n, dtype=np.float32)[:, None]}


async def _held(batcher: Batcher, backend: AddOne) -> asyncio.Future[dict[str, np.ndarray]]:
    """Occupy the only instance with a held batch so that later requests queue up."""
    backend.gate.clear()
    backend.entered.clear()
    first = batcher.submit(_rows(1, -100))
    await asyncio.to_thread(backend.entered.wait, 5)
    return first


async def test_queued_requests_merge_and_split_back_exactly() -> None:
    backend = AddOne()
    batcher = _batcher(BatchPolicy(16, BatchingConfig(max_queue_delay_us=0)), [backend])
    first = await _held(batcher, backend)
    sizes = [3, 1, 5, 2]
    futures = [batcher.submit(_rows(n, 10.0 * i)) for i, n in enumerate(sizes)]
    backend.gate.set()
    results = await asyncio.gather(first, *futures)
    for (n, i), result in zip([(n, i) for i, n in enumerate(sizes)], results[1:], strict=True):
        assert np.array_equal(result["y"], _rows(n, 10.0 * i)["x"] + 1)
    assert backend.batches == [1, sum(sizes)]
    # The batcher counts batches and their rows; the DataPlane counts requests (and their rows).
    assert batcher.stats.batch_size.total == 12 and batcher.stats.execution_count == 2
    assert sorted(batcher.stats.batch_stats) == [1, 11]
    await batcher.close()


async def test_batches_never_exceed_max_batch_size() -> None:
    backend = AddOne()
    batcher = _batcher(BatchPolicy(4, BatchingConfig(max_queue_delay_us=0)), [backend])
    first = await _held(batcher, backend)
    futures = [batcher.submit(_rows(n, n)) for n in (3, 3, 2, 1)]
    backend.gate.set()
    await asyncio.gather(first, *futures)
    assert max(backend.batches) <= 4 and sum(backend.batches) == 10
    await batcher.close()


async def test_requests_of_different_shapes_are_not_merged() -> None:
    backend = AddOne()
    batcher = _batcher(BatchPolicy(16), [backend])
    first = await _held(batcher, backend)
    narrow = batcher.submit({"x": np.zeros((2, 3), np.float32)})
    wide = batcher.submit({"x": np.zeros((2, 4), np.float32)})
    backend.gate.set()
    a, b = await asyncio.gather(narrow, wide)
    await first
    assert a["y"].shape == (2, 3) and b["y"].shape == (2, 4)
    assert backend.batches == [1, 2, 2]
    await batcher.close()


async def test_a_preferred_size_is_sent_without_waiting_for_the_delay() -> None:
    backend = AddOne()
    # A delay of a minute: only the preferred size can make this batch go.
    policy = BatchPolicy(
        16, BatchingConfig(max_queue_delay_us=60_000_000, preferred_batch_sizes=[4])
    )
    batcher = _batcher(policy, [backend])
    results = await asyncio.wait_for(
        asyncio.gather(*(batcher.submit(_rows(1, i)) for i in range(4))), 10
    )
    assert backend.batches == [4] and len(results) == 4
    await batcher.close()


async def test_the_queue_delay_lets_a_batch_fill() -> None:
    backend = AddOne()
    batcher = _batcher(BatchPolicy(8, BatchingConfig(max_queue_delay_us=200_000)), [backend])
    futures = [batcher.submit(_rows(1, i)) for i in range(3)]
    await asyncio.sleep(0.01)
    futures += [batcher.submit(_rows(1, i)) for i in range(3, 5)]
    await asyncio.gather(*futures)
    assert backend.batches == [5]
    await batcher.close()


async def test_higher_priority_goes_first() -> None:
    backend = AddOne()
    batcher = _batcher(BatchPolicy(1, BatchingConfig(priority_levels=2)), [backend])
    first = await _held(batcher, backend)
    order: list[str] = []
    low = batcher.submit(_rows(1, 1), priority=2)
    high = batcher.submit(_rows(1, 2), priority=1)
    low.add_done_callback(lambda _: order.append("low"))
    high.add_done_callback(lambda _: order.append("high"))
    backend.gate.set()
    await asyncio.gather(first, low, high)
    assert order == ["high", "low"]
    with pytest.raises(InvalidInput, match="priority 3 is out of range"):
        batcher.submit(_rows(1, 1), priority=3)
    await batcher.close()


async def test_a_request_times_out_while_queued_and_the_rest_survive() -> None:
    backend = AddOne()
    batcher = _batcher(BatchPolicy(4), [backend])
    first = await _held(batcher, backend)
    doomed = batcher.submit(_rows(1, 1), timeout_us=20_000)
    patient = batcher.submit(_rows(1, 2))
    with pytest.raises(TimedOut, match="timed out in the queue"):
        await doomed
    backend.gate.set()
    assert np.array_equal((await patient)["y"], _rows(1, 2)["x"] + 1)
    await first
    assert backend.batches == [1, 1]
    await batcher.close()


async def test_a_full_queue_refuses_at_once() -> None:
    backend = AddOne()
    batcher = _batcher(BatchPolicy(4, BatchingConfig(max_queue_size=2)), [backend])
    first = await _held(batcher, backend)
    queued = [batcher.submit(_rows(1, i)) for i in range(2)]
    with pytest.raises(QueueFull, match="queue is full"):
        batcher.submit(_rows(1, 9))
    backend.gate.set()
    await asyncio.gather(first, *queued)
    await batcher.close()


async def test_a_failing_batch_fails_only_its_own_requests() -> None:
    backend = AddOne()
    backend.fail_when_rows = 3
    batcher = _batcher(BatchPolicy(3, BatchingConfig(max_queue_delay_us=0)), [backend])
    first = await _held(batcher, backend)
    bad = [batcher.submit(_rows(1, i)) for i in range(3)]  # together they make 3 rows
    good = batcher.submit(_rows(2, 5))
    backend.gate.set()
    outcomes = await asyncio.gather(*bad, return_exceptions=True)
    assert all(isinstance(o, BackendError) and "cannot take 3 rows" in str(o) for o in outcomes)
    assert np.array_equal((await good)["y"], _rows(2, 5)["x"] + 1)
    await first
    await batcher.close()


async def test_close_drains_queued_requests_then_refuses() -> None:
    backend = AddOne()
    batcher = _batcher(BatchPolicy(2), [backend])
    first = await _held(batcher, backend)
    queued = [batcher.submit(_rows(1, i)) for i in range(3)]
    closing = asyncio.create_task(batcher.close())
    await asyncio.sleep(0.01)
    with pytest.raises(Unavailable, match="unloading"):
        batcher.submit(_rows(1, 0))
    backend.gate.set()
    await closing
    assert all(f.done() and not f.exception() for f in [first, *queued])


async def test_the_cut_ends_computing_and_queued_requests_and_no_others() -> None:
    """The shutdown's cut reaches a batch in its instance and the requests queued behind it
    (the batcher keeps both: no per-request set in the runner); a request that came back
    before the cut keeps its answer, and a later one is served."""
    backend = AddOne()
    batcher = _batcher(BatchPolicy(4, BatchingConfig(max_queue_delay_us=0)), [backend])
    done = batcher.submit(_rows(1, 7))
    assert np.array_equal((await done)["y"], _rows(1, 7)["x"] + 1)
    computing = await _held(batcher, backend)
    queued = [batcher.submit(_rows(1, i)) for i in range(2)]
    batcher.cut(Unavailable("cut at the grace"))
    for future in (computing, *queued):
        with pytest.raises(Unavailable, match="cut at the grace"):
            await future
    backend.gate.set()
    assert np.array_equal((await batcher.submit(_rows(2, 3)))["y"], _rows(2, 3)["x"] + 1)
    assert batcher.queued == 0
    await batcher.close()


async def test_several_instances_compute_at_once() -> None:
    held = [AddOne(), AddOne()]
    for b in held:
        b.gate.clear()
    batcher = _batcher(BatchPolicy(1), held)
    futures = [batcher.submit(_rows(1, i)) for i in range(2)]
    # Both instances must be inside infer at the same time, or this waits forever.
    await asyncio.wait_for(
        asyncio.gather(*(asyncio.to_thread(b.entered.wait, 5) for b in held)), 10
    )
    assert all(b.entered.is_set() for b in held)
    for b in held:
        b.gate.set()
    await asyncio.gather(*futures)
    await batcher.close()


class TwoAtOnce(AddOne):
    """An AddOne that says, once loaded, it takes two batches at once (as the torch backend
    does on a GPU); each batch waits until the other is inside too."""

    concurrency = 2

    def __init__(self) -> None:
        super().__init__()
        self.both_inside = threading.Barrier(2)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # Raises BrokenBarrierError (and fails the batch) unless a second batch arrives.
        self.both_inside.wait(timeout=10)
        return super().infer(inputs)


async def test_an_instance_that_takes_two_batches_gets_two_in_flight() -> None:
    backend = TwoAtOnce()
    instance = Instance(backend, "two")
    await instance.load()
    assert instance.slots == 2
    batcher = Batcher(BatchPolicy(4), [instance], ModelStats("m", "1"))
    batcher.start()
    try:
        first, second = _rows(4, 0), _rows(4, 10)
        a, b = await asyncio.gather(batcher.infer(first), batcher.infer(second))
    finally:
        await batcher.close()
        await instance.close()
    np.testing.assert_array_equal(a["y"], first["x"] + 1)
    np.testing.assert_array_equal(b["y"], second["x"] + 1)
    assert sorted(backend.batches) == [4, 4]
