"""The server: repository, models and DataPlane, with REST, gRPC and metrics frontends around it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

from dlscale.errors import DlscaleError
from dlscale.frontends.api_key import metrics_guard
from dlscale.frontends.limits import descriptor_budget
from dlscale.frontends.loop import freeze_survivors, new_event_loop
from dlscale.server_settings import Observation
from dlscale.server_settings import ServerSettings as ServerSettings
from dlscale.server_settings.flags import settings_from as settings_from
from dlscale.serving.cache import ResponseCache
from dlscale.serving.control.poller import RepositoryPoller
from dlscale.serving.host import HostPlane
from dlscale.serving.manager import ModelManager
from dlscale.serving.metrics.collectors import build_registry
from dlscale.serving.metrics.exposition import MetricsServer
from dlscale.serving.metrics.memory import MemoryCollector
from dlscale.serving.observe.logs import LogControl
from dlscale.serving.observe.otel import OtlpSink
from dlscale.serving.observe.trace import Tracer, TraceSettings
from dlscale.serving.qos.gate import DeviceGates
from dlscale.serving.regions import cuda as cuda_memory
from dlscale.serving.regions.registry import SharedMemoryRegistry

log = logging.getLogger("dlscale.server")
T = TypeVar("T")
#: In `load_models`: every model of the repository (Triton's `--load-model=*`).
ALL_MODELS = "*"


#: Seconds after the grace for the 503 / UNAVAILABLE answers of cut requests to leave.
CUT_MARGIN_S = 1.0


class Frontend(Protocol):
    """What the server needs of a protocol frontend."""

    @property
    def port(self) -> int: ...

    async def start(self) -> None: ...

    async def stop(self, grace_s: float) -> None: ...


class Server:
    """Owns the lifecycle: open the ports, load the models, serve, stop gracefully on a signal."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        models, shm, seen = settings.models, settings.shared_memory, settings.observation
        self.manager = ModelManager.open(settings.repository, DeviceGates(enabled=models.qos))
        self.manager.grace_s = settings.lifecycle.grace_s  # an unload's wait for its requests
        self.manager.memory.budget = dict(models.memory_budget)
        self.manager.memory.parallel = models.parallel_loads
        self.shared_memory = SharedMemoryRegistry(
            shm.allow_client_shm,
            shm.max_shm_regions,
            owners=frozenset(shm.shm_owner_uids),
            descriptors=descriptor_budget(),
        )
        self.dataplane = HostPlane(
            self.manager,
            models.model_control,
            self.shared_memory,
            _tracer(seen),
            LogControl(seen.log_file, seen.log_format),
            strict_readiness=settings.lifecycle.strict_readiness,
            cache=ResponseCache(models.cache_bytes) if models.cache_bytes else None,
            cold_loads=models.max_cold_loads,
            parallel_loads=models.parallel_loads,
        )
        # Models that call models (Triton's BLS) go through the host's data path.
        self.manager.calls.connect(self.dataplane.call_paths())
        self.registry = build_registry(self.manager, seen.telemetry_interval_s)
        self.registry.register(MemoryCollector(self.manager, lambda: self.dataplane.demand))
        self.frontends: dict[str, Frontend] = {}
        self.metrics_port: int | None = None
        #: The models that failed to load at start, with their errors.
        self.failed: dict[str, DlscaleError] = {}
        self._metrics_server: MetricsServer | None = None
        self._poller: RepositoryPoller | None = None
        self._loading: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        """Open the ports, then load the models in the background (see `wait_loaded`).

        Live at once, so that a liveness probe does not kill a server that is only loading;
        ready once the models are (DataPlane.ready).
        """
        s = self.settings.network
        for name, frontend in self._frontends().items():
            await frontend.start()
            self.frontends[name] = frontend
            log.info("%s listening on %s:%d", name, s.host, frontend.port)
        if s.metrics_port is not None:
            self._start_metrics(s.host, s.metrics_port)
        self._loading = asyncio.get_running_loop().create_task(self._load())

    def _frontends(self) -> dict[str, Frontend]:
        s, limits, security = self.settings.network, self.settings.limits, self.settings.security
        tls = security.tls
        frontends: dict[str, Frontend] = {}
        if s.http_port is not None and s.http_workers > 0:
            frontends["http"] = _http_workers(self.dataplane, self.settings)
        elif s.http_port is not None:
            from dlscale.frontends.rest import HttpFrontend
            from dlscale.frontends.rest.body import BodyBuffers

            frontends["http"] = HttpFrontend(
                self.dataplane,
                s.host,
                s.http_port,
                limits=limits,
                tls=tls.server_context() if tls else None,
                access=security.http_access(),
                # Page-locked body buffers let a CUDA backend copy inputs by DMA from the body.
                bodies=BodyBuffers(page_lock=cuda_memory.device_count() > 0),
            )
        if s.grpc_port is not None:
            from dlscale.frontends.grpc import GrpcFrontend

            frontends["grpc"] = GrpcFrontend(
                self.dataplane,
                s.host,
                s.grpc_port,
                limits=limits,
                tls=tls,
                access=security.grpc_access(),
                tfserving=s.grpc_tfserving,
            )
        return frontends

    async def _load(self) -> None:
        s = self.settings.models
        names = None
        if s.model_control.loads_named and ALL_MODELS not in s.load_models:
            names = list(s.load_models)
        self.failed = await self.dataplane.load_initial(names)
        if self.failed:
            log.error("models that failed to load: %s", ", ".join(self.failed))
            if self.settings.lifecycle.exit_on_error:
                log.error("stopping: a model failed to load and exit_on_error is set")
                self._stopped.set()
                return
        ready = self.manager.ready_names()
        uncached = [n for n in ready if self.manager.get(n).config.response_cache]
        if uncached and self.dataplane.cache is None:
            log.warning(
                "models %s enable response_cache, but the server has no cache: they are answered "
                "uncached (start with --cache-size BYTES)",
                ", ".join(uncached),
            )
        if not self.manager.repository.names() and not s.model_control.api_loads:
            log.warning(
                "%s holds no models (no model folders, and no config.json of a Hugging Face "
                "folder): nothing is served; give a repository (REPO/MODEL/config.toml and "
                "REPO/MODEL/1/...) or a Hugging Face folder (docs/generative.md)",
                self.settings.repository,
            )
        if s.model_control.polls:
            self._poller = RepositoryPoller(self.manager, s.poll_interval_s)
            self._poller.remember_loaded()
            self._poller.start()
        log.info("server %s", "not ready" if self.dataplane.not_ready_reason() else "ready")

    async def wait_loaded(self) -> None:
        """Wait for the models asked for at start to be tried; with exit_on_error, raise the
        first failure's error."""
        if self._loading is not None:
            await asyncio.shield(self._loading)
        if self.failed and self.settings.lifecycle.exit_on_error:
            raise next(iter(self.failed.values()))

    def _start_metrics(self, host: str, port: int) -> None:
        try:
            server = MetricsServer(
                self.registry, host, port, metrics_guard(self.settings.security.key)
            )
        except OSError as exc:
            raise DlscaleError(f"metrics cannot listen on {host}:{port}: {exc.strerror}") from exc
        server.start()
        self._metrics_server = server
        self.metrics_port = server.port
        log.info("metrics listening on %s:%d", host, self.metrics_port)

    @property
    def ports(self) -> dict[str, int]:
        """The ports bound, by frontend (http, grpc, metrics): the OS's choice where 0 was asked."""
        ports = {name: frontend.port for name, frontend in self.frontends.items()}
        if self.metrics_port is not None:
            ports["metrics"] = self.metrics_port
        return ports

    async def serve_forever(self, on_ready: Callable[[Server], object] | None = None) -> int:
        """Start, call `on_ready` once the models are loaded, run until SIGINT or SIGTERM, stop
        gracefully; 1 when exit_on_error stopped it, else 0."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stopped.set)
        await self.start()
        try:
            await self.wait_loaded()
        except DlscaleError:
            pass  # logged; the stop below ends the server
        else:
            freeze_survivors()  # what starting made lives as long as the process: out of gc's way
            if on_ready is not None:
                on_ready(self)
        await self._stopped.wait()
        log.info("stopping: finishing requests in flight")
        await self.stop()
        return 1 if self.failed and self.settings.lifecycle.exit_on_error else 0

    async def stop(self) -> None:
        """Refuse new requests, give those in flight the grace, answer the rest 503 /
        UNAVAILABLE, then unload the models and close the ports."""
        grace = self.settings.lifecycle.grace_s
        self.dataplane.stop_accepting()
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
            await asyncio.gather(self._loading, return_exceptions=True)
        if self._poller is not None:
            await self._poller.stop()
        cut = asyncio.get_running_loop().call_later(grace, self.dataplane.cut, grace)
        await asyncio.gather(
            *(f.stop(grace + CUT_MARGIN_S) for f in self.frontends.values()),
            return_exceptions=True,
        )
        cut.cancel()
        # The requests had their grace: what still runs now is stopped (a hung model's worker).
        await self.manager.close(CUT_MARGIN_S)
        self.dataplane.tracer.flush()
        self.dataplane.uploads.close()
        self.shared_memory.close()
        if self._metrics_server is not None:
            self._metrics_server.stop()
        log.info("stopped")


def _tracer(seen: Observation) -> Tracer:
    """The trace file's tracer (Triton's), or with a collector named, OTLP's; a collector alone
    traces (at the rate) without a --trace-level, as vLLM's flag does."""
    otlp = OtlpSink(seen.otlp_traces_endpoint) if seen.otlp_traces_endpoint else None
    level = "TIMESTAMPS" if otlp is not None and seen.trace_level == "OFF" else seen.trace_level
    settings = TraceSettings(level, seen.trace_rate, seen.trace_count)
    return Tracer(seen.trace_file, settings, otlp)


