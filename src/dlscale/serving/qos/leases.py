"""A vLLM engine's device time in leases of its device's slot (steps.py's counterpart for an
engine whose steps run in processes of its own).

The transformers engine steps on a thread of the server, so each step takes a slot (steps.py).
vLLM's engine core schedules and steps in its own process; the server cannot wrap its steps, but
it can stop its scheduler between two steps and start it again (`PausableBackend`: vLLM's
"keep" pause, which holds the sequences and their KV cache). So with [qos] on its device, the
engine steps only while it holds a **lease**: a slot of the model's pool, granted by the same
scheduler as the classic models' batches, asked for while sequences are in the engine (its rows:
those sequences; its head: when it asked). Granted, the engine resumes and steps as it likes;
the lease ends when another tenant of the device waits for the slot (the gate tells the lease
at once: `DeviceGate.yielders`) or the engine has no sequence left: the engine is paused (which
answers once its step in flight has ended) and the slot goes back with the lease's time,
charged against the engine's weight.

What this gives: fair share counts the engine's real device time, lease by lease; a classic
model's batch waits for at most the engine's step in flight and the pause's round trip, not
for whole sequences; a vLLM sequence never runs while a classic batch holds the slot.
As with steps, the next lease is asked before the last one goes back (`previous` in
steps.py), or every waiting batch of a neighbor would go between two leases whatever the
weights. While no tenant of the device has [qos] the engine is never paused.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence

from dlscale.backends.generative.contract import PausableBackend
from dlscale.errors import Unavailable
from dlscale.serving.instance import Instance
from dlscale.serving.qos.slots import TenantQos
from dlscale.serving.slots import Slot, WholeDemand

log = logging.getLogger("dlscale.models")

#: Seconds between checks that the device's scheduler is still on (while no tenant there has
#: [qos], the engine is never paused; checked as often while none has come).
IDLE_S = 0.1


class EngineLease:
    """One engine's leases of its device's slot, driven by a task on the event loop."""

    def __init__(self, pool: TenantQos, engine: PausableBackend, device: str) -> None:
        self.pool = pool
        self.engine = engine
        self.device = device
        self.sequences = 0  # in the engine now (its seats say)
        self.paused = False
        self._busy = asyncio.Event()
        #: Set when the lease may have to end: another tenant asks (the gate tells it), or
        #: the last sequence left.
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Gives the last lease's slot back: kept until the next lease is asked for.
        self._held: Callable[[], None] | None = None

    def tell(self, sequences: int) -> None:
        """The engine's sequences in flight, before a new one reaches it."""
        self.sequences = sequences
        if sequences:
            self._busy.set()
        else:
            self._busy.clear()
            self._wake.set()  # a lease with nothing left to step ends

    def start(self) -> None:
        """Run the leases (on the event loop) until `stop`."""
        self.pool.gates[self.device].yielders[self._tenant] = self._wake.set
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        """The model left its devices: no lease any more (its engine closes next)."""
        self.pool.gates[self.device].yielders.pop(self._tenant, None)
        if self._task is not None:
            self._task.cancel()

    @property
    def _tenant(self) -> str:
        return self.pool.tenants[self.device].name

    async def _run(self) -> None:
        try:
            while True:
                if not self.pool.active(self.device):
                    self._give_back()
                    await self._pause(False)
                    await asyncio.sleep(IDLE_S)
                    continue
                await self._pause(True)  # no step without a lease
                if not self.sequences:
                    self._give_back()
                    await self._busy.wait()
                    continue
                previous, self._held = self._held, None  # the next lease gives it back
                self._held = await self._lease(previous)
        except Unavailable:
            pass  # the model left its devices
        except Exception:  # the engine died: its seats fail its requests; no more leases
            log.exception("the leases of an engine on %s stopped", self.device)
        finally:
            self._give_back()

    def _give_back(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held()

    async def _lease(self, previous: Callable[[], None] | None) -> Callable[[], None]:
        """One lease: asked (the last one given back once this ask waits), held while the
        engine steps alone, ended by a pause; returns how to give it back."""
        clock = self.pool.dispatcher.clock
        asked = clock()
        if previous is not None:  # runs once the take below waits (it registers at once)
            asyncio.get_running_loop().call_soon(previous)
        slot: Slot = await self.pool.take(WholeDemand(asked, self.sequences), self.device)
        granted, rows = clock(), max(1, self.sequences)
        try:
            await self._pause(False)
            await self._until_contested()
            await self._pause(True)
        except BaseException:
            slot.done(rows, [granted - asked], False)
            raise
        # The wait for the lease is what it added to its sequences' time between two tokens.
        return functools.partial(slot.done, rows, [granted - asked], False)

    async def _until_contested(self) -> None:
        """Return once another tenant waits for the device, no sequence is left, or nobody
        there has [qos] any more (the gate and `tell` wake it; the last is checked every
        IDLE_S)."""
        while True:
            self._wake.clear()
            if not (self.sequences and self.pool.active(self.device)) or self._others_wait():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), IDLE_S)

    def _others_wait(self) -> bool:
        tenants = self.pool.gates[self.device].scheduler.tenants
        return any(t.waiting is not None for name, t in tenants.items() if name != self._tenant)

    async def _pause(self, paused: bool) -> None:
        if paused != self.paused:
            await (self.engine.pause() if paused else self.engine.resume())
            self.paused = paused


def lease_engines(pool: TenantQos, engines: Sequence[Instance]) -> Callable[[Instance, int], None]:
    """Lease the device to a generative model's engines that pause between steps
    (`Capabilities.pauses_steps`), at the gates its pool is enrolled at
    (`Loader.load`); what tells an instance's lease the sequences in flight on its
    engine (its seats' watcher)."""
    leases: dict[str, EngineLease] = {}
    for engine in engines:
        backend = engine.backend
        assert isinstance(backend, PausableBackend)
        lease = leases[engine.name] = EngineLease(pool, backend, pool.placements[engine.name])
        lease.start()
        pool.departures.append(lease.stop)
    return lambda instance, sequences: leases[instance.name].tell(sequences)
