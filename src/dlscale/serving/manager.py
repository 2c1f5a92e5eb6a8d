"""Model lifecycle: load (instances, signature check, warm-up), serve, drain and unload."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.backends import BackendOptions, create_backend
from dlscale.errors import ConfigError, DlscaleError, NotFound, Unavailable
from dlscale.models.config import ModelConfig
from dlscale.models.repository import ModelRepository, ModelVersion
from dlscale.models.samples import zero_inputs
from dlscale.models.signature import reconcile
from dlscale.models.sources import ModelSource
from dlscale.serving.batcher import Batcher
from dlscale.serving.classification import read_labels
from dlscale.serving.instance import Instance
from dlscale.serving.observe.stats import ModelStats
from dlscale.serving.policy import BatchPolicy
from dlscale.serving.qos.gate import DeviceGates, TenantQos
from dlscale.serving.versions import resolve_version
from dlscale.types import InferenceRequest, InferenceResponse, TensorSpec

log = logging.getLogger("dlscale.models")


class ModelState(enum.StrEnum):
    """Where a model is in its life (the repository index reports these)."""

    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass
class ServedVersion:
    """One loaded version: its signature, instances, batcher and statistics."""

    version: ModelVersion
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    instances: list[Instance]
    batcher: Batcher
    stats: ModelStats
    #: Class labels by output, from the config's label files (the classification extension).
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)
    qos: TenantQos | None = None  # its seats at the device gates (None: QoS turned off)

    @property
    def config(self) -> ModelConfig:
        return self.version.config


@dataclass
class ModelEntry:
    """A model's state and, while ready, its served versions."""

    name: str
    state: ModelState
    reason: str = ""
    versions: dict[int, ServedVersion] = field(default_factory=dict)


#: The inference path models call other models through (the DataPlane's `infer`).
InferCall = Callable[[InferenceRequest], Coroutine[Any, Any, InferenceResponse]]


