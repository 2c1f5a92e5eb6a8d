"""A vLLM-like engine's leases of a device and a classic model's batches, one scheduler.

The engine stand-in steps by itself (as vLLM's engine core does in its own process) until it is
paused, and its pause answers once its step in flight has ended (vLLM's "keep" pause); the lease
(serving/qos/leases.py) is the server's side, on a loop of virtual time (test_device_gate.py).
The real vLLM engine under the same rule: tests/integration/qos/test_vllm_qos.py.
"""

from __future__ import annotations

import asyncio

from tests.unit.serving.test_device_gate import ROW, _in_virtual_time, _model

from dlscale.models.config import ModelConfig
from dlscale.models.config_sections import QosConfig
from dlscale.serving.qos.gate import DeviceGates
from dlscale.serving.qos.leases import EngineLease
from dlscale.serving.qos.slots import TenantQos

STEP_S = 0.006  # one engine step
SEQUENCES = 8


class SelfStepping:
    """An engine that steps on its own while unpaused and holding sequences; records steps."""

    name = "engine-0"  # the instance its pool places
    slots = 1

    def __init__(self) -> None:
        self.sequences = 0
        self.paused = False
        self.pauses = 0
        self.steps: list[tuple[float, float]] = []
        self._go = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def hold(self, sequences: int) -> None:
        self.sequences = sequences
        self._wake()

    async def pause(self) -> None:
        self.paused, self.pauses = True, self.pauses + 1
        self._wake()
        await self._idle.wait()  # the step in flight ends first

    async def resume(self) -> None:
        self.paused = False
        self._wake()

    def close(self) -> None:
        self._task.cancel()

    def _wake(self) -> None:
        if self.sequences and not self.paused:
            self._go.set()
        else:
            self._go.clear()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._go.wait()
            self._idle.clear()
            start = loop.time()
            await asyncio.sleep(STEP_S)
            self.steps.append((start, loop.time()))
            self._idle.set()


def _leased(gates: DeviceGates, **qos: object) -> tuple[SelfStepping, EngineLease, TenantQos]:
    """The engine's model on the cpu gate, leased as lease_engines does."""
    config = ModelConfig(name="engine", qos=QosConfig(**qos) if qos else None)
    pool = gates.enrol("engine/1", config, [("engine-0", "cpu")], rows=SEQUENCES)
    assert pool is not None
    engine = SelfStepping()
    pool.attach([engine], each=1)  # type: ignore[list-item]
    lease = EngineLease(pool, engine, "cpu")
    lease.start()
    pool.departures.append(lease.stop)
    return engine, lease, pool


def _overlaps(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> int:
    return sum(1 for s1, e1 in a for s2, e2 in b if s1 < e2 and s2 < e1)


def test_no_batch_runs_during_a_step_and_a_protected_request_waits_at_most_one_step() -> None:
    async def main() -> tuple[list[float], SelfStepping, TenantQos, list[tuple[float, float]]]:
        loop = asyncio.get_running_loop()
        gates = DeviceGates(clock=loop.time)
        engine, lease, pool = _leased(gates)  # best effort: the neighbor's [qos] turns it on
        guarded, device = _model(
            gates, "protected", 1, lambda _: 0.004, latency_objective_us=20_000
        )
        lease.tell(SEQUENCES)
        engine.hold(SEQUENCES)

        async def one(at: float) -> float:
            await asyncio.sleep(at - loop.time())
            await guarded.infer(ROW)
            return loop.time() - at

        arrivals = [0.1 + k * 0.025 + 0.0013 * (k % 7) for k in range(100)]
        latencies = await asyncio.gather(*(one(t) for t in arrivals))
        lease.tell(0)
        engine.hold(0)
        await asyncio.sleep(0.1)  # the lease ends: the slot goes back
        await guarded.close()
        pool.leave()
        engine.close()
        return list(latencies), engine, pool, [(s, e) for s, e, _ in device.batches]

    latencies, engine, pool, batches = _in_virtual_time(main)
    assert len(batches) == 100
    assert _overlaps(engine.steps, batches) == 0  # a step never runs while a batch holds the slot
    # A request waits for at most the engine's step in flight (the gate ends the lease at
    # once), then its own 4 ms.
    assert max(latencies) <= STEP_S + 0.004 + 1e-9
    assert sum(pool.tenants["cpu"].decisions.values()) > 50  # leases granted between batches
    # The engine kept the rest of the device: 2.6 s less the batches' 0.4 s is ~366 steps.
    assert len(engine.steps) > 300
    assert engine.paused  # its last lease ended in a pause


def test_without_qos_on_the_device_the_engine_is_never_paused() -> None:
    async def main() -> tuple[SelfStepping, int]:
        loop = asyncio.get_running_loop()
        gates = DeviceGates(clock=loop.time)
        engine, lease, pool = _leased(gates)
        plain, device = _model(gates, "plain", 1, lambda _: 0.004)  # no [qos] anywhere
        lease.tell(SEQUENCES)
        engine.hold(SEQUENCES)
        await asyncio.gather(*(plain.infer(ROW) for _ in range(20)))
        await asyncio.sleep(0.5)
        await plain.close()
        pool.leave()
        engine.close()
        return engine, len(device.batches)

    engine, batches = _in_virtual_time(main)
    assert batches == 20
    assert engine.pauses == 0 and len(engine.steps) > 0.5 / STEP_S / 2


def test_a_model_that_leaves_ends_its_leases_and_frees_the_device() -> None:
    async def main() -> tuple[int, int, bool]:
        loop = asyncio.get_running_loop()
        gates = DeviceGates(clock=loop.time)
        engine, lease, pool = _leased(gates, weight=1.0)
        lease.tell(SEQUENCES)
        engine.hold(SEQUENCES)
        await asyncio.sleep(0.05)  # holding a lease, stepping alone
        pool.leave()
        await asyncio.sleep(0.05)
        scheduler = gates.gates["cpu"].scheduler
        stopped = lease._task is not None and lease._task.done()
        engine.close()
        return scheduler.running, len(scheduler.tenants), stopped

    running, tenants, stopped = _in_virtual_time(main)
    assert (running, tenants, stopped) == (0, 0, True)
