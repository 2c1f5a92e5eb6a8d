"""The memory ledger: what each loaded model holds, the budget, and the loads that must fit it.

Every load of a model version passes through `MemoryLedger.load`: it waits for the devices the
model goes to (one load per device at a time, so that the growth measured is this model's),
makes room by the eviction rule (serving/memory/policy.py) for the size it expects, loads,
measures, and checks the measured size against the budget and the model's own limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

from dlscale.errors import DlscaleError
from dlscale.models.repository import ModelVersion
from dlscale.serving.memory import measure
from dlscale.serving.memory.policy import (
    MemoryFull,
    Resident,
    TooLarge,
    make_room,
    refusal,
    shortfall,
)
from dlscale.serving.memory.sizes import Budget, Footprint, device_key, parse_limit, show_all
from dlscale.serving.observe.stats import Histogram
from dlscale.serving.served import ServedVersion

log = logging.getLogger("dlscale.models")

#: Load-time buckets in seconds: a small ONNX model to a large engine.
LOAD_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Rounds of eviction a load tries before it gives up (an eviction can fail: a pipeline that
#: loaded meanwhile holds its step).
ROUNDS = 3
#: Host memory of evicted models left with the allocator before it is handed back to the system
#: (`measure.trim`): a share of the host budget, or a fixed amount without one. A trim at every
#: eviction cost about 2 ms of CPU per load (the call, and the pages faulted back in by the next
#: load), a fifth of a small model's load on demand (docs/memory.md).
TRIM_SHARE = 0.25
TRIM_BYTES = 64 * 2**20

Evict = Callable[[str, str], Awaitable[None]]
#: The models something other than requests holds, and the adapters placed on each base.
Ties = tuple[set[str], dict[str, set[str]]]


class MemoryLedger:
    """The bytes each loaded model holds by device, its last use, and the per-device budget."""

    def __init__(self, budget: Budget | None = None, clock: Callable[[], float] = time.monotonic):
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
        #: Host bytes of the models evicted since the last trim.
        self._untrimmed = 0
        self._held: dict[int, tuple[str, Footprint]] = {}  # by load serial
        self._last: dict[str, float] = {}
        self._names: Counter[str] = Counter()  # loaded versions by model name
        self._in_use: Counter[str] = Counter()
        self._known: dict[tuple[str, int, int, int], Footprint] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    # -- what is resident ------------------------------------------------------------------------

    def resident(self) -> list[Resident]:
        """Every loaded model as the eviction rule sees it."""
        sizes: dict[str, Footprint] = {}
        for name, size in self._held.values():
            held = sizes.setdefault(name, {})
            for device, bytes_ in size.items():
                held[device] = held.get(device, 0) + bytes_
        # One pass over the manager's models, not one per resident model: asked per model, it
        # took a tenth of a load's CPU with 100 models (py-spy, docs/memory.md).
        tied, holders = self.ties()
        return [
            Resident(
                name,
                size,
                self._last.get(name, 0.0),
                name in self.pinned,
                self._in_use[name],
                name in tied,
                frozenset(holders.get(name, ())),
            )
            for name, size in sorted(sizes.items())
        ]

    def used(self) -> Footprint:
        """Bytes the loaded models hold on each device, by their measured sizes."""
        out: Footprint = {}
        for _, size in self._held.values():
            for device, bytes_ in size.items():
                out[device] = out.get(device, 0) + bytes_
        return out

    def touch(self, name: str) -> None:
        """A model was used now (the eviction rule takes the least recently used first); names
        of no loaded model are not kept (requests may name anything)."""
        if name in self._names:
            self._last[name] = self.clock()

    def using(self, name: str) -> _Using:
        """A request of `name` is in the server: the model is not evicted under it."""
        return _Using(self, name)

    def _enter(self, name: str) -> None:
        self._in_use[name] += 1
        self.touch(name)

    def _leave(self, name: str) -> None:
        self._in_use[name] -= 1
        if not self._in_use[name]:
            del self._in_use[name]
        self.touch(name)

    def release(self, serial: int) -> None:
        """A loaded version was freed: its bytes leave the ledger."""
        name, _ = self._held.pop(serial, ("", {}))
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
    ) -> ServedVersion:
        """Load a version within the budget: room made before for the size expected, and after
        for the size measured; a load that cannot fit is freed and refused with the figures."""
        if mv.config.is_pipeline:
            return await load()  # no instance of its own: its steps are measured as they load
        devices = sorted({device_key(g.device) for g in mv.config.instances} | {"cpu"})
        limit = parse_limit(mv.name, mv.config.memory.limit)
        async with self._devices(devices):
            # Off the loop: a walk of the version's folder and a stat of its file.
            floor, stamp = await asyncio.to_thread(_files_and_stamp, mv)
            known = self._known.get(stamp, {})
            need = known or {**floor, **limit}
            await self._make_room(mv.name, need)
            trim = self._trim_due(known)
            before = await asyncio.to_thread(_trim_and_read, trim, devices)
            # Memory freed and not handed back hides part of a load's growth: a size measured
            # over it may not lower the size known for the file (the allocator reused it).
            hidden = {"cpu"} if self._untrimmed and not trim else set()
            self._untrimmed = 0 if trim else self._untrimmed
            start = self.clock()
            served = await load()
            seconds = self.clock() - start
            after = await asyncio.to_thread(measure.read, devices)
            size = _growth(devices, before, after, floor, known, hidden)
            try:
                _check_limit(mv, size, limit)
                await self._make_room(mv.name, size)
            except DlscaleError:
                await close(served)
                raise
            self._known[stamp] = served.memory = size
            self._held[served.serial] = (mv.name, size)
            self._names[mv.name] += 1
            self.touch(mv.name)
            self.load_seconds.observe(seconds)
        log.info(
            "model %s v%d: loaded in %.3f s, holding %s (resident %s, budget %s)",
            mv.name, mv.version, seconds, show_all(size), show_all(self.used()),
            show_all(self.budget) if self.budget else "none",
        )  # fmt: skip
        return served

    def _trim_due(self, known: Footprint) -> bool:
        """Whether the memory of evicted models goes back to the system before this load's
        first reading: once enough has gathered, or before a file's first measurement (its
        growth would hide in the freed memory, and the files alone would be counted)."""
        if not self._untrimmed:
            return False
        host = self.budget.get("cpu")
        due = int(host * TRIM_SHARE) if host is not None else TRIM_BYTES
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
                if victim.name in self.ties()[0] or self._in_use[victim.name]:
                    # Taken meanwhile (an earlier eviction awaited): a load that holds its name
                    # may be waiting for this load's device, so it is not waited for.
                    failed.add(victim.name)
                    continue
                try:
                    await self.evict(victim.name, f"least recently used, room for {model!r}")
                    self.evictions += 1
                    self._untrimmed += victim.footprint.get("cpu", 0)
                except DlscaleError as exc:
                    log.warning("model %s: not evicted: %s", victim.name, exc)
                    failed.add(victim.name)
        resident = [r for r in self.resident() if r.name not in failed]
        if make_room(model, need, self.budget, resident):
            raise MemoryFull(refusal(model, need, self.budget, self.resident()))

    @contextlib.asynccontextmanager
    async def _devices(self, devices: list[str]) -> AsyncIterator[None]:
        """One load per device at a time; locks taken in name order, so two loads never wait
        for each other's."""
        async with contextlib.AsyncExitStack() as stack:
            for device in devices:
                await stack.enter_async_context(self._locks.setdefault(device, asyncio.Lock()))
            yield


