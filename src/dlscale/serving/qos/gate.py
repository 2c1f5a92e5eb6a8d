"""Device gates: the device schedulers on the event loop, and each model's seats at them.

A Batcher holds, for each of its instances, a Seat at the gate of the instance's device. Before
it sends a batch it awaits a Grant from the seat; once the batch has computed it releases it.
While no model on a device has a [qos] table the gate is off: every batch goes at once, as
without it (serving/qos/scheduler.py says what it decides when on).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from dlscale.models.config import ModelConfig
from dlscale.serving.observe.stats import LATENCY_BUCKETS_S, Histogram
from dlscale.serving.qos.admission import Admission
from dlscale.serving.qos.scheduler import Demand, DeviceScheduler, Grant, Tenant


class DeviceGate:
    """One device's scheduler; batchers await its grants (one waiting batch per tenant)."""

    def __init__(self, device: str, slots: int, clock: Callable[[], float]) -> None:
        self.device = device
        self.scheduler = DeviceScheduler(slots)
        self._clock = clock
        self._waiters: dict[str, asyncio.Future[Grant]] = {}
        #: Grants to tenants that said on release that their next batch was ready, kept until
        #: their batcher comes for them (or withdraws).
        self._kept: dict[str, Grant] = {}

    @property
    def active(self) -> bool:
        """Whether the scheduler decides (some tenant here has [qos])."""
        return self.scheduler.active

    def join(self, tenant: Tenant) -> None:
        """A model version's instances arrive on this device."""
        self.scheduler.join(tenant)

    def leave(self, name: str) -> None:
        """A model version is gone; if no [qos] tenant is left, waiting batches go at once."""
        self.scheduler.leave(name)
        self._dispatch()

    async def acquire(self, name: str, demand: Demand) -> Grant:
        """Wait for a slot for `name`'s batch; at once (without yielding) while the gate is off."""
        if not self.scheduler.active:
            return self.scheduler.start_off(name)
        kept = self._kept.pop(name, None)
        if kept is not None:
            return kept
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._waiters[name] = future
        self.scheduler.ask(name, demand)
        self._dispatch()
        try:
            return await future
        except asyncio.CancelledError:
            if self._waiters.get(name) is future:
                del self._waiters[name]
                self.scheduler.withdraw(name)
            elif future.done() and not future.cancelled():
                self.release(future.result(), 0, 0.0)  # granted as it was cancelled
            raise

    def release(
        self,
        grant: Grant,
        rows: int,
        seconds: float,
        capped: bool = False,
        then: Demand | None = None,
        latencies: Sequence[float] = (),
    ) -> None:
        """The granted batch of `rows` computed in `seconds` (0 rows: it was never sent).

        `then`: the tenant's next batch is ready; it competes for this slot now, and a grant it
        wins is kept for its batcher (which calls `acquire`, or `withdraw` if it changed course).
        `latencies`: its requests' times since arrival (DeviceScheduler.finish).
        """
        self.scheduler.finish(grant, rows, seconds, capped, latencies)
        if then is not None and grant.tenant not in self._waiters and self.scheduler.active:
            self.scheduler.ask(grant.tenant, then)
        self._dispatch()

    def withdraw(self, name: str) -> None:
        """`name` has no batch ready after all: drop its demand, give back a kept grant."""
        if name in self._waiters:
            return  # its batcher is waiting in acquire: the demand stands
        self.scheduler.withdraw(name)
        kept = self._kept.pop(name, None)
        if kept is not None:
            self.release(kept, 0, 0.0)

    def _dispatch(self) -> None:
        now = self._clock()
        while True:
            if not self.scheduler.active:
                grants = [(f, self.scheduler.start_off(n)) for n, f in self._waiters.items()]
                self._waiters.clear()
                for future, grant in grants:
                    _hand(self.scheduler, future, grant)
                return
            chosen = self.scheduler.decide(now)
            if chosen is None:
                return
            if chosen.tenant in self._waiters:
                _hand(self.scheduler, self._waiters.pop(chosen.tenant), chosen)
            else:
                self._kept[chosen.tenant] = chosen


