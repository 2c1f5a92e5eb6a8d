"""Loads on demand, on null models whose warm-up sleeps: one load per cold model however many
requests wait, a bounded number waiting, each request within its own timeout, its [qos] share."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.toolkit.models import write_null_model

from dlscale.errors import TimedOut, TooManyRequests
from dlscale.serving.control.demand import OnDemand
from dlscale.serving.manager import ModelManager
from dlscale.serving.memory.policy import MemoryFull

SLOW = """max_batch_size = 4
[backend_options]
delay_us = 200000
[[inputs]]
name = "x"
datatype = "FP32"
shape = [2]
[[outputs]]
name = "y"
datatype = "FP32"
shape = [2]
"""


@pytest.fixture
def manager(tmp_path: Path) -> ModelManager:
    for i in range(6):
        write_null_model(tmp_path, f"m{i}", SLOW)
    write_null_model(tmp_path, "limited", SLOW + "[qos]\nmax_in_flight = 2\n")
    return ModelManager.open(tmp_path)


async def test_many_requests_for_one_cold_model_share_one_load(manager: ModelManager) -> None:
    demand = OnDemand(manager)
    await asyncio.gather(*(demand.resident("m0") for _ in range(5)))
    assert demand.loads == 1 and manager.ready_names() == ["m0"]
    await demand.resident("m0")  # resident: nothing to wait for
    assert demand.loads == 1
    await demand.resident("not-in-the-repository")  # answered NotFound by the request's path
    await manager.close()


async def test_loads_run_a_few_at_once_and_only_so_many_wait(manager: ModelManager) -> None:
    demand = OnDemand(manager, parallel=1, waiting=3)
    results = await asyncio.gather(
        *(demand.resident(f"m{i}") for i in range(6)), return_exceptions=True
    )
    refused = [r for r in results if isinstance(r, MemoryFull)]
    assert len(refused) == 3 and all("waiting to load" in str(r) for r in refused), results
    assert demand.loads == 3 and demand.refused == 3
    assert sorted(manager.ready_names()) == ["m0", "m1", "m2"]
    await manager.close()


async def test_a_request_waits_for_the_load_within_its_own_timeout(manager: ModelManager) -> None:
    demand = OnDemand(manager)
    with pytest.raises(TimedOut, match="still loading when the request's timeout of 1000 us"):
        await demand.resident("m0", timeout_us=1000)
    await demand.resident("m0")  # the load went on for the others
    assert manager.ready_names() == ["m0"]
    await manager.close()


async def test_requests_waiting_for_a_load_count_against_the_models_qos(
    manager: ModelManager,
) -> None:
    demand = OnDemand(manager)
    results = await asyncio.gather(
        *(demand.resident("limited") for _ in range(4)), return_exceptions=True
    )
    refused = [r for r in results if isinstance(r, TooManyRequests)]
    assert len(refused) == 2 and "max_in_flight is 2" in str(refused[0]), results
    assert manager.ready_names() == ["limited"]
    await manager.close()
