"""The slot pools: what a Batcher's one wait per batch gets (serving/slots.py, qos/slots.py)."""

from __future__ import annotations

import asyncio

import numpy as np
from tests.unit.serving.test_device_gate import ROW, Device, _in_virtual_time, neighbor_time

from dlscale.models.config import ModelConfig
from dlscale.models.config_sections import QosConfig
from dlscale.serving.batcher import Batcher
from dlscale.serving.observe.stats import ModelStats
from dlscale.serving.policy import BatchPolicy
from dlscale.serving.qos.gate import DeviceGates
from dlscale.serving.slots import Demand, InstancePool


class Ready:
    """A DemandSource with one row ready."""

    def demand(self, now: float) -> Demand | None:
        return Demand(now, 1)


def test_an_instance_taking_two_batches_is_two_slots() -> None:
    async def main() -> None:
        device = Device("d-0", neighbor_time)
        device.slots = 2  # type: ignore[misc]
        pool = InstancePool([device], max_rows=8)  # type: ignore[list-item]
        first, second = await pool.take(Ready()), await pool.take(Ready())
        assert first.instance is second.instance is device and first.max_rows == 8
        third = asyncio.ensure_future(pool.take(Ready()))
        await asyncio.sleep(0)
        assert not third.done()  # both slots are out
        first.done(1)
        assert (await third).instance is device

    asyncio.run(main())


def _batcher(gates: DeviceGates, config: ModelConfig, placed: list[tuple[Device, str]]) -> Batcher:
    qos = gates.enrol(f"{config.name}/1", config, [(d.name, where) for d, where in placed])
    assert qos is not None
    devices = [d for d, _ in placed]
    stats = ModelStats(config.name, "1")
    return Batcher(BatchPolicy.of(config), devices, stats, gates.clock, qos)  # type: ignore[arg-type]


def test_a_model_on_two_devices_takes_the_free_one() -> None:
    """While a [qos] neighbor's batch holds device a, a model with instances on a and b runs
    its batch on b at once."""

    async def main() -> tuple[Device, Device]:
        gates = DeviceGates(clock=asyncio.get_running_loop().time)
        busy = ModelConfig(name="busy", max_batch_size=64, qos=QosConfig())
        busy_device = Device("busy-0", neighbor_time)
        held = _batcher(gates, busy, [(busy_device, "a")])
        spread = ModelConfig(name="spread", max_batch_size=8, qos=QosConfig())
        on_a, on_b = Device("spread-a", neighbor_time), Device("spread-b", neighbor_time)
        batcher = _batcher(gates, spread, [(on_a, "a"), (on_b, "b")])
        held.start()
        batcher.start()
        running = held.submit({"x": np.zeros((64, 1), np.float32)})
        await asyncio.sleep(0.001)  # busy's 66 ms batch holds device a
        await batcher.infer(ROW)
        await running
        await asyncio.gather(held.close(), batcher.close())
        return on_a, on_b

    on_a, on_b = _in_virtual_time(main)
    assert not on_a.batches and len(on_b.batches) == 1
    assert on_b.batches[0][0] < 0.066  # it did not wait for device a
