"""QoS where it can be measured: two null models holding one simulated device (sleeps, no CPU).

The shape of benchmarks/qos_device.py with bounds a loaded 2-core machine cannot break: with a
neighbor flooding, QoS off lets a protected request (50 ms) wait for up to a whole neighbor
batch (128 ms); QoS on caps the neighbor's batches to the protected model's queue budget (one
16-row request, 8 ms), and the neighbor keeps most of the device time left to it. Host stalls
only add latency, so the lower bound on QoS off holds on any machine; the upper bound on QoS
on sits halfway into a neighbor batch (tens of milliseconds of host noise fit below it), and
at the p90, which one stall cannot reach.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
from tests.toolkit.models import write_null_model
from tests.toolkit.slow import slow_only

from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager
from dlscale.serving.qos.gate import DeviceGates
from dlscale.types import InferenceRequest

PROTECTED_S, OBJECTIVE_US = 0.050, 60_000
NEIGHBOR_US, NEIGHBOR_ROW_US, NEIGHBOR_BATCH, NEIGHBOR_ROWS = 200, 500, 256, 16
FULL_BATCH_S = (NEIGHBOR_US + NEIGHBOR_ROW_US * NEIGHBOR_BATCH) / 1e6  # 128.2 ms
RATE, COUNT = 4.0, 40  # protected requests/s (20% of the device), requests a phase
TENSORS = (
    '[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [4]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [4]\n'
)


def _repository(root: Path) -> Path:
    device = f'simulated_device = "{root.name}"\n'
    write_null_model(
        root,
        "protected",
        f"max_batch_size = 1\n{TENSORS}[backend_options]\n"
        f"delay_us = {PROTECTED_S * 1e6:.0f}\n{device}"
        f"[qos]\nlatency_objective_us = {OBJECTIVE_US}\n",
    )
    write_null_model(
        root,
        "neighbor",
        f"max_batch_size = {NEIGHBOR_BATCH}\n{TENSORS}[backend_options]\n"
        f"delay_us = {NEIGHBOR_US}\ndelay_us_per_row = {NEIGHBOR_ROW_US}\n{device}",
    )
    return root


async def _phase(plane: DataPlane, flood: bool, guard: bool) -> tuple[list[float], float]:
    """Protected latencies (s) at RATE (`guard`) and neighbor rows/s (`flood`) over one phase."""
    loop, rows, stop = asyncio.get_running_loop(), [0], asyncio.Event()
    batch = {"x": np.ones((NEIGHBOR_ROWS, 4), np.float32)}

    async def client() -> None:
        while not stop.is_set():
            await plane.infer(InferenceRequest("neighbor", batch))
            rows[0] += NEIGHBOR_ROWS

    async def one(k: int, start: float) -> float:
        await asyncio.sleep(start + k / RATE + 0.0013 * (k % 7) - loop.time())
        sent = time.perf_counter()
        await plane.infer(InferenceRequest("protected", {"x": np.ones((1, 4), np.float32)}))
        return time.perf_counter() - sent

    flooding = 2 * NEIGHBOR_BATCH // NEIGHBOR_ROWS if flood else 0  # two full batches in flight
    clients = [loop.create_task(client()) for _ in range(flooding)]
    await asyncio.sleep(0.5 if flood else 0.0)  # the flood reaches full batches
    before, start = rows[0], time.perf_counter()
    if guard:
        first = loop.time()
        latencies = list(await asyncio.gather(*(one(k, first) for k in range(COUNT))))
    else:
        latencies = []
        await asyncio.sleep(COUNT / RATE / 2)
    elapsed = time.perf_counter() - start
    stop.set()
    await asyncio.gather(*clients)
    return latencies, (rows[0] - before) / elapsed


async def _served(root: Path, qos: bool) -> tuple[ModelManager, DataPlane]:
    manager = ModelManager.open(root, DeviceGates(enabled=qos))
    await manager.load_all()
    return manager, DataPlane(manager)


@pytest.mark.slow
@slow_only("35 s of flooding a simulated device")
async def test_qos_holds_the_protected_tail_on_a_shared_simulated_device(tmp_path: Path) -> None:
    root = _repository(tmp_path)
    manager, plane = await _served(root, qos=False)
    try:
        alone, _ = await _phase(plane, flood=False, guard=True)
        _, neighbor_alone = await _phase(plane, flood=True, guard=False)
        off, _ = await _phase(plane, flood=True, guard=True)
    finally:
        await manager.close()
    manager, plane = await _served(root, qos=True)
    try:
        on, neighbor_on = await _phase(plane, flood=True, guard=True)
        tenants = manager.get("neighbor").qos.tenants  # type: ignore[union-attr]
        capped = next(iter(tenants.values())).capped
    finally:
        await manager.close()
    bound = PROTECTED_S + FULL_BATCH_S / 2  # 114 ms: halfway into a neighbor batch
    assert np.percentile(off, 90) > bound  # QoS off: most requests wait for much of a batch
    assert np.percentile(on, 90) <= bound  # QoS on: the neighbor's batches are capped
    assert np.percentile(on, 99) < np.percentile(off, 99)
    assert np.percentile(alone, 50) >= PROTECTED_S  # the simulated device's time is real
    assert capped > 0
    # The neighbor keeps at least half the device time left to it (the benchmark's target,
    # 80%, is measured on medians over repetitions: BENCHMARKS.md).
    assert neighbor_on >= 0.5 * neighbor_alone * (1 - PROTECTED_S * RATE)
