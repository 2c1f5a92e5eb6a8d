"""A model version's QoS slot pool: its instances, admitted to the devices by their schedulers.

The Batcher awaits `take` once per batch. The pool waits until one of its instances is free on
a device whose scheduler grants it the slot; the gate reads the batch the batcher would send
when it decides (`DemandSource.demand`), so the batcher never pushes a demand down, and a model
whose batch just ended competes for the slot that batch frees. `Slot.done` gives the instance
and the grant back with what the batch took, which teaches the scheduler its service times.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dlscale.errors import Unavailable
from dlscale.models.config import ModelConfig
from dlscale.serving.instance import Instance
from dlscale.serving.observe.stats import LATENCY_BUCKETS_S, Histogram
from dlscale.serving.qos.admission import Admission
from dlscale.serving.qos.scheduler import DeviceScheduler, Grant, Tenant
from dlscale.serving.slots import Demand, DemandSource, Slot


class Gate(Protocol):
    """One device's gate, as a pool sees it (serving/qos/gate.py: DeviceGate); a protocol, so
    that the gate, which holds the pools, and the pools do not import each other."""

    scheduler: DeviceScheduler
    #: Tenants that give their slot back when another waits for it (a vLLM engine's lease),
    #: by name: each is told when a dispatch finds every slot taken and another tenant asking.
    yielders: dict[str, Callable[[], None]]

    def leave(self, name: str) -> None:
        """The tenant called `name` leaves this device."""
        ...


class Dispatcher(Protocol):
    """The server's gates, as a pool sees them (serving/qos/gate.py: DeviceGates)."""

    clock: Callable[[], float]

    def dispatch(self) -> None:
        """Let every gate grant what it can now."""
        ...


@dataclass(slots=True)  # not frozen: one a batch (serving/slots.py, Demand)
class _Held:
    """Where a slot handed out came from: its device, its grant, and when it started."""

    device: str
    grant: Grant
    start: float