def _http_workers(dataplane: HostPlane, s: ServerSettings) -> Frontend:
    from dlscale.frontends.workers.pool import HttpWorkers
    from dlscale.frontends.workers.process import WorkerConfig

    config = WorkerConfig(
        host=s.network.host,
        port=s.network.http_port or 0,
        limits=s.limits,
        tls=s.security.tls,
        access=s.security.http_access(),
        allow_shm=s.shared_memory.allow_client_shm,
        max_shm_regions=s.shared_memory.max_shm_regions,
        grace_s=s.lifecycle.grace_s,
        log_levels=_log_levels(),
    )
    return HttpWorkers(dataplane, config, s.network.http_workers)


def _log_levels() -> tuple[tuple[str, int], ...]:
    """The levels the REST workers take from this process's loggers (root is "")."""
    names = ("", "dlscale", "dlscale.access", "dlscale.requests")
    return tuple((n, logging.getLogger(n or None).getEffectiveLevel()) for n in names)


class ServerThread:
    """A Server on an event loop (uvloop where installed) in a thread, for callers that block.

    The demo serves from one; tests start one on port 0 and call it over the network as any
    client would, or run coroutines on its loop with `run`.
    """

    def __init__(self, settings: ServerSettings) -> None:
        self.server = Server(settings)
        self.loop = new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="dlscale-server", daemon=True
        )

    def start(self, timeout: float = 300.0, wait_loaded: bool = True) -> None:
        """Open the ports and (unless told not to wait) load the models; on failure everything
        started is stopped."""
        self._thread.start()
        try:
            self.run(self.server.start(), timeout)
            if wait_loaded:
                self.run(self.server.wait_loaded(), timeout)
        except BaseException:
            self.stop()
            raise

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        """Stop the server gracefully, then the loop and its thread."""
        try:
            self.run(
                self.server.stop(), self.server.settings.lifecycle.grace_s + CUT_MARGIN_S + 30.0
            )
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def serve(args: argparse.Namespace) -> int:
    """`dlscale serve REPO`: the server with the parsed flags, until SIGINT or SIGTERM."""
    return serve_settings(settings_from(args))


def serve_settings(
    settings: ServerSettings, on_ready: Callable[[Server], object] | None = None
) -> int:
    """Serve with these settings until SIGINT or SIGTERM; `on_ready` once the models are loaded."""
    server = Server(settings)
    seen = settings.observation
    server.dataplane.logs.install(seen.log_level, access_log=seen.access_log)
    try:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(server.serve_forever(on_ready))
    finally:
        server.dataplane.logs.uninstall()
