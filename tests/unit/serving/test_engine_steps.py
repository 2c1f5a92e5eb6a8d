"""A generative engine's steps and a classic model's batches take slots of one device's pool.

The engine stand-in steps on the event loop through `EngineSteps.take`, the call the engine's
thread makes (serving/qos/steps.py), on a loop of virtual time (test_device_gate.py): the counts
are the scheduler's decisions. The last test runs the real thread path on a real loop.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from tests.unit.serving.test_device_gate import ROW, Device, _in_virtual_time, _model

from dlscale.models.config import ModelConfig
from dlscale.models.config_sections import QosConfig
from dlscale.serving.qos.gate import DeviceGates
from dlscale.serving.qos.scheduler import Tenant
from dlscale.serving.qos.slots import TenantQos
from dlscale.serving.qos.steps import DeviceSteps, EngineSteps
from dlscale.serving.slots import Demand, Slot

SEQUENCES = 8  # sequences in every engine step


def step_time(rows: int) -> float:
    """2 ms a step and 0.5 ms a sequence: a step of 8 takes 6 ms."""
    return 0.002 + 0.0005 * rows


@dataclass
class Engine:
    """An engine stand-in that always has SEQUENCES sequences: each step takes a slot of its
    model's pool, holds the device for `step_time`, and gives the slot back."""

    steps: EngineSteps
    service: Callable[[int], float] = step_time
    ran: list[tuple[float, float]] = field(default_factory=list)  # start, end of each step
    #: Each step's time from its ask to its end: what it adds between two tokens.
    token_gaps: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:  # the instance name its pool places
        return "engine-0"

    slots = 1

    async def run(self, until: float) -> None:
        """Step until `until`; each step's slot is kept until the next step asks (as
        DeviceSteps does on the engine's thread), the last one given back at the end."""
        loop = asyncio.get_running_loop()
        held: Callable[[], None] | None = None
        while loop.time() < until:
            asked = loop.time()
            slot = await self.steps.take("cpu", SEQUENCES, asked, held)
            start = loop.time()
            await asyncio.sleep(self.service(SEQUENCES))
            self.ran.append((start, loop.time()))
            self.token_gaps.append(loop.time() - asked)
            held = functools.partial(slot.done, SEQUENCES, [loop.time() - asked], False)
        if held is not None:
            held()


def _engine(gates: DeviceGates, **qos: object) -> tuple[Engine, TenantQos]:
    """A generative model of one engine on the cpu gate, enrolled as the manager does."""
    config = ModelConfig(name="engine", qos=QosConfig(**qos) if qos else None)
    pool = gates.enrol("engine/1", config, [("engine-0", "cpu")], rows=SEQUENCES)
    assert pool is not None
    engine = Engine(EngineSteps(pool, asyncio.get_running_loop()))
    pool.attach([engine], each=1)  # type: ignore[list-item]
    return engine, pool