@dataclass(eq=False)
class TenantQos:
    """A model version's side of QoS: its admission limits and its slot pool at the devices."""

    name: str
    config: ModelConfig
    admission: Admission | None
    placements: dict[str, str]  # device by instance name
    tenants: dict[str, Tenant]  # its standing at each device's scheduler, by device
    gates: Mapping[str, Gate]
    dispatcher: Dispatcher
    #: Seconds each request waited between its arrival and its batch's start.
    waited: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    _free: dict[str, list[Instance]] = field(default_factory=dict)  # by device
    #: The one take waiting: its future, its demand, and the only device it may be granted on
    #: (None: any; an engine's step is for its own device).
    _waiter: tuple[asyncio.Future[Slot], DemandSource, str | None] | None = None
    _held: dict[Slot, _Held] = field(default_factory=dict)
    _left: bool = False
    #: Called once it leaves its devices (a vLLM engine's lease task ends then).
    departures: list[Callable[[], None]] = field(default_factory=list)
    #: Its device when it has one (most models): where `_hand_off` may skip the gates' walk.
    _only: str | None = None

    def __post_init__(self) -> None:
        if len(self.tenants) == 1:
            (self._only,) = self.tenants

    def tenant_of(self, instance: str) -> Tenant:
        """The Tenant at the device of the instance named `instance`."""
        return self.tenants[self.placements[instance]]

    def active(self, device: str) -> bool:
        """Whether `device`'s scheduler decides (some tenant there has [qos])."""
        return self.gates[device].scheduler.active

    def attach(self, instances: Sequence[Instance], each: int | None = None) -> None:
        """The loaded instances become the pool's slots: once per batch each takes at once, or
        `each` times (an engine runs one step at a time, whatever sequences it holds)."""
        for instance in instances:
            device = self.placements[instance.name]
            count = instance.slots if each is None else each
            self._free.setdefault(device, []).extend([instance] * count)

    def take_now(self, source: DemandSource) -> Slot | None:
        """A slot at once, without a wait: where the pool's one device has its scheduler off
        and an instance free there (`_hand_off`); None: `take` waits for it."""
        device = self._only
        if (
            device is None
            or self._left
            or self._waiter is not None
            or not self._free.get(device)
            or self.active(device)
        ):
            return None
        return self._start_off(device, source)

    async def take(self, source: DemandSource, device: str | None = None) -> Slot:
        """Wait for a free instance and its device's grant (module docstring); on `device`
        only, when given. Raises Unavailable once the pool has left its devices."""
        if self._left:
            raise Unavailable(f"model {self.name!r} has left its devices' schedulers")
        future: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self._waiter = (future, source, device)
        if not self._hand_off():
            self.dispatcher.dispatch()
        try:
            return await future
        except asyncio.CancelledError:
            if self._waiter is not None and self._waiter[0] is future:
                self._waiter = None
                self.dispatcher.dispatch()  # its demand is withdrawn
            elif future.done() and not future.cancelled():
                future.result().done()  # granted as it was cancelled: give the slot back
            raise

    def asking(self, device: str, now: float) -> Demand | None:
        """The batch this pool would run on `device` now; None unless it waits for a slot and
        has an instance free there."""
        if self._waiter is None or self._waiter[0].done() or not self._free.get(device):
            return None
        if self._waiter[2] not in (None, device):
            return None
        # A batcher that waits has a batch ready; if its requests left since, it gets a slot
        # all the same, finds nothing to send and gives it back at once.
        return self._waiter[1].demand(now) or Demand(now, 1)

    def hand(self, device: str, grant: Grant, now: float) -> None:
        """The gate of `device` grants the waiting batcher a slot (`asking` said it waits)."""
        assert self._waiter is not None
        future = self._waiter[0]
        self._waiter = None
        future.set_result(self._slot(device, grant, now))

    def _slot(self, device: str, grant: Grant, now: float) -> Slot:
        scheduled = grant.decision != "off"
        slot = Slot(self._free[device].pop(), grant.max_rows, self._give_back, scheduled)
        self._held[slot] = _Held(device, grant, now)
        return slot

    def _start_off(self, device: str, source: DemandSource) -> Slot:
        """A slot on `device`, whose scheduler is off, for `source`'s batch: asked for, then
        started off, as the gate's dispatch hands it (DeviceGate.dispatch)."""
        now = self.dispatcher.clock()
        scheduler = self.gates[device].scheduler
        name = self.tenants[device].name
        scheduler.ask(name, source.demand(now) or Demand(now, 1))
        return self._slot(device, scheduler.start_off(name), now)

    def _give_back(self, slot: Slot, rows: int, latencies: Sequence[float], capped: bool) -> None:
        held = self._held.pop(slot)
        seconds = self.dispatcher.clock() - held.start if rows else 0.0
        self.gates[held.device].scheduler.finish(held.grant, rows, seconds, capped, latencies)
        self._free[held.device].append(slot.instance)
        if not self._hand_off():
            self.dispatcher.dispatch()

    def _hand_off(self) -> bool:
        """With one device whose scheduler is off: what the gates' dispatch would do for this
        pool, without their walk. False: the gates decide.

        A gate that is off hands every waiting pool a slot as soon as it has a free instance
        there, so between two dispatches no other pool waits on it with one free, and a gate
        elsewhere has nothing new to decide: a take or a slot given back changes this pool
        alone. The waiting take gets its slot now (asked, then started off, as `dispatch`
        would) or keeps waiting for an instance; with none waiting, nothing is left to do."""
        device = self._only
        if device is None or self.active(device):
            return False
        if self._waiter is None:
            return True
        future, source, only = self._waiter
        if future.done() or only not in (None, device):
            return False
        if self._free.get(device):
            self._waiter = None
            future.set_result(self._start_off(device, source))
        return True

    def leave(self) -> None:
        """Leave every device (after the batcher has closed); a take still waiting (an
        engine's step) fails, and so does every later one: no gate would grant them."""
        self._left = True
        if self._waiter is not None and not self._waiter[0].done():
            self._waiter[0].set_exception(Unavailable(f"model {self.name!r} left its devices"))
        self._waiter = None
        for device, tenant in self.tenants.items():
            self.gates[device].leave(tenant.name)
        self.dispatcher.dispatch()
        for departure in self.departures:
            departure()
