"""The server: repository, models and DataPlane, with REST, gRPC and metrics frontends around it."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

from dlscale.errors import ConfigError, DlscaleError
from dlscale.frontends.access import GRPC_HEADER_PREFIX, Access, Restriction
from dlscale.frontends.limits import Limits
from dlscale.frontends.loop import freeze_survivors, new_event_loop
from dlscale.frontends.tls import TlsFiles
from dlscale.serving.control.poller import RepositoryPoller
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager
from dlscale.serving.observe.exposition import MetricsServer
from dlscale.serving.observe.logs import LogControl
from dlscale.serving.observe.metrics import build_registry
from dlscale.serving.observe.trace import Tracer, TraceSettings
from dlscale.serving.qos.gate import DeviceGates
from dlscale.serving.regions import cuda as cuda_memory
from dlscale.serving.regions.registry import SharedMemoryRegistry

log = logging.getLogger("dlscale.server")
T = TypeVar("T")
#: In `load_models`: every model of the repository (Triton's `--load-model=*`).
ALL_MODELS = "*"


@dataclass(frozen=True)
class ServerSettings:
    """What `dlscale serve` was asked for; a port of None turns that frontend off, 0 picks one.

    Every bound on clients is in `limits` (frontends/limits.py documents each); docs/limits.md
    tells what each protects and how to change it.
    """

    repository: Path
    #: Loopback by default: expose the server on purpose (--host 0.0.0.0), with TLS or a proxy.
    host: str = "127.0.0.1"
    http_port: int | None = 8000
    grpc_port: int | None = 8001
    metrics_port: int | None = 8002
    #: none (load all, fixed), explicit (load and unload over the API) or poll (follow the disk).
    model_control: str = "none"
    #: The models explicit control loads at start; ALL_MODELS ("*") loads every one.
    load_models: tuple[str, ...] = ()
    poll_interval_s: float = 5.0
    limits: Limits = field(default_factory=Limits)
    #: Seconds requests in flight get to finish at shutdown; those still running then are
    #: answered 503 / UNAVAILABLE.
    grace_s: float = 10.0
    #: Triton's --strict-readiness: ready only while every model the server should serve is READY.
    strict_readiness: bool = True
    #: Triton's --exit-on-error: stop when a model fails to load at start (off: serve the others,
    #: not ready under strict readiness).
    exit_on_error: bool = False
    #: TLS for REST and gRPC; None serves plain text (loopback, or behind a proxy that does TLS).
    tls: TlsFiles | None = None
    #: Triton's --http-restricted-api and --grpc-restricted-protocol groups.
    http_restricted: tuple[Restriction, ...] = ()
    grpc_restricted: tuple[Restriction, ...] = ()
    telemetry_interval_s: float = 1.0
    #: Where request traces go (Triton's --trace-file); None: tracing cannot be turned on.
    trace_file: Path | None = None
    #: Sampled requests are traced from the start: OFF or TIMESTAMPS, one in `trace_rate`.
    trace_level: str = "OFF"
    trace_rate: int = 1000
    #: Where the logs go (stderr when None) and their timestamps: default or ISO8601.
    log_file: Path | None = None
    log_format: str = "default"
    #: Let clients register shared-memory regions (Triton's --allow-client-shm; off by default).
    allow_client_shm: bool = False
    #: The most regions registered at once.
    max_shm_regions: int = 256
    #: False ignores every model's [qos] table: no device scheduler, no limits (docs/qos.md).
    qos: bool = True
    #: REST worker processes sharing the port (0: REST on this process); docs/serving-rest.md.
    http_workers: int = 0


#: Seconds after the grace for the 503 / UNAVAILABLE answers of cut requests to leave.
CUT_MARGIN_S = 1.0


class Frontend(Protocol):
    """What the server needs of a protocol frontend."""

    @property
    def port(self) -> int: ...

    async def start(self) -> None: ...

    async def stop(self, grace_s: float = 10.0) -> None: ...


class Server:
    """Owns the lifecycle: open the ports, load the models, serve, stop gracefully on a signal."""

    def __init__(self, settings: ServerSettings) -> None:
        if settings.model_control not in ("none", "explicit", "poll"):
            raise ValueError(f"model_control {settings.model_control!r}")
        self.settings = settings
        self.manager = ModelManager.open(settings.repository, DeviceGates(enabled=settings.qos))
        self.shared_memory = SharedMemoryRegistry(
            settings.allow_client_shm,
            settings.max_shm_regions,
            # With a CUDA device, regions are page-locked: copies to it are DMAs from them.
            page_lock=settings.allow_client_shm and cuda_memory.device_count() > 0,
        )
        self.dataplane = DataPlane(
            self.manager,
            settings.model_control,
            self.shared_memory,
            Tracer(settings.trace_file, TraceSettings(settings.trace_level, settings.trace_rate)),
            LogControl(settings.log_file, settings.log_format),
            strict_readiness=settings.strict_readiness,
        )
        self.registry = build_registry(self.manager, settings.telemetry_interval_s)
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
        s = self.settings
        for name, frontend in self._frontends().items():
            await frontend.start()
            self.frontends[name] = frontend
            log.info("%s listening on %s:%d", name, s.host, frontend.port)
        if s.metrics_port is not None:
            self._start_metrics(s.host, s.metrics_port)
        self._loading = asyncio.get_running_loop().create_task(self._load())

    def _frontends(self) -> dict[str, Frontend]:
        s = self.settings
        frontends: dict[str, Frontend] = {}
        if s.http_port is not None and s.http_workers > 0:
            frontends["http"] = _http_workers(self.dataplane, s)
        elif s.http_port is not None:
            from dlscale.frontends.rest import HttpFrontend
            from dlscale.frontends.rest.body import BodyBuffers

            frontends["http"] = HttpFrontend(
                self.dataplane,
                s.host,
                s.http_port,
                limits=s.limits,
                tls=s.tls.server_context() if s.tls else None,
                access=Access(s.http_restricted),
                # Page-locked body buffers let a CUDA backend copy inputs by DMA from the body.
                bodies=BodyBuffers(page_lock=cuda_memory.device_count() > 0),
            )
        if s.grpc_port is not None:
            from dlscale.frontends.grpc import GrpcFrontend

            frontends["grpc"] = GrpcFrontend(
                self.dataplane,
                s.host,
                s.grpc_port,
                limits=s.limits,
                tls=s.tls,
                access=Access(s.grpc_restricted, GRPC_HEADER_PREFIX),
            )
        return frontends

    async def _load(self) -> None:
        s = self.settings
        names = None
        if s.model_control == "explicit" and ALL_MODELS not in s.load_models:
            names = list(s.load_models)
        self.failed = await self.dataplane.load_initial(names)
        if self.failed:
            log.error("models that failed to load: %s", ", ".join(self.failed))
            if s.exit_on_error:
                log.error("stopping: a model failed to load and exit_on_error is set")
                self._stopped.set()
                return
        if s.model_control == "poll":
            self._poller = RepositoryPoller(self.manager, s.poll_interval_s)
            self._poller.remember_loaded()
            self._poller.start()
        log.info("server %s", "ready" if self.dataplane.ready() else "not ready")

    async def wait_loaded(self) -> None:
        """Wait for the models asked for at start to be tried; with exit_on_error, raise the
        first failure's error."""
        if self._loading is not None:
            await asyncio.shield(self._loading)
        if self.failed and self.settings.exit_on_error:
            raise next(iter(self.failed.values()))

    def _start_metrics(self, host: str, port: int) -> None:
        try:
            server = MetricsServer(self.registry, host, port)
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
        return 1 if self.failed and self.settings.exit_on_error else 0

    def request_stop(self) -> None:
        """Make serve_forever stop, as a signal would."""
        self._stopped.set()

    async def stop(self) -> None:
        """Refuse new requests, give those in flight the grace, answer the rest 503 /
        UNAVAILABLE, then unload the models and close the ports."""
        grace = self.settings.grace_s
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
        await self.manager.close()
        self.dataplane.tracer.flush()
        self.dataplane.uploads.close()
        self.shared_memory.close()
        if self._metrics_server is not None:
            self._metrics_server.stop()
        log.info("stopped")


