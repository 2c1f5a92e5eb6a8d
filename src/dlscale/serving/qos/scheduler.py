"""The device scheduler: which model's batch runs next on a shared device, by the models' [qos].

One scheduler per device (cpu, cuda:N, a MIG UUID) grants execution slots to the models
(tenants) with instances there. Its decisions are a pure function of its state and the time
it is given, so tests drive it with a fake clock; serving/qos/gate.py puts it on the event loop
and serving/qos/slots.py hands its grants to the batchers.

The rule, when a slot is free and batches wait (docs/qos.md):

1. Fair share: the waiting tenant with the least device time per unit of weight goes
   (start-time fair queueing; a tenant back from idle starts level with the busy ones, so
   idleness banks no credit).
2. Objectives: a waiting tenant that would miss its objective if the fair choice's smallest
   batch ran first goes first instead (earliest latest-start first), while it is no more than
   one objective of device time ahead of the fair choice (an objective is no licence to take
   more than the tenant's share for long).
3. Blocking: compute is not preempted, so the chosen batch is capped to the most rows whose
   service time (mean plus two deviations: the objective is a p99) fits the slack of every
   other tenant with an objective: a waiting one's time to its latest start, an idle one's
   queue budget (its own batch counted at its mean time).

It is work-conserving: a free slot never stays idle while a batch waits.
"""

from __future__ import annotations

import bisect
import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from dlscale.serving.slots import Demand

#: Weight of the newest batch in the running mean and deviation of a batch size's time.
SERVICE_WEIGHT = 0.2
#: Deviations above the mean that a batch may take when it would block another tenant.
BOUND_DEVIATIONS = 2.0
#: Weight of the newest batch in a tenant's typical batch size (its queue budget's batch).
ROWS_WEIGHT = 0.1
#: A batch size not seen in this many batches is forgotten: the machine drifts, and a stale
#: time would hold every cap below it (its size would never run again to correct it).
STALE_AFTER = 64
#: The feedback on a tenant's measured tail (Tail): how many recent requests it reads, how often
#: it adjusts, which percentile it steers, the share of the objective it aims that percentile
#: at, and how hard it corrects. It steers the p95 of the last 50, not a p99: a p99 needs a
#: window long enough to lag (and overshoot) and is one stall of a busy host from a false alarm.
TAIL_WINDOW, TAIL_EVERY, TAIL_PERCENTILE, TAIL_AIM, TAIL_GAIN = 50, 25, 0.95, 0.8, 0.25
#: The most of a tenant's queue budget the margin may take: past it the neighbors' batches
#: shrink toward one row, which costs them far more than it can give back (a tenant whose own
#: tail misses the objective with the device to itself is not helped by starving the others).
TAIL_CEILING = 0.5


@dataclass
class _Estimate:
    mean: float
    seen: int  # the ServiceTimes batch count when last updated
    deviation: float = 0.0

    def add(self, seconds: float) -> None:
        self.deviation += SERVICE_WEIGHT * (abs(seconds - self.mean) - self.deviation)
        self.mean += SERVICE_WEIGHT * (seconds - self.mean)


class ServiceTimes:
    """Seconds one batch takes by its rows, learned from the batches run.

    A running mean and mean deviation per batch size; between measured sizes linear, below the
    smallest that size's time, above the largest proportional to rows. Every answer is made
    non-decreasing in rows (more rows never cost less), which errs long, as a bound should.
    """

    def __init__(self) -> None:
        self._by_rows: dict[int, _Estimate] = {}
        self._batches = 0
        #: No size can be stale before this batch count (the least `seen`, plus STALE_AFTER and
        #: one): the sizes are looked through then, not at every batch.
        self._sweep_at = 0

    def observe(self, rows: int, seconds: float) -> None:
        """One batch of `rows` took `seconds`."""
        if rows < 1 or seconds < 0:
            return
        self._batches += 1
        found = self._by_rows.get(rows)
        if found is None:
            self._by_rows[rows] = _Estimate(seconds, self._batches)
        else:
            found.add(seconds)
            found.seen = self._batches
        if self._batches < self._sweep_at:
            return
        oldest = self._batches - STALE_AFTER
        for size in [r for r, e in self._by_rows.items() if e.seen < oldest]:
            del self._by_rows[size]
        self._sweep_at = min(e.seen for e in self._by_rows.values()) + STALE_AFTER + 1

    def expected(self, rows: float) -> float:
        """The mean time of a batch of `rows` (0 while nothing is known)."""
        return self._at(rows, 0.0)

    def bound(self, rows: float) -> float:
        """Mean plus BOUND_DEVIATIONS deviations: a batch's time when it may block another."""
        return self._at(rows, BOUND_DEVIATIONS)

    def largest_within(self, seconds: float, limit: int) -> int:
        """The most rows, up to `limit`, whose bound fits in `seconds`; 0 when not even one."""
        if not self._by_rows:  # nothing timed yet
            return limit
        lo, hi = 0, limit
        while lo < hi:  # the bound is non-decreasing in rows
            mid = (lo + hi + 1) // 2
            if self.bound(mid) <= seconds:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _at(self, rows: float, deviations: float) -> float:
        if not self._by_rows:
            return 0.0
        sizes = sorted(self._by_rows)
        values, top = [], 0.0
        for size in sizes:
            est = self._by_rows[size]
            top = max(top, est.mean + deviations * est.deviation)
            values.append(top)
        if rows >= sizes[-1]:
            return values[-1] * rows / sizes[-1]
        i = bisect.bisect_left(sizes, rows)
        if i == 0 or sizes[i] == rows:
            return values[i]
        lo, hi = sizes[i - 1], sizes[i]
        return values[i - 1] + (values[i] - values[i - 1]) * (rows - lo) / (hi - lo)


