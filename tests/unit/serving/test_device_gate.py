"""Batchers of two models on one device, through its gate, on an event loop of virtual time.

The real Batchers and device gate run on a loop whose clock jumps from timer to timer (no
real sleeping, no timing); instance stand-ins hold a batch of b rows for s(b) of that clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import numpy as np
import pytest
from tests.unit.plan.test_queueing_vs_batcher import VirtualClockLoop, start_by_infer

from dlscale.errors import TooManyRequests
from dlscale.models.config import ModelConfig
from dlscale.models.config_sections import QosConfig
from dlscale.serving.batcher import Batcher
from dlscale.serving.instance import Then
from dlscale.serving.observe.stats import ModelStats
from dlscale.serving.policy import BatchPolicy
from dlscale.serving.qos.gate import DeviceGates

T = TypeVar("T")
ROW = {"x": np.zeros((1, 1), np.float32)}


class Device:
    """An instance stand-in: a batch of b rows holds it for `service(b)` seconds; it records
    when each batch ran."""

    slots = 1  # one batch at a time, as an Instance of a one-batch backend
    takes_requests = False  # merged batches, as most backends take them

    def __init__(self, name: str, service: Callable[[int], float]) -> None:
        self.name = name
        self.service = service
        self.batches: list[tuple[float, float, int]] = []  # start, end, rows

    def start(self, inputs: Mapping[str, np.ndarray], then: Then, context: object = None) -> None:
        start_by_infer(self.infer(inputs), then)  # as Instance.start hands a batch's outcome

    async def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        loop = asyncio.get_running_loop()
        rows, start = len(inputs["x"]), loop.time()
        await asyncio.sleep(self.service(rows))
        self.batches.append((start, loop.time(), rows))
        return {"y": inputs["x"]}


def _in_virtual_time(main: Callable[[], Awaitable[T]]) -> T:
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def _model(
    gates: DeviceGates, name: str, max_batch: int, service: Callable[[int], float], **qos: object
) -> tuple[Batcher, Device]:
    """A batcher of one instance on the cpu gate; [qos] as given (none when empty)."""
    config = ModelConfig(name=name, max_batch_size=max_batch, qos=QosConfig(**qos) if qos else None)
    device = Device(f"{name}-0", service)
    seats = gates.enrol(f"{name}/1", config, [(device.name, "cpu")])
    assert seats is not None
    for rows in {1, max_batch}:  # what the manager's warm-up teaches the scheduler
        seats.tenant_of(device.name).service.observe(rows, service(rows))
    batcher = Batcher(BatchPolicy.of(config), [device], ModelStats(name, "1"), gates.clock, seats)  # type: ignore[list-item]
    batcher.start()
    return batcher, device


def neighbor_time(rows: int) -> float:
    """2 ms a batch and 1 ms a row: a full batch of 64 takes 66 ms."""
    return 0.002 + 0.001 * rows


def test_the_protected_model_holds_its_objective_beside_a_flood() -> None:
    async def main() -> tuple[list[float], float, Batcher, Device, Batcher]:
        loop = asyncio.get_running_loop()
        gates = DeviceGates(clock=loop.time)
        flood, flood_device = _model(gates, "neighbor", 64, neighbor_time, weight=1.0)
        guarded, _ = _model(gates, "protected", 1, lambda _: 0.004, latency_objective_us=20_000)

        async def flooding() -> None:  # a closed loop of 256 requests in flight
            while True:
                await asyncio.gather(*(flood.infer(ROW) for _ in range(64)))

        async def one(at: float) -> float:
            await asyncio.sleep(at - loop.time())
            await guarded.infer(ROW)
            return loop.time() - at

        floods = [loop.create_task(flooding()) for _ in range(4)]
        arrivals = [k * 0.025 + 0.0013 * (k % 7) for k in range(200)]  # 5 s at 40/s
        latencies = await asyncio.gather(*(one(t) for t in arrivals))
        end = loop.time()
        for task in floods:
            task.cancel()
        await asyncio.gather(*floods, return_exceptions=True)
        await asyncio.gather(flood.close(), guarded.close())
        await asyncio.sleep(0.1)  # the batch whose requests were cancelled finishes
        return list(latencies), end, flood, flood_device, guarded

    latencies, end, flood, flood_device, guarded = _in_virtual_time(main)
    assert max(latencies) <= 0.020 + 1e-9  # every request within the objective
    alone = 64 / neighbor_time(64)  # the flood's rows per second with the device to itself
    # rows the device computed for the flood while the protected model ran (the dataplane, not
    # the batcher, counts a successful request's inferences from its timestamps)
    done = sum(rows for _, finished, rows in flood_device.batches if finished <= end)
    assert done / end >= 0.8 * alone * (1 - 0.004 * 40)
    tenant = flood.qos.tenant_of("neighbor-0")  # type: ignore[union-attr]
    assert tenant.capped > 0 and tenant.decisions["fair"] >= flood.stats.execution_count
    assert guarded.qos.waited.count == len(latencies)  # type: ignore[union-attr]


def test_without_qos_the_models_compute_side_by_side() -> None:
    async def main() -> tuple[Device, Device]:
        gates = DeviceGates(clock=asyncio.get_running_loop().time)
        a, dev_a = _model(gates, "a", 8, neighbor_time)
        b, dev_b = _model(gates, "b", 8, neighbor_time)
        assert not gates.gates["cpu"].scheduler.active
        await asyncio.gather(a.infer(ROW), b.infer(ROW))
        return dev_a, dev_b

    dev_a, dev_b = _in_virtual_time(main)
    assert dev_a.batches[0][0] == dev_b.batches[0][0] == 0.0  # both started at once


def test_without_qos_each_batch_is_started_off_and_counted_for_a_later_turn_on() -> None:
    # The pool hands a slot at once while its device's scheduler is off (no gates' walk): the
    # scheduler still counts each batch as its dispatch would, so turning on later is exact.
    async def main() -> tuple[Batcher, Device, Device]:
        gates = DeviceGates(clock=asyncio.get_running_loop().time)
        plain, plain_device = _model(gates, "plain", 8, neighbor_time)
        for _ in range(5):  # one request at a time: a batch each
            await plain.infer(ROW)
        scheduler = gates.gates["cpu"].scheduler
        tenant = plain.qos.tenant_of("plain-0")  # type: ignore[union-attr]
        assert not scheduler.active and scheduler.running == 0 and tenant.running == 0
        assert tenant.decisions == {"off": 5}
        assert tenant.service.expected(1) == pytest.approx(neighbor_time(1))  # learnt
        assert tenant.device_s == pytest.approx(5 * neighbor_time(1))
        assert tenant.virtual == pytest.approx(5 * neighbor_time(1))  # weight 1
        guarded, guarded_device = _model(gates, "guarded", 1, lambda _: 0.004, weight=2.0)
        await asyncio.gather(plain.infer(ROW), guarded.infer(ROW))
        assert scheduler.active and tenant.decisions["fair"] + tenant.decisions["urgent"] == 1
        return plain, plain_device, guarded_device

    plain, plain_device, guarded_device = _in_virtual_time(main)
    assert plain.qos.waited.count == 6  # type: ignore[union-attr]
    # Once on, the device runs one batch at a time: the two models' batches do not overlap.
    (a_start, a_end, _), (b_start, b_end, _) = plain_device.batches[-1], guarded_device.batches[0]
    assert a_end <= b_start or b_end <= a_start


def test_one_model_with_qos_serializes_the_device() -> None:
    async def main() -> tuple[Device, Device]:
        gates = DeviceGates(clock=asyncio.get_running_loop().time)
        a, dev_a = _model(gates, "a", 8, neighbor_time)
        b, dev_b = _model(gates, "b", 8, neighbor_time, weight=2.0)
        await asyncio.gather(a.infer(ROW), b.infer(ROW))
        return dev_a, dev_b

    dev_a, dev_b = _in_virtual_time(main)
    (start_a, end_a, _), (start_b, end_b, _) = dev_a.batches[0], dev_b.batches[0]
    assert end_a <= start_b or end_b <= start_a  # one after the other


def test_limits_refuse_at_once_and_say_which() -> None:
    async def main() -> None:
        gates = DeviceGates(clock=asyncio.get_running_loop().time)
        rated, _ = _model(gates, "rated", 8, neighbor_time, rate_limit=10.0, rate_burst=2)
        first = [rated.submit(ROW), rated.submit(ROW)]
        with pytest.raises(TooManyRequests, match="rate limit of 10 requests/s"):
            rated.submit(ROW)
        await asyncio.gather(*first)
        await asyncio.sleep(0.1)  # one token back
        await rated.infer(ROW)
        capped, _ = _model(gates, "capped", 8, neighbor_time, max_in_flight=1)
        pending = capped.submit(ROW)
        with pytest.raises(TooManyRequests, match="max_in_flight"):
            capped.submit(ROW)
        await pending
        assert rated.qos is not None and rated.qos.admission is not None
        assert dict(rated.qos.admission.refused) == {"rate_limit": 1}

    _in_virtual_time(main)


def test_a_request_that_leaves_while_its_batch_waits_frees_the_slot() -> None:
    async def main() -> None:
        gates = DeviceGates(clock=asyncio.get_running_loop().time)
        busy, _ = _model(gates, "busy", 64, neighbor_time, weight=1.0)
        quitter, _ = _model(gates, "quitter", 8, neighbor_time, weight=1.0)
        running = busy.submit({"x": np.zeros((64, 1), np.float32)})
        await asyncio.sleep(0.001)  # busy's 66 ms batch holds the device
        with pytest.raises(Exception, match="timed out"):
            await quitter.infer(ROW, timeout_us=10_000)
        await running
        await quitter.close()
        await busy.close()
        gate = gates.gates["cpu"]
        waiting = [t for t in gate.scheduler.tenants.values() if t.waiting is not None]
        assert gate.scheduler.running == 0 and not waiting

    _in_virtual_time(main)


def test_a_model_with_one_instance_keeps_its_turn_between_its_own_batches() -> None:
    """Its next batch forms only once its instance is back; the release says it is ready, so
    the slot does not go to the flood in between."""

    async def main() -> tuple[Device, Device]:
        gates = DeviceGates(clock=asyncio.get_running_loop().time)
        flood, flood_device = _model(gates, "neighbor", 64, neighbor_time)
        guarded, guarded_device = _model(
            gates, "protected", 1, lambda _: 0.004, latency_objective_us=50_000
        )
        busy = [flood.submit(ROW) for _ in range(256)]
        await asyncio.sleep(0.001)
        await asyncio.gather(*(guarded.infer(ROW) for _ in range(3)))
        await asyncio.gather(*busy)
        return flood_device, guarded_device

    flood_device, guarded_device = _in_virtual_time(main)
    (first, _, _), _, (_, last, _) = guarded_device.batches
    assert last - first == pytest.approx(3 * 0.004)  # back to back
    assert not [b for b in flood_device.batches if first < b[0] < last]
