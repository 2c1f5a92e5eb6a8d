"""The server: repository, models and DataPlane, with REST, gRPC and metrics frontends around it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

from prometheus_client import start_http_server

from dlscale.serving.dataplane import DataPlane
from dlscale.serving.gate import DeviceGates
from dlscale.serving.manager import ModelManager
from dlscale.serving.metrics import build_registry
from dlscale.serving.poller import RepositoryPoller

log = logging.getLogger("dlscale.server")
T = TypeVar("T")
#: In `load_models`: every model of the repository (Triton's `--load-model=*`).
ALL_MODELS = "*"


@dataclass(frozen=True)
class ServerSettings:
    """What `dlscale serve` was asked for; a port of None turns that frontend off, 0 picks one."""

    repository: Path
    host: str = "127.0.0.1"
    http_port: int | None = 8000
    grpc_port: int | None = 8001
    metrics_port: int | None = 8002
    #: none (load all, fixed), explicit (load and unload over the API) or poll (follow the disk).
    model_control: str = "none"
    #: The models explicit control loads at start; ALL_MODELS ("*") loads every one.
    load_models: tuple[str, ...] = ()
    poll_interval_s: float = 5.0
    max_body_bytes: int = 64 * 2**20
    max_grpc_message_bytes: int = 64 * 2**20
    #: Seconds an idle HTTP keep-alive connection stays open.
    keep_alive_s: float = 75.0
    grace_s: float = 10.0
    telemetry_interval_s: float = 1.0
    #: False ignores every model's [qos] table: no device scheduler, no limits (docs/qos.md).
    qos: bool = True


class Frontend(Protocol):
    """What the server needs of a protocol frontend."""

    @property
    def port(self) -> int: ...

    async def start(self) -> None: ...

    async def stop(self, grace_s: float = 10.0) -> None: ...


class Server:
    """Owns the lifecycle: start everything, serve, stop gracefully on SIGINT or SIGTERM."""

    def __init__(self, settings: ServerSettings) -> None:
        if settings.model_control not in ("none", "explicit", "poll"):
            raise ValueError(f"model_control {settings.model_control!r}")
        self.settings = settings
        self.manager = ModelManager.open(settings.repository, DeviceGates(enabled=settings.qos))
        self.dataplane = DataPlane(self.manager, settings.model_control)
        self.registry = build_registry(self.manager, settings.telemetry_interval_s)
        self.frontends: dict[str, Frontend] = {}
        self.metrics_port: int | None = None
        self._metrics_server: Any = None
        self._poller: RepositoryPoller | None = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        """Load models as the model-control mode says, then open the ports."""
        s = self.settings
        if s.model_control == "explicit" and ALL_MODELS not in s.load_models:
            for name in s.load_models:
                await self.manager.load(name)
        else:
            await self.manager.load_all()
        if s.model_control == "poll":
            self._poller = RepositoryPoller(self.manager, s.poll_interval_s)
            self._poller.remember_loaded()
            self._poller.start()
        if s.http_port is not None:
            from dlscale.frontends.rest import HttpFrontend

            self.frontends["http"] = HttpFrontend(
                self.dataplane,
                s.host,
                s.http_port,
                max_body_bytes=s.max_body_bytes,
                keep_alive_s=s.keep_alive_s,
            )
        if s.grpc_port is not None:
            from dlscale.frontends.grpc import GrpcFrontend

            self.frontends["grpc"] = GrpcFrontend(
                self.dataplane, s.host, s.grpc_port, max_message_bytes=s.max_grpc_message_bytes
            )
        for name, frontend in self.frontends.items():
            await frontend.start()
            log.info("%s listening on %s:%d", name, s.host, frontend.port)
        if s.metrics_port is not None:
            self._start_metrics(s.host, s.metrics_port)

    def _start_metrics(self, host: str, port: int) -> None:
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._metrics_server = server
        self.metrics_port = int(server.server_port)
        log.info("metrics listening on %s:%d", host, self.metrics_port)

    @property
    def ports(self) -> dict[str, int]:
        """The ports bound, by frontend (http, grpc, metrics): the OS's choice where 0 was asked."""
        ports = {name: frontend.port for name, frontend in self.frontends.items()}
        if self.metrics_port is not None:
            ports["metrics"] = self.metrics_port
        return ports

    async def serve_forever(self, on_ready: Callable[[Server], object] | None = None) -> None:
        """Start, call `on_ready`, run until SIGINT or SIGTERM, then stop gracefully."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stopped.set)
        await self.start()
        log.info("server ready")
        if on_ready is not None:
            on_ready(self)
        await self._stopped.wait()
        log.info("stopping: finishing requests in flight")
        await self.stop()

    def request_stop(self) -> None:
        """Make serve_forever stop, as a signal would."""
        self._stopped.set()

    async def stop(self) -> None:
        """Refuse new requests, let in-flight ones finish, then unload models and close ports."""
        self.dataplane.stop_accepting()
        if self._poller is not None:
            await self._poller.stop()
        await asyncio.gather(
            *(f.stop(self.settings.grace_s) for f in self.frontends.values()),
            return_exceptions=True,
        )
        await self.manager.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        log.info("stopped")


class ServerThread:
    """A Server on an event loop (uvloop where installed) in a thread, for callers that block.

    The demo serves from one; tests start one on port 0 and call it over the network as any
    client would, or run coroutines on its loop with `run`.
    """

    def __init__(self, settings: ServerSettings) -> None:
        self.server = Server(settings)
        self.loop = _new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="dlscale-server", daemon=True
        )

    def start(self, timeout: float = 300.0) -> None:
        """Load the models and open the ports; on failure everything started is stopped."""
        self._thread.start()
        try:
            self.run(self.server.start(), timeout)
        except BaseException:
            self.stop()
            raise

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        """Stop the server gracefully, then the loop and its thread."""
        try:
            self.run(self.server.stop(), self.server.settings.grace_s + 30.0)
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


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # measured about 5% more throughput than asyncio's loop (docs/decisions.md)
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def serve(args: argparse.Namespace) -> int:
    """`dlscale serve REPO`: the server with the parsed flags, until SIGINT or SIGTERM."""
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    def port(value: int) -> int | None:
        return None if value < 0 else value

    settings = ServerSettings(
        repository=args.repo,
        host=args.host,
        http_port=port(args.http_port),
        grpc_port=port(args.grpc_port),
        metrics_port=port(args.metrics_port),
        model_control=args.model_control,
        load_models=tuple(args.load_model),
        poll_interval_s=args.poll_interval,
        max_body_bytes=int(args.max_body_mb * 2**20),
        max_grpc_message_bytes=int(args.max_grpc_mb * 2**20),
        qos=args.qos,
    )
    with asyncio.Runner(loop_factory=_new_event_loop) as runner:
        runner.run(Server(settings).serve_forever())
    return 0