def _hand(scheduler: DeviceScheduler, future: asyncio.Future[Grant], grant: Grant) -> None:
    if future.done():  # its batcher stopped waiting as the slot came: give the slot back
        scheduler.finish(grant, 0, 0.0)
    else:
        future.set_result(grant)


@dataclass(frozen=True)
class Seat:
    """A model version's place at one device's gate: what its Batcher calls around a batch."""

    gate: DeviceGate
    tenant: Tenant

    @property
    def active(self) -> bool:
        """Whether the device's scheduler decides; when not, `start_off` gives a slot at once."""
        return self.gate.active

    def start_off(self) -> Grant:
        """A slot at once while the gate is off (counted, so that turning it on is exact)."""
        return self.gate.scheduler.start_off(self.tenant.name)

    async def acquire(self, demand: Demand) -> Grant:
        """Wait for a slot for a batch (module docstring)."""
        return await self.gate.acquire(self.tenant.name, demand)

    def release(
        self,
        grant: Grant,
        rows: int,
        seconds: float,
        capped: bool = False,
        then: Demand | None = None,
        latencies: Sequence[float] = (),
    ) -> None:
        """Give the slot back with what the batch took (`then`: the next batch is ready)."""
        self.gate.release(grant, rows, seconds, capped, then, latencies)

    def withdraw(self) -> None:
        """No batch is ready after all (DeviceGate.withdraw)."""
        self.gate.withdraw(self.tenant.name)


@dataclass
class TenantQos:
    """A model version's side of QoS: its admission limits and its seat at each device."""

    name: str
    config: ModelConfig
    admission: Admission | None
    seats: dict[str, Seat]  # by instance name
    #: Seconds each request waited between its arrival and its batch's start.
    waited: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))

    def devices(self) -> list[Seat]:
        """One seat per device (instances on one device share it)."""
        unique = {id(s.tenant): s for s in self.seats.values()}
        return list(unique.values())

    def leave(self) -> None:
        """Leave every device (after the batcher has closed)."""
        for seat in self.devices():
            seat.gate.leave(seat.tenant.name)


class DeviceGates:
    """The gates of one server, one per device string, made on first use.

    `enabled=False` ignores every [qos] table: no gates, no limits (the behaviour without them).
    """

    def __init__(
        self, enabled: bool = True, slots: int = 1, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.enabled = enabled
        self.slots = slots
        self.clock = clock
        self.gates: dict[str, DeviceGate] = {}
        self._enrolled = itertools.count(1)  # a reload's versions join beside the old ones

    def enrol(
        self, name: str, config: ModelConfig, placements: Iterable[tuple[str, str]]
    ) -> TenantQos | None:
        """Seats for a model version whose instances are `(instance name, device)` pairs."""
        if not self.enabled:
            return None
        qos = config.qos
        admission = Admission(config.name, qos, self.clock()) if qos else None
        seats: dict[str, Seat] = {}
        by_device: dict[str, Seat] = {}
        tenant_name = f"{name}#{next(self._enrolled)}"
        for instance, device in placements:
            seat = by_device.get(device)
            if seat is None:
                gate = self.gates.get(device) or self.gates.setdefault(
                    device, DeviceGate(device, self.slots, self.clock)
                )
                seat = Seat(gate, _tenant(tenant_name, config))
                gate.join(seat.tenant)
                by_device[device] = seat
            seats[instance] = seat
        return TenantQos(name, config, admission, seats)


def _tenant(name: str, config: ModelConfig) -> Tenant:
    qos = config.qos
    objective = qos.latency_objective_us / 1e6 if qos and qos.latency_objective_us else None
    return Tenant(
        name,
        max_rows=max(1, config.max_batch_size),
        objective_s=objective,
        weight=qos.weight if qos else 1.0,
        queue_delay_s=config.batching.max_queue_delay_us / 1e6,
        qos=qos is not None,
    )
