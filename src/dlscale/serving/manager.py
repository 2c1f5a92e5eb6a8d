"""Model lifecycle: each model's state through load, serve, drain and unload (a version's
loading itself is serving/loading.py's)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

from dlscale.backends.base import FailureReport
from dlscale.errors import ConfigError, DlscaleError, NotFound, Unavailable
from dlscale.models.repository import ModelRepository, ModelVersion
from dlscale.models.sources import ModelSource
from dlscale.serving.caller import CallRoute
from dlscale.serving.dependencies import config_of, load_base, load_steps
from dlscale.serving.loading import Loader, close_version
from dlscale.serving.memory.ledger import MemoryLedger
from dlscale.serving.memory.versions import Files, files_of
from dlscale.serving.qos.gate import DeviceGates
from dlscale.serving.served import ModelEntry, ModelState, ServedVersion
from dlscale.serving.versions import resolve_version, unknown_model

log = logging.getLogger("dlscale.models")
#: Read on every request (`get`): bound once, since on Python 3.11 `ModelState.READY` is a
#: Python-level `__getattr__` call on the enum class.
_READY = ModelState.READY


class ModelManager:
    """Holds every model of a repository; loading or unloading one never disturbs another.

    Models whose instances share a device take turns on it through one gate per device
    (`gates`, serving/qos/gate.py); `DeviceGates(enabled=False)` ignores every [qos] table.
    Models that call models send their calls down `calls` (serving/caller.py), which the
    composition root connects to the plane it builds over this manager.
    """

    def __init__(
        self,
        repository: ModelRepository,
        gates: DeviceGates | None = None,
        calls: CallRoute | None = None,
    ) -> None:
        self.repository = repository
        self.gates = gates or DeviceGates()
        #: Where models' calls to models go (Triton's BLS); unconnected, they are refused.
        self.calls = calls or CallRoute()
        #: Makes each served version; this manager keeps their states (serving/loading.py).
        self.loader = Loader(self.gates, self.calls, self.get, self._reporter)
        #: What each loaded model holds, and the budget every load fits (docs/memory.md).
        self.memory = MemoryLedger()
        self.memory.evict, self.memory.ties = self._evict, self._ties
        #: An unload's wait for its requests before it stops them (None: no limit).
        self.grace_s: float | None = None
        self._entries: dict[str, ModelEntry] = {}
        # A lock per name while someone holds or waits for it, and how many do: no name
        # leaves a lock behind (an unload of a name that never existed made one, kept).
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        #: The models this server should be serving: asked for at start or loaded since, less
        #: those unloaded. Strict readiness wants each of them READY.
        self.required: set[str] = set()
        self._failing: set[asyncio.Task[None]] = set()  # backends' deaths being handled

    @classmethod
    def open(
        cls, root: Path, gates: DeviceGates | None = None, calls: CallRoute | None = None
    ) -> ModelManager:
        """A manager over the repository folder at `root` (nothing loaded yet)."""
        return cls(ModelRepository(root), gates, calls)

    # -- lookups ---------------------------------------------------------------------------------

    def get(self, name: str, version: str = "") -> ServedVersion:
        """The served version a request goes to (the newest when `version` is empty)."""
        entry = self._entries.get(name)
        if entry is None:
            raise unknown_model(name, self.repository.names, self.ready_names())
        if entry.state is not _READY:
            detail = f": {entry.reason}" if entry.reason else ""
            raise Unavailable(f"model {name!r} is not ready ({entry.state.value}{detail})")
        versions = entry.versions
        if not version:  # most requests: resolve_version's newest, without its call
            return versions[max(versions)]
        return versions[resolve_version(name, version, versions)]

    def state(self, name: str) -> ModelState | None:
        """A model's state now, in one lookup (None: never loaded); the request path asks it."""
        entry = self._entries.get(name)
        return entry.state if entry is not None else None

    def entries(self) -> list[ModelEntry]:
        """Every model this manager knows of, in name order."""
        return [self._entries[n] for n in sorted(self._entries)]

    def served(self) -> list[ServedVersion]:
        """Every loaded version of every model, in name order."""
        return [v for e in self.entries() for v in e.versions.values()]

    def ready_names(self) -> list[str]:
        return [e.name for e in self.entries() if e.state is ModelState.READY]

    def not_ready(self) -> list[ModelEntry]:
        """The models the server should be serving that are not READY, with their states."""
        entries = self._entries
        return [
            entries.get(n) or ModelEntry(n, ModelState.UNAVAILABLE, "not loaded")
            for n in sorted(self.required)
            if (entry := entries.get(n)) is None or entry.state is not ModelState.READY
        ]

    def expect(self, names: Iterable[str]) -> None:
        """Models the server starts with: required, and LOADING until their turn comes."""
        for name in names:
            self.required.add(name)
            if name not in self._entries:
                self._set(name, ModelState.LOADING, "waiting for its turn to load")

    # -- lifecycle -------------------------------------------------------------------------------

    async def load_all(self, names: Iterable[str] | None = None) -> dict[str, DlscaleError]:
        """Load these models (default: the whole repository) side by side, a few at a time,
        pipelines after the models they use; those that failed come back with their error,
        each recorded UNAVAILABLE with its reason."""
        wanted = list(self.repository.names() if names is None else names)
        failed: dict[str, DlscaleError] = {}
        before = set(self.ready_names())
        # Models load in threads (reading, compiling, warming up): a few at once shorten a
        # start-up that took 22-50 s one model at a time, without oversubscribing the host.
        gate = asyncio.Semaphore(max(2, min(len(wanted), os.cpu_count() or 2)))

        async def one(name: str) -> None:
            if name not in before and name in self.ready_names():
                return  # loaded meanwhile as a step of a pipeline: loading it again is waste
            async with gate:
                try:
                    await self.load(name)
                except DlscaleError as exc:
                    failed[name] = exc  # the others still load

        configs = {n: c for n in wanted if (c := config_of(self.repository, n)) is not None}
        # Adapters too: each would load its base when not READY yet.
        pipelines = {n for n, c in configs.items() if c.is_pipeline or c.is_adapter}
        # Pinned only when the server starts with it: the API cannot pin the device full.
        self.memory.pinned.update(n for n, c in configs.items() if c.memory.pinned)
        await asyncio.gather(*(one(n) for n in wanted if n not in pipelines))
        await asyncio.gather(*(one(n) for n in wanted if n in pipelines))
        return {n: failed[n] for n in wanted if n in failed}

    async def load(
        self,
        name: str,
        source: ModelSource | None = None,
        repository: ModelRepository | None = None,
        chain: tuple[str, ...] = (),
        cold_only: bool = False,
    ) -> None:
        """Load (or reload) a model; the old versions keep serving until the new ones are ready.

        `source` replaces the config the repository has, and `repository` the folder its files
        are read from (a load request's overrides). A pipeline's step models load first when
        they are not loaded and the repository has them. A model another needs (a pipeline's
        step, an adapter's base: serving/dependencies.py) has `chain`, the models whose loads
        asked for it (a circle is refused), and with `cold_only` is not loaded when it is READY
        by the time its turn comes (an adapter's base)."""
        async with self._locked(name):
            previous = self._entries.get(name)
            if cold_only and previous is not None and previous.state is ModelState.READY:
                return
            if previous is None or previous.state is not ModelState.READY:
                self._set(name, ModelState.LOADING)
            try:
                # Off the loop, in one trip: the config, version folders and files to read.
                versions, files = await asyncio.to_thread(
                    _versions, repository or self.repository, name, source
                )
                if versions[0].config.steps is not None:
                    await load_steps(self, name, versions[0].config.step_models, (*chain, name))
                if versions[0].config.is_adapter:
                    versions = await load_base(self, name, versions, chain)
                elif previous is not None and previous.state is ModelState.READY:
                    self._check_no_adapters(name)
                served = {}
                for mv in versions:
                    load = functools.partial(self.loader.load, mv)
                    read = files.get(mv.version)
                    served[mv.version] = await self.memory.load(mv, load, self._free, read)
            except Exception as exc:
                err = exc if isinstance(exc, DlscaleError) else _unforeseen(name, exc)
                if previous is None or previous.state is not ModelState.READY:
                    self._set(name, ModelState.UNAVAILABLE, str(err))
                    log.error("model %s failed to load: %s", name, err)
                else:
                    log.error("model %s: reload failed, keeping the loaded versions: %s", name, err)
                if err is exc:
                    raise
                raise err from exc
            entry = ModelEntry(name, ModelState.READY, versions=served)
            self._entries[name] = entry
            self.required.add(name)
            log.info("model %s: READY (versions %s)", name, sorted(served))
            if previous is not None and previous.versions:
                await self._retire(previous, self.grace_s)

    async def unload(
        self,
        name: str,
        grace_s: float | None = None,
        reason: str = "unloaded",
        released: asyncio.Future[None] | None = None,
    ) -> None:
        """Stop taking requests, finish those in flight within the grace, then free the model;
        `released` is set once the model's bytes have left the memory ledger, before its
        instances close."""
        async with self._locked(name):
            entry = self._entries.get(name)
            if entry is None:
                raise NotFound(f"unknown model {name!r}")
            users = self.pipelines_using(name)
            if users:  # the safe choice: a pipeline never loses a step while it is READY
                self._check_no_adapters(name)
                raise ConfigError(
                    f"model {name!r} is a step of the loaded pipelines {users}: unload them first"
                )
            self.required.discard(name)
            self.memory.pinned.discard(name)
            self._set(name, ModelState.UNLOADING)
            await self._retire(entry, self.grace_s if grace_s is None else grace_s, released)
            self._set(name, ModelState.UNAVAILABLE, reason)

    async def _evict(self, name: str, why: str) -> None:
        """Unload a model to make room for another (the memory ledger's choice). Returns once
        its bytes have left the ledger: its instances close beside the load that asked for the
        room, and the ledger waits for them only where a free matters (a reading, a GPU:
        `MemoryLedger.closing`). The model stays UNLOADING, its name held, until they have.

        A pipeline or an adapter has no instance of its own, and holds its steps or its base
        until it is gone (a base whose adapter is still placed cannot go): waited for whole."""
        entry = self._entries.get(name)
        if entry is None or any(v.runner.models for v in entry.versions.values()):
            await self.unload(name, reason=f"evicted ({why})")
            return
        loop = asyncio.get_running_loop()
        released = loop.create_future()
        unload = loop.create_task(self._evicted(name, why, released))
        self.memory.closing(unload)
        await asyncio.wait([released, unload], return_when=asyncio.FIRST_COMPLETED)
        if unload.done():
            unload.result()  # refused before anything was released (a pipeline holds it)

    async def _evicted(self, name: str, why: str, released: asyncio.Future[None]) -> None:
        try:
            await self.unload(name, None, f"evicted ({why})", released)
        except DlscaleError as exc:
            if not released.done():
                raise  # not evicted: the ledger says why
            log.warning("model %s: evicted, but it did not close cleanly: %s", name, exc)

    def _ties(self) -> tuple[set[str], dict[str, set[str]]]:
        """In one pass: the models something other than requests holds (a loaded pipeline uses
        it, or it is loading or unloading: the ledger evicts none of these), and the adapters
        placed on each base (they hold it too, but go before it)."""
        held, adapters = set(self._locks), dict[str, set[str]]()
        for entry in self._entries.values():
            for served in list(entry.versions.values())[:1]:
                for model in served.runner.models:
                    if served.config.is_adapter:
                        adapters.setdefault(model, set()).add(entry.name)
                    else:
                        held.add(model)
        return held, adapters

    def adapters_on(self, base: str) -> list[str]:
        """The loaded LoRA adapters placed on a base model's engine."""
        return sorted(self._ties()[1].get(base, ()))

    async def _free(self, served: ServedVersion) -> None:
        """Free a version that loaded but may not stay (the memory budget refused it)."""
        await self._retire(ModelEntry(served.version.name, ModelState.READY, "", {0: served}), 0.0)

    async def close(self, grace_s: float | None = None) -> None:
        """Unload everything (shutdown): requests finish within the grace; pipelines go first."""
        while loaded := [e.name for e in self.entries() if e.versions]:
            free = [n for n in loaded if not self.pipelines_using(n)]
            unloads = (self.unload(n, grace_s) for n in free or loaded)
            await asyncio.gather(*unloads, return_exceptions=True)
            if not free:
                break

    def pipelines_using(self, name: str) -> list[str]:
        """The loaded pipelines that have `name` as a step model."""
        # Not through `entries()`: each eviction asks, and sorting every model's entry for a
        # list that is almost always empty was O(n log n) on the event loop per load.
        return sorted(
            e.name
            for e in self._entries.values()
            if e.versions and name in next(iter(e.versions.values())).runner.models
        )

    def _reporter(self, name: str, serial: int) -> FailureReport:
        """How the backends of one load report that they can no longer serve (from any thread):
        the report is handled on the event loop, as `_fail`."""
        loop = asyncio.get_running_loop()

        def on_loop(reason: str) -> None:
            task = loop.create_task(self._fail(name, serial, reason))
            self._failing.add(task)
            task.add_done_callback(self._failing.discard)

        def report(reason: str) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
                loop.call_soon_threadsafe(on_loop, reason)

        return report

    async def _fail(self, name: str, serial: int, reason: str) -> None:
        """A backend of load `serial` died: its model turns UNAVAILABLE with the reason (the
        index and readiness say it), what it holds fails at once, and the load is freed. A
        reload or an unload that came first has nothing left to fail."""
        async with self._locked(name):
            entry = self._entries.get(name)
            if entry is None or all(v.serial != serial for v in entry.versions.values()):
                return
            log.error("model %s can no longer serve: %s", name, reason)
            self._set(name, ModelState.UNAVAILABLE, reason)
            error = Unavailable(f"model {name!r} can no longer serve: {reason}")
            for served in entry.versions.values():
                served.runner.fail(error)
            # Its adapters go with its engine: loading the base again is then allowed.
            for adapter in self.adapters_on(name):
                with contextlib.suppress(DlscaleError):
                    await self.unload(adapter, 0.0, f"its base model {name!r} died: {reason}")
            await self._retire(entry)

    # -- internals -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _locked(self, name: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(name) or (asyncio.Lock(), 0)
        self._locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[name]
            if users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)

    def _set(self, name: str, state: ModelState, reason: str = "") -> None:
        entry = self._entries.setdefault(name, ModelEntry(name, state))
        versions = entry.versions if state in (ModelState.READY, ModelState.UNLOADING) else {}
        self._entries[name] = ModelEntry(name, state, reason, versions)
        # The passing states at debug: with loads on demand they came at every load and
        # eviction, on the event loop (docs/memory.md, "What a load costs and where it runs").
        passing = state in (ModelState.LOADING, ModelState.UNLOADING)
        level = logging.DEBUG if passing else logging.INFO
        log.log(level, "model %s: %s%s", name, state.value, f" ({reason})" if reason else "")

    def _check_no_adapters(self, base: str) -> None:
        """A base model keeps its engine while adapters are placed on it: no unload, no reload."""
        adapters = self.adapters_on(base)
        if adapters:
            raise ConfigError(
                f"model {base!r} is the base of the loaded adapters {adapters}: unload them first"
            )

    async def _retire(
        self,
        entry: ModelEntry,
        grace_s: float | None = None,
        released: asyncio.Future[None] | None = None,
    ) -> None:
        for served in entry.versions.values():
            self.memory.release(served.serial)
        if released is not None and not released.done():
            released.set_result(None)
        for served in entry.versions.values():
            await close_version(served, grace_s)


def _versions(
    repo: ModelRepository, name: str, source: ModelSource | None
) -> tuple[list[ModelVersion], dict[int, Files]]:
    """The versions of `name` to load, under `source`'s config or the repository's, and the
    files of each that has an instance (what the memory ledger reads before it loads one; an
    adapter's are read once its base's devices are known)."""
    versions = repo.versions(name, source or repo.source(name))
    own = [mv for mv in versions if not (mv.config.is_pipeline or mv.config.is_adapter)]
    return versions, {mv.version: files_of(mv) for mv in own}


def _unforeseen(name: str, exc: Exception) -> DlscaleError:
    """A load that failed in a way no backend foresaw (a bug, a library's own error): that model
    alone fails (UNAVAILABLE with the reason, a 500 to an API load), not the server, and it
    does not stay LOADING. The traceback goes to the log."""
    log.error("model %s: unforeseen error while loading", name, exc_info=exc)
    return DlscaleError(f"model {name!r} failed to load: {type(exc).__name__}: {exc}")