def _http_workers(dataplane: DataPlane, s: ServerSettings) -> Frontend:
    from dlscale.frontends.workers.pool import HttpWorkers
    from dlscale.frontends.workers.process import WorkerConfig

    config = WorkerConfig(
        s.host, s.http_port or 0, s.limits, s.tls, s.http_restricted, s.allow_client_shm,
        s.max_shm_regions, "", s.grace_s, _log_levels(),
    )  # fmt: skip
    return HttpWorkers(dataplane, config, s.http_workers)


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
            self.run(self.server.stop(), self.server.settings.grace_s + CUT_MARGIN_S + 30.0)
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
    settings = settings_from(args)
    server = Server(settings)
    server.dataplane.logs.install(args.log_level, access_log=args.access_log)
    try:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(server.serve_forever())
    finally:
        server.dataplane.logs.uninstall()


def settings_from(args: argparse.Namespace) -> ServerSettings:
    """ServerSettings from `dlscale serve`'s flags; a bad flag value is a ConfigError."""

    def port(value: int) -> int | None:
        return None if value < 0 else value

    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(Limits)
        if getattr(args, f.name, None) is not None
    }
    if getattr(args, "http_workers", 0) < 0:
        raise ConfigError(f"--http-workers {args.http_workers}: 0 or more")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if args.tls_client_ca is not None and args.tls_cert is None:
        raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key")
    try:
        limits = Limits(
            max_body_bytes=int(args.max_body_mb * 2**20),
            max_grpc_message_bytes=int(args.max_grpc_mb * 2**20),
            **given,
        )
        http_restricted = tuple(Restriction.parse(t) for t in args.http_restricted_api)
        grpc_restricted = tuple(Restriction.parse(t) for t in args.grpc_restricted_protocol)
        Access(http_restricted), Access(grpc_restricted)  # one group in one restriction only
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    tls = (
        None if args.tls_cert is None else TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca)
    )
    return ServerSettings(
        repository=args.repo,
        host=args.host,
        http_port=port(args.http_port),
        grpc_port=port(args.grpc_port),
        metrics_port=port(args.metrics_port),
        model_control=args.model_control,
        load_models=tuple(args.load_model),
        poll_interval_s=args.poll_interval,
        limits=limits,
        grace_s=args.grace_s,
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        tls=tls,
        http_restricted=http_restricted,
        grpc_restricted=grpc_restricted,
        trace_file=args.trace_file,
        trace_level=args.trace_level,
        trace_rate=args.trace_rate,
        log_file=args.log_file,
        log_format=args.log_format,
        allow_client_shm=args.allow_client_shm,
        max_shm_regions=args.max_shm_regions,
        qos=args.qos,
        http_workers=getattr(args, "http_workers", 0),
    )