@dataclass
class Tail:
    """A tenant's recent latencies in the server, and the margin its slack loses for them.

    The slack rule counts blocking and the tenant's own batch; its own queueing (a burst of its
    requests, its batching delay, a busy host) comes on top. So the measured tail steers a
    margin taken off every slack of the tenant: it grows while the tail (TAIL_PERCENTILE) is
    above TAIL_AIM x the objective and shrinks while below, between 0 and `ceiling`.
    """

    recent: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=TAIL_WINDOW)
    )
    margin: float = 0.0
    since: int = 0

    def observe(self, seconds: float, objective: float, ceiling: float) -> None:
        """One request took `seconds` from its arrival to its batch's end."""
        self.recent.append(seconds)
        self.since += 1
        if self.since < TAIL_EVERY:
            return
        self.since = 0
        error = self.tail() - TAIL_AIM * objective
        self.margin = min(ceiling, max(0.0, self.margin + TAIL_GAIN * error))

    def tail(self) -> float:
        """The TAIL_PERCENTILE of the recent latencies (0 before any)."""
        if not self.recent:
            return 0.0
        ordered = sorted(self.recent)
        return ordered[min(len(ordered) - 1, int(TAIL_PERCENTILE * len(ordered)))]


@dataclass(slots=True)  # not frozen: one a batch (serving/slots.py, Demand)
class Grant:
    """A slot given to a tenant: at most `max_rows` rows (its head request always goes)."""

    tenant: str
    max_rows: int
    decision: str  # "fair", "urgent", or "off" while the scheduler is off
    charged: float = 0.0  # device seconds charged at the start (corrected at the finish)


@dataclass
class Tenant:
    """One model version's standing at one device."""

    name: str
    max_rows: int = 1
    objective_s: float | None = None  # p99 to hold; None: best effort
    weight: float = 1.0
    queue_delay_s: float = 0.0  # its batching delay: a new request may wait that for company
    qos: bool = False  # whether the model has a [qos] table (which turns the scheduler on)
    service: ServiceTimes = field(default_factory=ServiceTimes)
    virtual: float = 0.0  # device seconds / weight, the fair-share clock
    device_s: float = 0.0
    typical_rows: float = 1.0
    waiting: Demand | None = None
    running: int = 0
    decisions: collections.Counter[str] = field(default_factory=collections.Counter)
    capped: int = 0
    tail: Tail = field(default_factory=Tail)

    def budget(self) -> float | None:
        """Objective minus expected service at the typical batch: the time it may queue."""
        if self.objective_s is None:
            return None
        return self.objective_s - self.service.expected(self.typical_rows)

    def latest_start(self) -> float:
        """When the waiting batch must start for its oldest request to meet the objective."""
        assert self.waiting is not None and self.objective_s is not None
        own = self.service.expected(self.waiting.rows)
        return self.waiting.head + self.objective_s - own - self.tail.margin

    def slack(self, now: float) -> float:
        """How long another batch may run before this tenant's next one without a miss."""
        assert self.objective_s is not None
        if self.waiting is not None:
            return self.latest_start() - now
        own = self.service.expected(self.typical_rows)
        return self.objective_s - own - self.queue_delay_s - self.tail.margin


