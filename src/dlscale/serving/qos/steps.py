"""A generative engine's steps, paced by its device's gate: each step takes a slot of the pool.

Per step, not per sequence. The device scheduler (scheduler.py) decides between units of device
work that are not preempted and whose times it learns; an engine step (one forward pass over the
sequences the engine batches) is such a unit, as a classic model's batch is. A sequence is not:
it lives for seconds and shares every step with the others, so a slot per sequence would run
one sequence at a time on a device of one slot (no continuous batching left), or, handed back
once the sequence is admitted, leave the engine's device time outside the scheduler, and with
it the classic models' objectives. Per step, the engine's device time is charged against its
weight step by step, and a classic model's batch waits for at most one step.

The engine's own thread asks for the slot (`StepGate.step`) and blocks until the gate on the
event loop grants it, through the model's one pool (serving/qos/slots.py: the gate pulls the
step's demand as it pulls a batcher's). A step keeps its slot until the engine asks for its next
one, and gives it back only once that ask waits: a batcher asks for its next slot while its batch
computes, and an engine must likewise compete for the slot its own step frees, or every waiting
batch of a neighbor would go between two of its steps whatever the weights say. An engine with
nothing left to step gives its slot back at once (`rest`). While no model on the device has
[qos] the gate is off and a step runs without asking, as it did before: no hop to the event loop
per token.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence

from dlscale.backends.generative.contract import PacedBackend
from dlscale.serving.instance import Instance
from dlscale.serving.qos.slots import TenantQos
from dlscale.serving.slots import Slot, WholeDemand

#: Seconds between the engine thread's checks that the event loop still runs while its step
#: waits for a grant (a server stopped without unloading would otherwise hold it forever).
POLL_S = 1.0


class EngineSteps:
    """One model version's engines, whose steps take slots of its QoS pool."""

    def __init__(self, pool: TenantQos, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        # A pool holds one waiting take (a batcher asks for one batch at a time): the model's
        # engines ask in turn.
        self._turn = asyncio.Lock()

    async def take(
        self, device: str, rows: int, asked: float, previous: Callable[[], None] | None = None
    ) -> Slot:
        """A slot on `device` for a step of `rows` sequences asked for at `asked`; `previous`
        gives the engine's last step's slot back once this ask waits (module docstring)."""
        if previous is not None and self._turn.locked():
            previous()  # another engine's step waits first: it may be waiting for this slot
            previous = None
        try:
            async with self._turn:
                if previous is not None:
                    # Runs once the take below waits for its grant (it registers at once).
                    self.loop.call_soon(previous)
                    previous = None
                slot = await self.pool.take(WholeDemand(asked, rows), device)
        finally:
            if previous is not None:  # cancelled before it asked: the slot goes back all the same
                previous()
        self.pool.waited.observe(self.pool.dispatcher.clock() - asked)
        return slot


class DeviceSteps:
    """One engine's StepGate (backends/generative/contract.py): its steps, at its device."""

    def __init__(self, steps: EngineSteps, device: str) -> None:
        self.steps = steps
        self.device = device
        #: Gives the last step's slot back (held until the next step asks, or `rest`); the
        #: engine's thread alone reads and writes it.
        self._held: Callable[[], None] | None = None

    @contextlib.contextmanager
    def step(self, rows: int) -> Iterator[None]:
        """Hold the device's slot for one step (on the engine's thread)."""
        if not self.steps.pool.active(self.device):
            self.rest()
            yield
            return
        clock = self.steps.pool.dispatcher.clock
        asked = clock()
        previous, self._held = self._held, None
        slot = self._grant(rows, asked, previous)
        try:
            yield
        finally:
            if slot is not None:
                # The step's wait and compute: what it added to each sequence's time between
                # two tokens (the objective's feedback, for an engine).
                took = clock() - asked
                self._held = functools.partial(slot.done, rows, [took], False)

    def rest(self) -> None:
        """The engine has no step to run next: its last step's slot goes back now."""
        held, self._held = self._held, None
        if held is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nothing to give back
                self.steps.loop.call_soon_threadsafe(held)

    def _grant(self, rows: int, asked: float, previous: Callable[[], None] | None) -> Slot | None:
        """Block until the gate grants the step; None when nobody will (the model left its
        devices, or the server's loop stopped): the step then runs unpaced."""
        loop = self.steps.loop
        try:
            future = asyncio.run_coroutine_threadsafe(
                self.steps.take(self.device, rows, asked, previous), loop
            )
        except RuntimeError:  # the loop is closed
            return None
        while True:
            try:
                return future.result(timeout=POLL_S)
            except TimeoutError:
                if not loop.is_running():
                    future.cancel()
                    return None
            except Exception:  # the pool left its devices (Unavailable), or cancelled
                return None


def pace_engines(pool: TenantQos, engines: Sequence[Instance]) -> None:
    """Pace the steps of a generative model's engines (`Capabilities.paces_steps`) at the gates
    its pool is enrolled at (`Loader.load`)."""
    steps = EngineSteps(pool, asyncio.get_running_loop())
    for engine in engines:
        backend = engine.backend
        assert isinstance(backend, PacedBackend)
        backend.pace(DeviceSteps(steps, pool.placements[engine.name]))  # at its device
