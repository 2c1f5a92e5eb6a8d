"""Device gates: one device scheduler per device string, put on the event loop.

Each model version with [qos] enabled has a slot pool (serving/qos/slots.py) with one Tenant at
the gate of each device its instances are on. Whenever something changes (a batcher waits for a
slot, a batch ends, a model leaves) the gates dispatch: each reads, from the pools that wait
and have a free instance on its device, the batch they would send now, and grants its free
slots by the scheduler's rule (serving/qos/scheduler.py). While no model on a device has a
[qos] table the gate is off: every waiting pool gets its slot at once, as without it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable

from dlscale.models.config import ModelConfig
from dlscale.serving.qos.admission import Admission
from dlscale.serving.qos.scheduler import DeviceScheduler, Tenant
from dlscale.serving.qos.slots import TenantQos


class DeviceGate:
    """One device's scheduler and the slot pools of the tenants it schedules."""

    def __init__(self, device: str, slots: int) -> None:
        self.device = device
        self.scheduler = DeviceScheduler(slots)
        self.pools: dict[str, TenantQos] = {}  # by tenant name
        #: Told when another tenant waits while the slots are taken (slots.py: Gate).
        self.yielders: dict[str, Callable[[], None]] = {}

    def join(self, tenant: Tenant, pool: TenantQos) -> None:
        """A model version's instances arrive on this device."""
        self.scheduler.join(tenant)
        self.pools[tenant.name] = pool

    def leave(self, name: str) -> None:
        """A model version is gone (its batches have finished)."""
        self.scheduler.leave(name)
        self.pools.pop(name, None)
        self.yielders.pop(name, None)

    def dispatch(self, now: float) -> None:
        """Grant the free slots to the waiting pools, by the scheduler's rule."""
        while True:
            asking = self._refresh(now)
            if not asking:
                return
            if not self.scheduler.active:
                for name in asking:
                    self.pools[name].hand(self.device, self.scheduler.start_off(name), now)
                continue
            grant = self.scheduler.decide(now)
            if grant is None:
                self._contest(asking)
                return
            self.pools[grant.tenant].hand(self.device, grant, now)

    def _contest(self, asking: list[str]) -> None:
        """Every slot is taken and `asking` wait: a holder that yields on request is told."""
        for name, tell in list(self.yielders.items()):
            holder = self.scheduler.tenants.get(name)
            if holder is not None and holder.running and any(n != name for n in asking):
                tell()

    def _refresh(self, now: float) -> list[str]:
        """Tell the scheduler which tenants wait now, with the batch each would send."""
        asking = []
        for name, pool in self.pools.items():
            demand = pool.asking(self.device, now)
            if demand is None:
                self.scheduler.withdraw(name)
            else:
                self.scheduler.ask(name, demand)
                asking.append(name)
        return asking


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

    def dispatch(self) -> None:
        """Let every gate grant what it can now (a pool waits, a slot came back)."""
        now = self.clock()
        for gate in list(self.gates.values()):
            gate.dispatch(now)

    def enrol(
        self,
        name: str,
        config: ModelConfig,
        placements: Iterable[tuple[str, str]],
        rows: int | None = None,
        admission: Admission | None = None,
    ) -> TenantQos | None:
        """The slot pool of a model version whose instances are `(instance name, device)` pairs;
        `rows`: the most rows a slot holds, when not its max_batch_size (an engine's step holds
        up to its sequence capacity); `admission`: the model's own, when it has one already (a
        generative model's seats admit its requests)."""
        if not self.enabled:
            return None
        qos = config.qos
        if admission is None and qos:
            admission = Admission(config.name, qos, self.clock())
        placed = dict(placements)
        tenant_name = f"{name}#{next(self._enrolled)}"
        tenants = {device: _tenant(tenant_name, config, rows) for device in placed.values()}
        gates = {d: self.gates.setdefault(d, DeviceGate(d, self.slots)) for d in tenants}
        pool = TenantQos(name, config, admission, placed, tenants, gates, self)
        for device, tenant in tenants.items():
            gates[device].join(tenant, pool)
        return pool


def _tenant(name: str, config: ModelConfig, rows: int | None) -> Tenant:
    qos = config.qos
    objective = qos.latency_objective_us / 1e6 if qos and qos.latency_objective_us else None
    return Tenant(
        name,
        max_rows=max(1, config.max_batch_size if rows is None else rows),
        objective_s=objective,
        weight=qos.weight if qos else 1.0,
        queue_delay_s=config.batching.max_queue_delay_us / 1e6,
        qos=qos is not None,
    )