def _trim_and_read(trim: bool, devices: list[str]) -> Footprint:
    """The devices' bytes now, after handing the memory of evicted models back when `trim`
    (one trip off the loop for both)."""
    if trim:
        measure.trim()
    return measure.read(devices)


def _files_and_stamp(mv: ModelVersion) -> tuple[Footprint, tuple[str, int, int, int]]:
    return _files(mv), _stamp(mv)


def _stamp(mv: ModelVersion) -> tuple[str, int, int, int]:
    """What a remembered size belongs to: the version and its model file as it is now."""
    try:
        stat = mv.model_file.stat()
    except OSError:
        return (mv.name, mv.version, 0, 0)
    return (mv.name, mv.version, stat.st_size, stat.st_mtime_ns)


def _files(mv: ModelVersion) -> Footprint:
    """The least a load holds: the version's files, once per instance, on each device."""
    size = measure.folder_bytes(mv.path)
    out: Footprint = {}
    for group in mv.config.instances:
        key = device_key(group.device)
        out[key] = out.get(key, 0) + size * group.count
    return out


def _growth(
    devices: list[str],
    before: Footprint,
    after: Footprint,
    floor: Footprint,
    known: Footprint,
    hidden: set[str] | frozenset[str] = frozenset(),
) -> Footprint:
    """The growth measured on each device, never below the files.

    An allocator that reuses memory freed by an earlier unload shows less growth than the model
    holds: a growth at or below the files keeps the size measured at an earlier load of the same
    file, and so does any growth on the `hidden` devices (freed memory not handed back yet). A
    larger growth replaces a larger earlier one (the first load in a process also paid the
    runtime's one-time set-up)."""
    out: Footprint = {}
    for d in devices:
        grown = after[d] - before[d] if d in before and d in after else 0
        if d in hidden and d in known:
            out[d] = max(known[d], floor.get(d, 0))
        elif grown <= floor.get(d, 0):
            out[d] = max(known.get(d, 0), floor.get(d, 0))
        else:
            out[d] = min(grown, known[d]) if d in known else grown
    return out


def _check_limit(mv: ModelVersion, size: Footprint, limit: Footprint) -> None:
    over = {d: size.get(d, 0) for d, cap in limit.items() if size.get(d, 0) > cap}
    if over:
        raise TooLarge(
            f"model {mv.name!r} version {mv.version} holds {show_all(over)} once loaded, above "
            f"its config's memory limit of {show_all({d: limit[d] for d in over})}"
        )


class _Using:
    """`MemoryLedger.using`'s context: a plain class, since every request enters one (a
    generator-based context manager costs a few microseconds more per request)."""

    __slots__ = ("ledger", "name")

    def __init__(self, ledger: MemoryLedger, name: str) -> None:
        self.ledger = ledger
        self.name = name

    def __enter__(self) -> None:
        self.ledger._enter(self.name)

    def __exit__(self, *exc: object) -> None:
        self.ledger._leave(self.name)