def _overlaps(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> int:
    return sum(1 for s1, e1 in a for s2, e2 in b if s1 < e2 and s2 < e1)


def test_a_classic_model_keeps_its_objective_beside_a_busy_engine() -> None:
    """The engine steps without pause; the protected model's requests are all answered within
    their objective, none of its batches runs during a step, and the device granted both."""

    async def main() -> tuple[list[float], Engine, TenantQos, Device, TenantQos]:
        loop = asyncio.get_running_loop()
        gates = DeviceGates(clock=loop.time)
        engine, engine_pool = _engine(gates, weight=4.0)
        guarded, device = _model(
            gates, "protected", 1, lambda _: 0.004, latency_objective_us=12_000
        )
        stepping = loop.create_task(engine.run(until=5.2))

        async def one(at: float) -> float:
            await asyncio.sleep(at - loop.time())
            await guarded.infer(ROW)
            return loop.time() - at

        arrivals = [0.1 + k * 0.025 + 0.0013 * (k % 7) for k in range(200)]  # 5 s at 40/s
        latencies = await asyncio.gather(*(one(t) for t in arrivals))
        await stepping
        await guarded.close()
        assert guarded.qos is not None
        return list(latencies), engine, engine_pool, device, guarded.qos

    latencies, engine, engine_pool, device, guarded = _in_virtual_time(main)
    assert len(latencies) == 200 and max(latencies) <= 0.012 + 1e-9
    batches = [(start, end) for start, end, _ in device.batches]
    assert _overlaps(engine.ran, batches) == 0  # one slot: a batch never runs during a step
    stepped = engine_pool.tenants["cpu"]
    assert sum(stepped.decisions.values()) == len(engine.ran) > 500  # the engine kept stepping
    protected = guarded.tenants["cpu"]
    assert sum(protected.decisions.values()) == len(device.batches) == 200
    assert engine_pool.waited.count == len(engine.ran)  # each step's wait for its slot


@pytest.mark.parametrize("engine_weight", [3.0, 1 / 3])
def test_a_busy_engine_and_a_busy_classic_model_share_the_device_by_weight(
    engine_weight: float,
) -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        gates = DeviceGates(clock=loop.time)
        engine, engine_pool = _engine(gates, weight=engine_weight)
        flood, _ = _model(gates, "neighbor", 8, lambda rows: 0.002 + 0.001 * rows, weight=1.0)

        async def flooding() -> None:
            while loop.time() < 3.0:
                await asyncio.gather(*(flood.infer(ROW) for _ in range(8)))

        await asyncio.gather(engine.run(until=3.0), flooding(), flooding())
        await flood.close()
        assert flood.qos is not None
        return engine_pool.tenants["cpu"].device_s, flood.qos.tenants["cpu"].device_s

    engine_s, flood_s = _in_virtual_time(main)
    assert engine_s / flood_s == pytest.approx(engine_weight, rel=0.1)


def test_an_engine_with_an_objective_caps_a_classic_floods_batches() -> None:
    """The objective of a generative model holds per step (the time between two tokens): the
    flood's batches (up to 66 ms) are cut to what fits the engine's slack."""

    async def main() -> tuple[Engine, TenantQos]:
        loop = asyncio.get_running_loop()
        gates = DeviceGates(clock=loop.time)
        engine, _ = _engine(gates, latency_objective_us=20_000)
        flood, _ = _model(gates, "neighbor", 64, lambda rows: 0.002 + 0.001 * rows, weight=1.0)

        async def flooding() -> None:
            while loop.time() < 3.0:
                await asyncio.gather(*(flood.infer(ROW) for _ in range(64)))

        await asyncio.gather(engine.run(until=3.0), flooding(), flooding())
        await flood.close()
        assert flood.qos is not None
        return engine, flood.qos

    engine, flood = _in_virtual_time(main)
    assert max(engine.token_gaps) <= 0.020 + 1e-9
    neighbor = flood.tenants["cpu"]
    assert neighbor.capped > 0 and sum(neighbor.decisions.values()) > 100  # cut, still served


class _Batch:
    """A classic model's batch of one row, waiting (a DemandSource)."""

    def demand(self, now: float) -> Demand:
        return Demand(now, 1)


async def _until(predicate: Callable[[], bool]) -> None:
    for _ in range(1000):  # a safety net: the thread blocks within a few loop turns
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the engine's thread never asked for its step")


async def _step_behind_a_batch(
    classic: TenantQos, gate: DeviceSteps, stepped: Tenant, free: Callable[[Slot], None]
) -> None:
    """A classic batch holds the device's one slot; the engine's thread asks for a step (then
    rests), which waits until `free` is called with the batch's slot, and then runs."""
    held = await classic.take(_Batch())
    ran = threading.Event()

    def step() -> None:  # one step, then nothing left to step (the engine's loop rests)
        with gate.step(SEQUENCES):
            ran.set()
        gate.rest()

    thread = asyncio.create_task(asyncio.to_thread(step))
    await _until(lambda: stepped.waiting is not None)
    assert not ran.is_set()  # the step waits for the batch
    free(held)
    await thread
    assert ran.is_set()


async def test_the_engine_thread_waits_for_the_device_and_a_leaving_model_frees_it() -> None:
    """On a real loop and a real thread: a step waits while a batch holds the device's slot,
    runs once the slot comes back and gives it back when the engine rests, and a model that
    leaves its devices frees a waiting step."""
    gates = DeviceGates()
    classic = gates.enrol("classic/1", ModelConfig(name="classic", qos=QosConfig()), [("c", "cpu")])
    assert classic is not None
    classic.attach([Device("c", lambda _: 0.0)])  # type: ignore[list-item]
    engine_config = ModelConfig(name="engine")
    pool = gates.enrol("engine/1", engine_config, [("engine-0", "cpu")], rows=SEQUENCES)
    assert pool is not None
    pool.attach([Device("engine-0", lambda _: 0.0)], each=1)  # type: ignore[list-item]
    gate = DeviceSteps(EngineSteps(pool, asyncio.get_running_loop()), "cpu")
    stepped = pool.tenants["cpu"]
    scheduler = gates.gates["cpu"].scheduler

    await _step_behind_a_batch(classic, gate, stepped, lambda held: held.done(1, [0.001]))
    await _until(lambda: scheduler.running == 0)  # the engine rested: its slot is back
    assert stepped.decisions["fair"] == 1 and stepped.typical_rows > 1

    kept: list[Slot] = []

    def leave(held: Slot) -> None:  # the engine's model leaves; the batch keeps its slot
        kept.append(held)
        pool.leave()

    await _step_behind_a_batch(classic, gate, stepped, leave)  # ran unpaced: nobody grants it
    assert stepped.decisions["fair"] == 1 and scheduler.running == 1
    kept[0].done(1, [0.001])
    assert scheduler.running == 0
