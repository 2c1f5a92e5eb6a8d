"""Slots: what a Batcher waits for before it forms a batch (an instance, and the rows it may use).

A Batcher asks its pool for a slot in one wait (`await pool.take(source)`), forms its batch once
within `slot.max_rows`, and gives the slot back with `slot.done(...)` once the batch computed.
Without QoS the pool is an `InstancePool`: a slot is a free instance. With QoS the pool is the
model's `TenantQos` (serving/qos/slots.py): a slot is a free instance and a grant of the device's
scheduler, which pulls the batch it would run from the batcher (`DemandSource`) when it decides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from dlscale.serving.instance import Instance


# Slots and not frozen, as Slot and the scheduler's Grant: each is made once a batch, and a frozen
# dataclass's __init__ costs about six times a plain one's (object.__setattr__ per field).
@dataclass(slots=True)
class Demand:
    """A tenant's batch waiting for a slot: its oldest request's arrival and its rows."""

    head: float  # seconds, on the scheduler's clock
    rows: int
    head_rows: int = 1  # the head request's own rows: the least a batch can hold


class DemandSource(Protocol):
    """What a pool reads from its batcher: the batch it would send now."""

    def demand(self, now: float) -> Demand | None:
        """The next batch's oldest arrival and rows, or None when nothing waits."""
        ...


@dataclass(frozen=True)
class WholeDemand:
    """A DemandSource that waits whole, never split: an engine's step or lease, asked at
    `asked` for `rows` rows (its head is all of it)."""

    asked: float
    rows: int

    def demand(self, now: float) -> Demand:
        return Demand(self.asked, self.rows, self.rows)


@dataclass(eq=False, slots=True)
class Slot:
    """An instance held for one batch of at most `max_rows` rows (the head request always goes)."""

    instance: Instance
    max_rows: int
    #: Gives the slot back to its pool: (slot, rows computed, requests' latencies, capped).
    give_back: Callable[[Slot, int, Sequence[float], bool], None]
    #: A device scheduler's grant: other models wait while it is held, so the batch goes at
    #: once. Otherwise the batcher may hold the slot while the policy waits for company.
    scheduled: bool = False

    def done(self, rows: int = 0, latencies: Sequence[float] = (), capped: bool = False) -> None:
        """The batch of `rows` computed (0: nothing was sent); `latencies`: its requests' times
        since arrival; `capped`: `max_rows` cut it short."""
        self.give_back(self, rows, latencies, capped)


class SlotPool(Protocol):
    """Hands out the slots of one model version's instances."""

    def take_now(self, source: DemandSource) -> Slot | None:
        """A slot for the batch `source` has ready, when one can be had without a wait (None:
        `take`): no coroutine for the batch that finds its instance free."""
        ...

    async def take(self, source: DemandSource) -> Slot:
        """Wait for a slot for the batch `source` has ready."""
        ...


class InstancePool:
    """The pool without QoS: a slot is a free instance, and a batch may use every row.

    An instance that takes several batches at once (Instance.slots) is queued once per batch
    it takes: the next batch forms while the last one computes.
    """

    def __init__(self, instances: Sequence[Instance], max_rows: int) -> None:
        self.max_rows = max_rows
        self._free: asyncio.Queue[Instance] = asyncio.Queue()
        for instance in instances:
            for _ in range(instance.slots):
                self._free.put_nowait(instance)

    def take_now(self, source: DemandSource) -> Slot | None:
        """A free instance now, if one is (as `take` would hand it)."""
        if self._free.empty():
            return None
        return Slot(self._free.get_nowait(), self.max_rows, self._give_back)

    async def take(self, source: DemandSource) -> Slot:
        """The next free instance (the demand is not read: every batch goes as it forms)."""
        instance = await self._free.get()
        return Slot(instance, self.max_rows, self._give_back)

    def _give_back(self, slot: Slot, rows: int, latencies: Sequence[float], capped: bool) -> None:
        self._free.put_nowait(slot.instance)
