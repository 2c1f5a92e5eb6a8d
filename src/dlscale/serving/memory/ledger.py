"""The memory ledger: what each loaded model holds, the budget, and the loads that must fit it.

Every load of a model version passes through `MemoryLedger.load`: it waits for its turn on
the devices the model goes to (serving/memory/turns.py: alone when its size was never measured,
so that the growth read is its own; beside a few others when an earlier load of its file
measured it), makes room by the eviction rule (serving/memory/policy.py) for the size it
expects and reserves it, loads, measures (alone, the first loads of a file), and checks the
size against the budget and the model's own limit.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from dlscale.errors import DlscaleError
from dlscale.models.repository import ModelVersion
from dlscale.serving.memory import measure
from dlscale.serving.memory.policy import (
    MemoryFull,
    Resident,
    make_room,
    refusal,
    shortfall,
    totals,
)
from dlscale.serving.memory.sizes import Budget, Footprint, device_key, parse_limit, show_all
from dlscale.serving.memory.turns import Turns, taking_turns
from dlscale.serving.memory.versions import (
    Files,
    Stamp,
    can_change,
    check_limit,
    files_of,
    growth,
)
from dlscale.serving.observe.stats import Histogram
from dlscale.serving.served import ServedVersion

log = logging.getLogger("dlscale.models")

#: Load-time buckets in seconds: a small ONNX model to a large engine.
LOAD_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Rounds of eviction a load tries before it gives up (an eviction can fail: a pipeline that
#: loaded meanwhile holds its step).
ROUNDS = 3
#: Host memory of evicted models left with the allocator before it is handed back to the system
#: (`measure.trim`): a share of the host budget, and never less than a fixed amount (the amount
#: alone without a budget). A trim at every eviction cost about 2 ms of CPU per load (the call,
#: and the pages faulted back in by the next loads), a fifth of a small model's load on demand;
#: under a small budget a quarter still trimmed every five loads of a 3 MiB model, and the
#: faults cost ONNX Runtime's session twice its CPU (docs/memory.md, "The cycle of a load").
TRIM_SHARE = 0.25
TRIM_BYTES = 64 * 2**20

#: Loads at once on the host by default (`--parallel-loads`): half its cores, at most 4. On a
#: 2-core host four side by side each took 10 to 12 ms against 4 ms alone, for no more loads a
#: second, and resident requests waited behind them (BENCHMARKS.md, "Loads side by side").
PARALLEL = min(4, max(1, (os.cpu_count() or 2) // 2))
#: Loads of one file whose growth is read (over memory handed back to the system): the first
#: carries the runtime's one-time set-up, the second corrects it; later loads take the smaller
#: figure without reading memory twice.
MEASURES = 2

Evict = Callable[[str, str], Awaitable[None]]
#: The models something other than requests holds, and the adapters placed on each base.
Ties = tuple[set[str], dict[str, set[str]]]


class MemoryLedger:
    """The bytes each loaded model holds by device, its last use, and the per-device budget."""

    def __init__(
        self,
        budget: Budget | None = None,
        clock: Callable[[], float] = time.monotonic,
        parallel: int = PARALLEL,
    ) -> None:
        self.budget: Budget = dict(budget or {})
        self.clock = clock
        #: Models never evicted (those marked `pinned` that the server loaded at its start).
        self.pinned: set[str] = set()
        #: Set by the manager: unload a model to make room (name, why); in one pass over its
        #: models, those something else holds now (a loaded pipeline uses it, or it is loading
        #: or unloading) and the loaded adapters placed on each model's engine (its holders).
        self.evict: Evict | None = None
        self.ties: Callable[[], Ties] = lambda: (set(), {})
        self.load_seconds = Histogram(LOAD_BUCKETS_S)
        self.evictions = 0
        #: Readings of the devices' memory taken around loads (two per load measured), and
        #: the times freed memory was handed back to the system.
        self.readings = 0
        self.trims = 0
        self._trimming: set[asyncio.Task[None]] = set()
        #: Evicted models whose instances are still closing (their bytes left the ledger).
        self._closing: set[asyncio.Task[None]] = set()
        #: Host bytes of the models freed since the last trim.
        self._untrimmed = 0
        self._held: dict[int, tuple[str, Footprint]] = {}  # by load serial
        self._last: dict[str, float] = {}
        self._names: Counter[str] = Counter()  # loaded versions by model name
        #: Requests in the server by model name (a dict, not a Counter: two reads a request,
        #: and a Counter's missing key and delete run in Python).
        self._in_use: dict[str, int] = {}
        self._known: dict[Stamp, Footprint] = {}
        self._measures: Counter[Stamp] = Counter()  # loads of each file measured
        self._measurer: dict[Stamp, str] = {}  # the name whose load first measured it
        #: Loads at once on the host; a GPU's loads take turns (`_turns_of`).
        self.parallel = parallel
        self._turns: dict[str, Turns] = {}
        #: The sizes loads in flight expect, by token: counted as used, so that loads side by
        #: side never make room for themselves in the same bytes.
        self._reserved: dict[int, tuple[str, Footprint]] = {}
        self._tokens = itertools.count()
        self._ending: list[asyncio.Future[None]] = []  # loads waiting for a reservation to end
        self._room = asyncio.Lock()
        #: The most the ledger (held and reserved) counted on each device so far.
        self.peak: Footprint = {}

    # -- what is resident ------------------------------------------------------------------------

    def resident(self) -> list[Resident]:
        """Every loaded model as the eviction rule sees it, and each load in flight's
        reservation (held: nothing evicts it)."""
        sizes: dict[str, list[Footprint]] = {}
        for name, size in self._held.values():
            sizes.setdefault(name, []).append(size)
        # One pass over the manager's models, not one per resident model: asked per model, it
        # took a tenth of a load's CPU with 100 models (py-spy, docs/memory.md).
        tied, holders = self.ties()
        return [
            Resident(
                name,
                totals(held),
                self._last.get(name, 0.0),
                name in self.pinned,
                self._in_use.get(name, 0),
                name in tied,
                frozenset(holders.get(name, ())),
            )
            for name, held in sorted(sizes.items())
        ] + [
            Resident(f"{name} (loading)", size, self.clock(), held=True)
            for name, size in self._reserved.values()
        ]

    def used(self) -> Footprint:
        """Bytes the loaded models hold on each device, by their measured sizes, and those the
        loads in flight reserved (what the budget bounds)."""
        return totals(size for _, size in (*self._held.values(), *self._reserved.values()))

    def running(self) -> dict[str, int]:
        """Loads taking their turn on each device now (making room, loading or measuring)."""
        return {device: t.running for device, t in sorted(self._turns.items())}

    def most_running(self) -> dict[str, int]:
        """The most loads that took their turns at once on each device so far."""
        return {device: t.most for device, t in sorted(self._turns.items())}

    def enter(self, name: str) -> None:
        """A request of `name` is in the server (its end: `leave`, whatever the outcome): the
        model is used now and not evicted under it (the eviction rule takes the least recently
        used first; a name of no loaded model is not kept, since requests may name anything)."""
        self._in_use[name] = self._in_use.get(name, 0) + 1
        if name in self._names:
            self._last[name] = self.clock()

    def leave(self, name: str) -> None:
        """The request `enter` counted has left."""
        left = self._in_use.pop(name) - 1
        if left:
            self._in_use[name] = left
        if name in self._names:
            self._last[name] = self.clock()

    def release(self, serial: int) -> None:
        """A loaded version was freed (evicted or unloaded): its bytes leave the ledger, and
        stay with the allocator until a trim hands them back (a reading before that would see
        a load reuse them and grow less than it holds)."""
        name, size = self._held.pop(serial, ("", {}))
        self._untrimmed += size.get("cpu", 0)
        if name:
            self._names[name] -= 1
            if not self._names[name]:
                del self._names[name]
                self._last.pop(name, None)

    # -- loading ---------------------------------------------------------------------------------

    async def load(
        self,
        mv: ModelVersion,
        load: Callable[[], Awaitable[ServedVersion]],
        close: Callable[[ServedVersion], Awaitable[None]],
        files: Files | None = None,
    ) -> ServedVersion:
        """Load a version within the budget: room made and reserved before for the size
        expected, and after for the size measured; a load that cannot fit is freed and refused
        with the figures. `files`: the version's `files_of`, when the caller read it already."""
        if mv.config.is_pipeline:
            return await load()  # no instance of its own: its steps are measured as they load
        devices = sorted({device_key(g.device) for g in mv.config.instances} | {"cpu"})
        limit = parse_limit(mv.name, mv.config.memory.limit)
        # Off the loop: a walk of the version's folder and a stat of its file.
        floor, stamp = files if files is not None else await asyncio.to_thread(files_of, mv)
        turns = [self._turns_of(d) for d in devices]
        async with taking_turns(turns, alone=not self._settled(stamp, mv.name)):
            # Read once the turn is taken: another name's load of the same file, ahead in the
            # turns, may have measured it meanwhile (a figure read before the wait was the
            # first one, set-up included, and this load wrote it back over the correction).
            known = self._known.get(stamp, {})
            need = (known if self._settled(stamp, mv.name) else {}) or {**floor, **limit}
            token = await self._reserve(mv.name, need)
            try:
                served, size, seconds, measured = await self._measured(
                    mv, load, devices, turns, (floor, known, stamp)
                )
            finally:
                self._unreserve(token)
            try:
                check_limit(mv, size, limit)
                await self._make_room(mv.name, size)  # at once when it is within the reservation
            except DlscaleError:
                await close(served)
                raise
            # Only a measurement is the file's figure now: a size taken from the known one is
            # not written back (a load beside another name's measurement of the file would
            # put the figure it read before over the correction).
            if measured or stamp not in self._known:
                self._known[stamp] = size
            served.memory = size
            self._held[served.serial] = (mv.name, size)
            self._note_peak()
            self._names[mv.name] += 1
            self._last[mv.name] = self.clock()
            self.load_seconds.observe(seconds)
        log.info(
            "model %s v%d: loaded in %.3f s, holding %s (resident %s, budget %s)",
            mv.name, mv.version, seconds, show_all(size), show_all(self.used()),
            show_all(self.budget) if self.budget else "none",
        )  # fmt: skip
        return served

    async def _reserve(self, model: str, need: Footprint) -> int:
        """Make room for `need` and reserve it (its token). A load that does not fit while
        other loads hold reservations waits for one of them to end and tries again: loads side
        by side refuse nothing that loads one at a time would have loaded."""
        while True:
            # One load makes room at a time: loads side by side would take the bytes each
            # other's evictions freed (the Ray bench refused requests with idle models left).
            async with self._room:
                try:
                    await self._make_room(model, need)
                except MemoryFull:
                    if not self._reserved:
                        raise
                    ended = asyncio.get_running_loop().create_future()
                    self._ending.append(ended)
                else:
                    token = next(self._tokens)
                    self._reserved[token] = (model, need)  # no await since the room was made
                    self._note_peak()
                    return token
            await ended  # not holding the lock: the load it waits for may need room after

    def _note_peak(self) -> None:
        for device, bytes_ in self.used().items():
            self.peak[device] = max(self.peak.get(device, 0), bytes_)

    def _unreserve(self, token: int) -> None:
        """A load in flight is held or refused: its reservation ends, and the loads waiting for
        one to end try again."""
        del self._reserved[token]
        ending, self._ending = self._ending, []
        for ended in ending:
            if not ended.done():
                ended.set_result(None)

    async def _measured(
        self,
        mv: ModelVersion,
        load: Callable[[], Awaitable[ServedVersion]],
        devices: list[str],
        turns: list[Turns],
        sizing: tuple[Footprint, Footprint, Stamp],
    ) -> tuple[ServedVersion, Footprint, float, bool]:
        """Load, and the size it holds: measured when the load ran alone on its devices and its
        file has been measured fewer than `MEASURES` times, else the size known for its file;
        and whether the size is a measurement (over memory handed back)."""
        floor, known, stamp = sizing
        alone = [t.entered for t in turns] if all(t.running == 1 for t in turns) else None
        trim = self._trim_due(known if self._settled(stamp, mv.name) else {})
        # Memory freed and not handed back hides part of a load's growth: a size measured
        # over it may not lower the size known for the file (the allocator reused it).
        hidden = {"cpu"} if self._untrimmed and not trim else set()
        measuring = (
            alone is not None
            and self._measures[stamp] < MEASURES
            and can_change(devices, known, hidden)
        )
        self._untrimmed = 0 if trim else self._untrimmed
        self.trims += trim
        before: Footprint = {}
        running: frozenset[int] = frozenset()
        if measuring or any(d != "cpu" for d in devices):
            # A free ending within a reading would hide growth; a GPU's bytes must be free.
            await self._closed_all()
        if measuring:
            # A trim beside an earlier load that ended within this reading would hide growth.
            await asyncio.gather(*self._trimming)
            before, running = await asyncio.to_thread(measure.trim_and_read, trim, devices)
            self.readings += 1
        elif trim:
            self._trim_beside()
        start = self.clock()
        served = await load()
        seconds = self.clock() - start
        if measuring and [t.entered for t in turns] == alone:
            after = await asyncio.to_thread(measure.read, devices, running)
            self.readings += 1
            # A reading over freed memory not handed back keeps the known figure: not counted.
            self._measures[stamp] += not hidden
            self._measurer.setdefault(stamp, mv.name)
            return served, growth(devices, before, after, floor, known, hidden), seconds, not hidden
        # Not measured, or another load ran beside it: its growth is not its own alone.
        return served, growth(devices, {}, {}, floor, known), seconds, False

    def closing(self, task: asyncio.Task[None]) -> None:
        """An evicted model's instances close in `task`, beside the load that made room: a
        reading, and a load on a GPU (whose bytes must be free before it allocates), wait for
        it first; a host load of known size does not (the cold request waited for the
        victim's unload: a trip to its thread and back, 20 to 130 ms on a busy host)."""
        self._closing.add(task)
        task.add_done_callback(self._closed)

    def _closed(self, task: asyncio.Task[None]) -> None:
        self._closing.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the eviction's caller or its own log says it

    async def _closed_all(self) -> None:
        """Wait for the evicted models' instances still closing."""
        while self._closing:
            await asyncio.wait(list(self._closing))

    def _settled(self, stamp: Stamp, name: str) -> bool:
        """Whether a load of `name` takes the size known for its file and config as it is, or
        loads as a first load (alone, over memory handed back, reserving its files, measured).

        The file's first figure carries the runtime's one-time set-up (33.6 MiB against 3.2
        for the bench's MLP): the name that measured it keeps it until a second measurement
        corrects it, as before, but another name of the same file loads as a first load
        until then. Reserved for every copy, that figure let one copy in at a time under the
        bench's budget (659 requests refused, 503, in one run)."""
        if stamp not in self._known:
            return False
        return self._measures[stamp] >= MEASURES or self._measurer.get(stamp) == name

    def _trim_beside(self) -> None:
        """Hand freed memory back in a thread beside this load, not before it: no reading
        follows that it could distort, and the cold request does not wait for the trip (1 to
        1.5 ms, one load in four or five on the bench). glibc's trim takes the allocator's
        locks, so it is safe beside allocations; ctypes releases the GIL for it."""
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(measure.trim))
        self._trimming.add(task)
        task.add_done_callback(self._trimming.discard)

    def _trim_due(self, known: Footprint) -> bool:
        """Whether the memory of evicted models goes back to the system before this load's
        first reading: once enough has gathered, or before a file's first measurement (its
        growth would hide in the freed memory, and the files alone would be counted)."""
        if not self._untrimmed:
            return False
        host = self.budget.get("cpu")
        due = max(int(host * TRIM_SHARE), TRIM_BYTES) if host is not None else TRIM_BYTES
        return "cpu" not in known or self._untrimmed >= due

    async def _make_room(self, model: str, need: Footprint) -> None:
        """Evict the least recently used idle models until `need` fits; the refusal's figures
        when it cannot. The memory freed goes back to the system at a later load (`_trim_due`)."""
        failed: set[str] = set()
        for _ in range(ROUNDS):
            if not shortfall(need, self.budget, self.used()):
                return  # fits: the view of every model is not needed
            resident = self.resident()
            for r in resident:
                r.held = r.held or r.name in failed
            victims = make_room(model, need, self.budget, resident) if self.budget else []
            if not victims:
                return
            for victim in victims:
                if self.evict is None:
                    raise MemoryFull(f"model {model!r} does not fit and nothing may be evicted")
                if victim.name in self.ties()[0] or self._in_use.get(victim.name):
                    # Taken meanwhile (an earlier eviction awaited): a load that holds its name
                    # may be waiting for this load's device, so it is not waited for.
                    failed.add(victim.name)
                    continue
                try:
                    await self.evict(victim.name, f"least recently used, room for {model!r}")
                    self.evictions += 1
                except DlscaleError as exc:
                    log.warning("model %s: not evicted: %s", victim.name, exc)
                    failed.add(victim.name)
        resident = [r for r in self.resident() if r.name not in failed]
        if make_room(model, need, self.budget, resident):
            raise MemoryFull(refusal(model, need, self.budget, self.resident()))

    def _turns_of(self, device: str) -> Turns:
        """A device's turns: `parallel` loads at once on the host, one at a time on a GPU (two
        loads at once there have not been measured)."""
        return self._turns.setdefault(device, Turns(self.parallel if device == "cpu" else 1))
