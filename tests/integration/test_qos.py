"""Two models sharing this CPU under [qos]: the protected one keeps its objective under a flood
from the other, which gets the rest of the device; the limits answer 429 / RESOURCE_EXHAUSTED.

Service times are null-backend sleeps (tests/toolkit/repositories.py), so the assertions are
in units of them, with margins for a busy machine, not in absolute milliseconds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tests.toolkit.clients import infer_input
from tests.toolkit.repositories import (
    NEIGHBOR_BATCH,
    NEIGHBOR_ROW_US,
    NEIGHBOR_US,
    OBJECTIVE_US,
    PROTECTED_US,
    tenants_repository,
)
from tests.toolkit.server import serving
from tritonclient.utils import InferenceServerException

from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager
from dlscale.types import InferenceRequest

ROW = np.ones((1, 4), np.float32)
PROTECTED_RATE = 20.0  # requests/s: 20% of the device
FLOOD_IN_FLIGHT = 2 * NEIGHBOR_BATCH


async def _flood(plane: DataPlane, stop: asyncio.Event, rows: list[int]) -> None:
    """One closed-loop client of the neighbor; counts the rows answered in `rows[0]`."""
    while not stop.is_set():
        await plane.infer(InferenceRequest("neighbor", {"x": ROW}))
        rows[0] += 1


async def _protected(plane: DataPlane, count: int) -> list[float]:
    """`count` requests at PROTECTED_RATE (slightly irregular); each one's latency in seconds."""
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(k: int) -> float:
        await asyncio.sleep(start + k / PROTECTED_RATE + 0.0013 * (k % 7) - loop.time())
        sent = loop.time()
        await plane.infer(InferenceRequest("protected", {"x": ROW}))
        return loop.time() - sent

    return list(await asyncio.gather(*(one(k) for k in range(count))))


@pytest.mark.slow
async def test_the_protected_model_keeps_its_objective_under_a_flood(tmp_path: Path) -> None:
    manager = ModelManager.open(tenants_repository(tmp_path))
    await manager.load_all()
    plane = DataPlane(manager)
    loop = asyncio.get_running_loop()
    rows = [0]
    try:
        stop = asyncio.Event()
        floods = [loop.create_task(_flood(plane, stop, rows)) for _ in range(FLOOD_IN_FLIGHT)]
        await asyncio.sleep(0.5)  # the flood reaches full batches
        before, start = rows[0], loop.time()
        await asyncio.sleep(3.0)  # the neighbor alone
        alone = (rows[0] - before) / (loop.time() - start)
        before, start = rows[0], loop.time()
        latencies = await _protected(plane, 200)
        together = (rows[0] - before) / (loop.time() - start)
        stop.set()
        await asyncio.gather(*floods)
        neighbor = manager.get("neighbor").qos
        assert neighbor is not None
        capped = neighbor.devices()[0][1].capped
    finally:
        await manager.close()
    service = PROTECTED_US / 1e6
    full_batch = (NEIGHBOR_US + NEIGHBOR_ROW_US * NEIGHBOR_BATCH) / 1e6
    p90, p99 = np.percentile(latencies, [90, 99])
    # Without the scheduler's cap, a request arriving as a full neighbor batch starts waits all
    # of it: 39 service times, then its own. With it nine in ten requests hold the objective (8
    # service times), and the p99 stays far from the uncapped wait: a busy machine's stalls
    # (single requests of 20 service times were seen at load 6 on 2 cores) are not the cap's.
    objective = OBJECTIVE_US / 1e6
    assert p90 <= objective
    assert p99 <= (objective + full_batch + service) / 2
    assert capped > 0
    # The neighbor gets the rest: at least 80% of its rate alone (measured just before), less
    # the protected model's share of the device.
    assert together >= 0.8 * alone * (1 - service * PROTECTED_RATE)


def test_limits_answer_429_over_rest_and_resource_exhausted_over_grpc(tmp_path: Path) -> None:
    with serving(tenants_repository(tmp_path, rate_limit=0.01)) as server:
        rest = httpclient.InferenceServerClient(server.http_url)
        inputs = [httpclient.InferInput("x", [1, 4], "FP32")]
        inputs[0].set_data_from_numpy(ROW)
        for _ in range(2):  # the burst
            rest.infer("neighbor", inputs)
        with pytest.raises(InferenceServerException) as refused:
            rest.infer("neighbor", inputs)
        assert refused.value.status() == "429"
        assert "rate limit of 0.01 requests/s" in refused.value.message()
        rest.close()
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as again:
            grpc.infer("neighbor", [infer_input("x", ROW)])
        assert again.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "rate limit" in again.value.message()
        grpc.infer("protected", [infer_input("x", ROW)])  # the other model is not limited
        grpc.close()
