"""Seats in front of a model that streams: capacity, order by priority then arrival, timeouts,
queue limits, [qos] admission, and callers that leave while they wait."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dlscale.backends.base import BackendOptions
from dlscale.backends.null import NullBackend
from dlscale.errors import ConfigError, QueueFull, TimedOut, TooManyRequests
from dlscale.models.config import ModelConfig
from dlscale.models.config_sections import BatchingConfig, QosConfig
from dlscale.serving.instance import Instance
from dlscale.serving.observe.stats import ModelStats, RequestTimes
from dlscale.serving.policy import BatchPolicy
from dlscale.serving.qos.admission import Admission
from dlscale.serving.seats import ENGINE_SEQUENCES, Seats


def _instances(count: int = 1) -> list[Instance]:
    return [
        Instance(NullBackend(Path("null"), BackendOptions()), f"engine-{i}") for i in range(count)
    ]


def _seats(capacity: int = 1, **batching: int) -> Seats:
    policy = BatchPolicy(0, BatchingConfig(**batching))
    return Seats(capacity, policy, _instances(2), ModelStats("m", "1"))


async def _enter(seats: Seats, priority: int = 0, timeout_us: int = 0) -> Instance:
    return await seats.enter(priority, timeout_us, RequestTimes())


async def _until_waiting(seats: Seats, count: int) -> None:
    while seats.waiting != count:
        await asyncio.sleep(0)


async def test_capacity_admits_that_many_and_spreads_them_over_instances() -> None:
    seats = _seats(capacity=2)
    first, second = await _enter(seats), await _enter(seats)
    assert first is not second and seats.running == 2
    third = asyncio.create_task(_enter(seats))
    await _until_waiting(seats, 1)
    seats.leave(first)
    assert await third is first  # the freed instance, the least loaded
    assert (seats.running, seats.waiting, seats.queue.stats.pending) == (2, 0, 2)


async def test_the_highest_priority_goes_first_then_the_oldest() -> None:
    seats = _seats(priority_levels=3)
    held = await _enter(seats)
    order: list[str] = []

    async def wait(tag: str, priority: int) -> None:
        instance = await _enter(seats, priority)
        order.append(tag)
        seats.leave(instance)

    tasks = []
    for tag, priority in (("low", 3), ("high-1", 1), ("mid", 2), ("high-2", 1)):
        tasks.append(asyncio.create_task(wait(tag, priority)))
        await _until_waiting(seats, len(tasks))
    seats.leave(held)
    await asyncio.gather(*tasks)
    assert order == ["high-1", "high-2", "mid", "low"]
    assert seats.running == 0 and seats.queue.stats.pending == 0


async def test_a_timeout_drops_a_waiting_request_and_its_seat_goes_on() -> None:
    seats = _seats(default_timeout_us=1_000)
    held = await _enter(seats)
    with pytest.raises(TimedOut, match="timed out waiting for a sequence slot"):
        await _enter(seats)
    assert seats.waiting == 0 and seats.queue.stats.pending == 1
    seats.leave(held)
    assert seats.running == 0
    seats.leave(await _enter(seats))


async def test_a_caller_that_leaves_while_waiting_takes_no_seat() -> None:
    seats = _seats()
    held = await _enter(seats)
    gone = asyncio.create_task(_enter(seats))
    await _until_waiting(seats, 1)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    nxt = asyncio.create_task(_enter(seats))
    await _until_waiting(seats, 1)
    seats.leave(held)
    seats.leave(await nxt)
    assert (seats.running, seats.waiting, seats.queue.stats.pending) == (0, 0, 0)


async def test_a_seat_handed_to_a_caller_that_just_left_goes_to_the_next() -> None:
    seats = _seats()
    held = await _enter(seats)
    first = asyncio.create_task(_enter(seats))
    second = asyncio.create_task(_enter(seats))
    await _until_waiting(seats, 2)
    seats.leave(held)  # hands the seat to `first`, which is cancelled before it runs
    first.cancel()
    seats.leave(await second)
    assert first.cancelled() and seats.running == 0 and seats.queue.stats.pending == 0


async def test_a_full_queue_refuses_at_once() -> None:
    seats = _seats(max_queue_size=1)
    held = await _enter(seats)
    waiting = asyncio.create_task(_enter(seats))
    await _until_waiting(seats, 1)
    with pytest.raises(QueueFull, match="max_queue_size 1"):
        await _enter(seats)
    seats.leave(held)
    seats.leave(await waiting)


async def test_qos_limits_refuse_before_waiting() -> None:
    seats = _seats()
    seats.queue.admission = Admission("m", QosConfig(max_in_flight=1), 0.0)
    held = await _enter(seats)
    assert isinstance(seats.queue.refuse_early(), TooManyRequests)
    with pytest.raises(TooManyRequests, match="max_in_flight"):
        await _enter(seats)
    assert seats.waiting == 0
    seats.leave(held)
    assert seats.queue.refuse_early() is None


def test_capacity_comes_from_the_config() -> None:
    def config(extra: str) -> ModelConfig:
        return ModelConfig.model_validate(
            {"name": "m", "backend": "null", "backend_options": extra}
        )

    instances = _instances(3)
    stats = ModelStats("m", "1")
    assert Seats.of(config({}), instances, stats, engine=True).capacity == ENGINE_SEQUENCES
    assert Seats.of(config({}), instances, stats, engine=False).capacity == 3
    assert Seats.of(config({"max_num_seqs": 7}), instances, stats, True).capacity == 7
    with pytest.raises(ConfigError, match="max_num_seqs"):
        Seats.of(config({"max_num_seqs": 0}), instances, stats, True)