class DeviceScheduler:
    """Grants `slots` concurrent batches on one device to its tenants (module docstring)."""

    def __init__(self, slots: int = 1) -> None:
        if slots < 1:
            raise ValueError("a device needs at least one slot")
        self.slots = slots
        self.tenants: dict[str, Tenant] = {}
        self.running = 0
        self._with_qos = 0
        #: The fair-share clock of the device: the start tag of the batch granted last.
        self.virtual = 0.0

    @property
    def active(self) -> bool:
        """Whether any tenant has [qos]; while none does, every batch goes at once."""
        return self._with_qos > 0

    def join(self, tenant: Tenant) -> None:
        """A model version with instances on this device."""
        if tenant.name in self.tenants:
            raise ValueError(f"tenant {tenant.name!r} is already on this device")
        tenant.virtual = self.virtual
        self.tenants[tenant.name] = tenant
        self._with_qos += tenant.qos

    def leave(self, name: str) -> None:
        """The version is unloaded (its batches have finished)."""
        tenant = self.tenants.pop(name, None)
        if tenant is not None:
            self._with_qos -= tenant.qos

    def ask(self, name: str, demand: Demand) -> None:
        """`name` has a batch ready to go (asked again: its batch now); `decide` grants slots."""
        tenant = self.tenants[name]
        # Back from idle, a tenant starts level with the device's clock; a busy one is never
        # behind it (its clock is the finish tag of a batch that started at or after it). A
        # tenant already waiting keeps its clock: asked again, only its batch is brought up to
        # date (requests arrived or left meanwhile).
        if tenant.waiting is None:
            tenant.virtual = max(tenant.virtual, self.virtual)
        tenant.waiting = demand

    def withdraw(self, name: str) -> None:
        """`name` no longer waits (its requests left, or its batcher is closing)."""
        if name in self.tenants:
            self.tenants[name].waiting = None

    def start_off(self, name: str) -> Grant:
        """While the scheduler is off: a slot at once, counted so that turning on is exact."""
        tenant = self.tenants[name]
        return self._start(tenant, tenant.max_rows, "off")

    def decide(self, now: float) -> Grant | None:
        """The next batch to start, or None when no slot is free or nobody waits."""
        waiting = [t for t in self.tenants.values() if t.waiting is not None]
        if self.running >= self.slots or not waiting:
            return None
        fair = min(waiting, key=_fair_key)
        urgent = [t for t in waiting if t is not fair and self._at_risk(t, fair, now)]
        if urgent:
            chosen, decision = min(urgent, key=Tenant.latest_start), "urgent"
        else:
            chosen, decision = fair, "fair"
        return self._start(chosen, self._cap(chosen, now), decision)

    def finish(
        self,
        grant: Grant,
        rows: int,
        seconds: float,
        capped: bool = False,
        latencies: Sequence[float] = (),
    ) -> None:
        """A granted batch of `rows` ran for `seconds`; `capped`: the cap cut it short;
        `latencies`: its requests' times from arrival to now (the objective's feedback)."""
        self.running -= 1
        tenant = self.tenants.get(grant.tenant)
        if tenant is None:
            return
        tenant.running -= 1
        if rows < 1:  # granted, then nothing was left to send
            tenant.virtual -= grant.charged / tenant.weight
            return
        tenant.service.observe(rows, seconds)
        tenant.device_s += seconds
        tenant.virtual += (seconds - grant.charged) / tenant.weight
        tenant.typical_rows += ROWS_WEIGHT * (rows - tenant.typical_rows)
        tenant.capped += capped
        if tenant.objective_s is not None:
            budget = tenant.objective_s - tenant.service.expected(tenant.typical_rows)
            ceiling = TAIL_CEILING * max(0.0, budget - tenant.queue_delay_s)
            for latency in latencies:
                tenant.tail.observe(latency, tenant.objective_s, ceiling)

    # -- the rule ----------------------------------------------------------------------------------

    def _at_risk(self, tenant: Tenant, fair: Tenant, now: float) -> bool:
        """Whether `tenant` misses its objective if the fair choice's least batch runs first."""
        if tenant.objective_s is None:
            return False
        assert fair.waiting is not None
        if tenant.virtual - fair.virtual > tenant.objective_s / tenant.weight:
            return False  # far ahead of its share: it waits its turn like the others
        return tenant.latest_start() - now < fair.service.bound(fair.waiting.head_rows)

    def _cap(self, chosen: Tenant, now: float) -> int:
        """The most rows `chosen` may run without making another tenant miss its objective."""
        slack = min(
            (t.slack(now) for t in self.tenants.values() if t is not chosen and t.objective_s),
            default=math.inf,
        )
        if math.isinf(slack):
            return chosen.max_rows
        return max(1, chosen.service.largest_within(slack, chosen.max_rows))

    def _start(self, tenant: Tenant, max_rows: int, decision: str) -> Grant:
        rows = min(max_rows, tenant.waiting.rows if tenant.waiting else max_rows)
        charged = tenant.service.expected(rows)
        self.virtual = max(self.virtual, tenant.virtual)
        tenant.virtual += charged / tenant.weight
        tenant.waiting = None
        tenant.running += 1
        tenant.decisions[decision] += 1
        self.running += 1
        return Grant(tenant.name, max_rows, decision, charged)


def _fair_key(tenant: Tenant) -> tuple[float, float]:
    assert tenant.waiting is not None
    return (tenant.virtual, tenant.waiting.head)