class ServerCaller:
    """A ModelCaller for backends whose models call models: from an instance thread, the call
    runs on the server's event loop (validation, batching, statistics as for any request) and
    the thread waits for its answer."""

    def __init__(self, manager: ModelManager, loop: asyncio.AbstractEventLoop) -> None:
        self._manager = manager
        self._loop = loop

    def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Infer on the server's loop; raises the request's DlscaleError."""
        call = self._manager.calls
        if call is None:
            raise Unavailable("this server has no inference path for models to call")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:  # waiting here would stop the loop that must answer
            raise Unavailable("a model called another from the event loop; call from a thread")
        return asyncio.run_coroutine_threadsafe(call(request), self._loop).result()


def policy_of(config: ModelConfig) -> BatchPolicy:
    """The batcher's policy from a model's config."""
    return BatchPolicy.of(config)


class ModelManager:
    """Holds every model of a repository; loading or unloading one never disturbs another.

    Models whose instances share a device take turns on it through one gate per device
    (`gates`, serving/qos/gate.py); `DeviceGates(enabled=False)` ignores every [qos] table.
    """

    def __init__(self, repository: ModelRepository, gates: DeviceGates | None = None) -> None:
        self.repository = repository
        self.gates = gates or DeviceGates()
        self._entries: dict[str, ModelEntry] = {}
        # A lock per name while someone holds or waits for it, and how many do: no name
        # leaves a lock behind (an unload of a name that never existed made one, kept).
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        #: The models this server should be serving: asked for at start or loaded since, less
        #: those unloaded. Strict readiness wants each of them READY.
        self.required: set[str] = set()
        #: The inference path models call other models through; the DataPlane sets it.
        self.calls: InferCall | None = None

    @classmethod
    def open(cls, root: Path, gates: DeviceGates | None = None) -> ModelManager:
        """A manager over the repository folder at `root` (nothing loaded yet)."""
        return cls(ModelRepository(root), gates)

    # -- lookups ---------------------------------------------------------------------------------

    def get(self, name: str, version: str = "") -> ServedVersion:
        """The served version a request goes to (the newest when `version` is empty)."""
        entry = self._entries.get(name)
        if entry is None:
            raise NotFound(f"unknown model {name!r}")
        if entry.state is not ModelState.READY:
            detail = f": {entry.reason}" if entry.reason else ""
            raise Unavailable(f"model {name!r} is not ready ({entry.state.value}{detail})")
        return entry.versions[resolve_version(name, version, entry.versions)]

    def entries(self) -> list[ModelEntry]:
        """Every model this manager knows of, in name order."""
        return [self._entries[n] for n in sorted(self._entries)]

    def ready_names(self) -> list[str]:
        return [e.name for e in self.entries() if e.state is ModelState.READY]

    def required_ready(self) -> bool:
        """Whether every model the server should be serving is READY."""
        entries = self._entries
        return all(
            (entry := entries.get(n)) is not None and entry.state is ModelState.READY
            for n in self.required
        )

    def expect(self, names: Iterable[str]) -> None:
        """Models the server starts with: required, and LOADING until their turn comes."""
        for name in names:
            self.required.add(name)
            if name not in self._entries:
                self._set(name, ModelState.LOADING, "waiting for its turn to load")

    # -- lifecycle -------------------------------------------------------------------------------

    async def load_all(self, names: Iterable[str] | None = None) -> dict[str, DlscaleError]:
        """Load these models (default: the whole repository) one after another; those that
        failed come back with their error, each recorded UNAVAILABLE with its reason."""
        failed = {}
        for name in self.repository.names() if names is None else names:
            try:
                await self.load(name)
            except DlscaleError as exc:
                failed[name] = exc  # the others still load
        return failed

    async def load(
        self,
        name: str,
        source: ModelSource | None = None,
        repository: ModelRepository | None = None,
    ) -> None:
        """Load (or reload) a model; the old versions keep serving until the new ones are ready.

        `source` replaces the config the repository has, and `repository` the folder its files
        are read from (a load request's overrides)."""
        async with self._locked(name):
            previous = self._entries.get(name)
            if previous is None or previous.state is not ModelState.READY:
                self._set(name, ModelState.LOADING)
            try:
                repo = repository or self.repository
                versions = repo.versions(name, source or repo.source(name))
                served = {}
                for mv in versions:
                    served[mv.version] = await self._load_version(mv)
            except DlscaleError as exc:
                if previous is None or previous.state is not ModelState.READY:
                    self._set(name, ModelState.UNAVAILABLE, str(exc))
                    log.error("model %s failed to load: %s", name, exc)
                else:
                    log.error("model %s: reload failed, keeping the loaded versions: %s", name, exc)
                raise
            entry = ModelEntry(name, ModelState.READY, versions=served)
            self._entries[name] = entry
            self.required.add(name)
            log.info("model %s: READY (versions %s)", name, sorted(served))
            if previous is not None and previous.versions:
                await self._retire(previous)

    async def unload(self, name: str) -> None:
        """Stop taking requests, finish those in flight, then free the model."""
        if name not in self._entries:
            raise NotFound(f"unknown model {name!r}")
        async with self._locked(name):
            entry = self._entries.get(name)
            if entry is None:
                raise NotFound(f"unknown model {name!r}")
            self.required.discard(name)
            self._set(name, ModelState.UNLOADING)
            await self._retire(entry)
            self._set(name, ModelState.UNAVAILABLE, "unloaded")

    async def close(self) -> None:
        """Unload everything (server shutdown): in-flight requests finish first."""
        await asyncio.gather(
            *(self.unload(e.name) for e in self.entries() if e.versions), return_exceptions=True
        )

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
        log.info("model %s: %s%s", name, state.value, f" ({reason})" if reason else "")

    async def _load_version(self, mv: ModelVersion) -> ServedVersion:
        config = mv.config
        opts = config.backend_options
        extra = {k: v for k, v in (opts.model_extra or {}).items()}
        labels = {
            t.name: read_labels(mv.folder / t.label_file)
            for t in config.outputs or ()
            if t.label_file
        }
        instances, placements = [], []
        qos: TenantQos | None = None
        try:
            for group in config.instances:
                options = BackendOptions(
                    device=group.device,
                    intra_op_threads=opts.intra_op_threads,
                    inter_op_threads=opts.inter_op_threads,
                    max_batch_size=config.max_batch_size,
                    graph_optimization_level=opts.graph_optimization_level,
                    extra=extra,
                    inputs=tuple(config.tensor_specs("inputs") or ()),
                    outputs=tuple(config.tensor_specs("outputs") or ()),
                    # Read by backends whose models call models (Capabilities.calls_models).
                    caller=ServerCaller(self, asyncio.get_running_loop()),
                )
                for i in range(group.count):
                    backend = create_backend(config.backend, mv.model_file, options)
                    label = f"{mv.name}-v{mv.version}-{group.device}-{i}"
                    instance = Instance(backend, label)
                    instances.append(instance)
                    placements.append((label, group.device))
                    await instance.load()
            first = instances[0].backend
            inputs, outputs = reconcile(config, first.inputs, first.outputs, mv.source)
            qos = self.gates.enrol(f"{mv.name}/{mv.version}", config, placements)
            # A model that calls models is not warmed up: the models it calls may load after it
            # (Triton loads such models without a warm-up, too).
            if not first.capabilities.calls_models:
                await asyncio.gather(*(self._warm(i, inputs, config, qos) for i in instances))
        except BaseException:
            if qos is not None:
                qos.leave()
            await asyncio.gather(*(i.close() for i in instances), return_exceptions=True)
            raise
        stats = ModelStats(mv.name, str(mv.version))
        batcher = Batcher(policy_of(config), instances, stats, self.gates.clock, qos)
        batcher.start()
        return ServedVersion(mv, inputs, outputs, instances, batcher, stats, labels, qos)

    async def _warm(
        self,
        instance: Instance,
        inputs: list[TensorSpec],
        config: ModelConfig,
        qos: TenantQos | None,
    ) -> None:
        sizes = {1, config.max_batch_size} if config.batched else {0}
        for size in sorted(sizes):
            feed = zero_inputs(inputs, size)
            try:
                start = self.gates.clock()
                await instance.infer(feed)
            except Exception as exc:
                raise ConfigError(
                    f"model {config.name!r} failed its warm-up at batch size {size}: {exc}"
                ) from exc
            if qos is not None:  # the device schedulers' first service times (they relearn)
                qos.seats[instance.name].tenant.service.observe(
                    max(size, 1), self.gates.clock() - start
                )

    async def _retire(self, entry: ModelEntry) -> None:
        for served in entry.versions.values():
            await served.batcher.close()
            if served.qos is not None:
                served.qos.leave()
            await asyncio.gather(*(i.close() for i in served.instances), return_exceptions=True)
