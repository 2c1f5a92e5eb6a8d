"""The fleet's router on Ray: a named actor running HAProxy where the user asked, fed by replicas.

One actor per fleet (ROUTER_NAME in ROUTER_NAMESPACE), placed on the node of `--host` (the
driver's node for a loopback or wildcard address). It runs:
- HAProxy (scale/haproxy.py) on --host/--http-port/--grpc-port: every request goes from it
  straight to a replica's own ports;
- the registry (scale/registry.py) the replicas report to: joined, ready, heartbeats, left;
- the control endpoint (scale/control.py) HAProxy sends loads and unloads to, on loopback;
- on --metrics-port: the fleet's metrics (scale/metrics.py) and its JSON view (`/dlscale/fleet`,
  also through HAProxy's REST port).
Ray restarts the actor when it dies (max_restarts): it binds the same ports again and knows the
replicas again from their next heartbeats, and the repository's wanted models from theirs.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

import grpc
import ray
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dlscale.errors import DlscaleError
from dlscale.scale import control
from dlscale.scale.child import Endpoint
from dlscale.scale.connections import ConnectionRules
from dlscale.scale.control import Answer, ControlLog, Entry
from dlscale.scale.haproxy import HaproxyRouter
from dlscale.scale.haproxy_config import FLEET_PATH, REST, Control
from dlscale.scale.metrics import fleet_metrics
from dlscale.scale.prefix import Routing
from dlscale.scale.registry import HEARTBEAT_S, Registry
from dlscale.scale.weights import WEIGH_S

log = logging.getLogger("dlscale.scale")
ROUTER_NAME, ROUTER_NAMESPACE = "dlscale-router", "dlscale"
LOOPBACK = "127.0.0.1"
#: Seconds the router's thread gets to bind its ports, and HAProxy to start.
START_TIMEOUT_S, ROUTER_START_S = 30.0, 30.0
#: The autoscaler's decisions the fleet's view keeps, the newest last.
DECISIONS = 16


class FleetRouter:
    """The router actor's body (made a Ray actor by scale/deploy.py)."""

    def __init__(
        self,
        host: str,
        http_port: int,
        grpc_port: int | None,
        metrics_port: int | None,
        routing: Routing | None = None,
        rules: ConnectionRules | None = None,
    ) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        self.log = ControlLog()
        self._decisions: collections.deque[dict[str, Any]] = collections.deque(maxlen=DECISIONS)
        self._closing = False
        self.host = host
        self._loop = asyncio.new_event_loop()
        self._servers = _Servers(self, host, metrics_port, grpc_port is not None)
        self._error: BaseException | None = None
        self._routing = routing
        self._rules = rules
        started = threading.Event()
        asked = (http_port, grpc_port)
        threading.Thread(target=self._run, args=(started, asked), daemon=True).start()
        if not started.wait(START_TIMEOUT_S + ROUTER_START_S) or self._error is not None:
            raise DlscaleError(f"the router did not start: {self._error or 'timed out'}")
        for proto, port in self.haproxy.ports.items():
            log.info("router: %s listening on %s:%d", proto, host, port)

    def _run(self, started: threading.Event, asked: tuple[int, int | None]) -> None:
        """The router's own thread, for the actor's life: its servers' loop, and HAProxy's
        parent (HAProxy dies with the *thread* that started it, PR_SET_PDEATHSIG, so not a
        thread of Ray's that may end)."""
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._servers.start())
            where = Control(LOOPBACK, *self._servers.control_ports)
            self.haproxy = HaproxyRouter(self.host, *asked, where, self._routing, self._rules)
            # Restarted by Ray: the HAProxy of the router that died may still hold the ports.
            restarted = was_restarted()
            self.haproxy.start(bind_patience_s=ROUTER_START_S if restarted else 0.0)
            self.registry = Registry(self.haproxy)
        except BaseException as exc:  # said to __init__, which raises it
            self._error = exc
            return
        finally:
            started.set()
        self._loop.run_forever()

    # -- what the command line asks -----------------------------------------------------------

    def ports(self) -> dict[str, int]:
        """The ports HAProxy (http, grpc) and the metrics page (metrics) listen on."""
        found = dict(self.haproxy.ports)
        if self._servers.metrics_port is not None:
            found["metrics"] = self._servers.metrics_port
        return found

    def view(self) -> dict[str, Any]:
        """The fleet: each replica (and HAProxy's state of it), the models loaded or unloaded,
        the router's own process (a restart shows as a new pid) and the models it routes by
        prefix or session (scale/prefix.py)."""
        router = {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}
        decisions = list(self._decisions)
        autoscaler = {"last": decisions[-1] if decisions else None, "recent": decisions}
        return {
            "replicas": self.registry.view(),
            "models": self.log.wanted(),
            "router": router,
            "autoscaler": autoscaler,
            # The models whose generative requests are hashed, and their key lengths.
            "routes": dict(self.haproxy.routing.routes),
        }

    def decided(self, decision: dict[str, Any]) -> None:
        """The autoscaler's decision (scale/autoscale.py, told from Ray Serve's controller), kept
        for the view with the few before it (a restarted router knows only those after)."""
        self._decisions.append(decision)

    def route(self, routes: dict[str, int]) -> None:
        """Hash the generative requests of exactly these models (a deploy's repository)."""
        self.haproxy.route(routes)

    def closing(self) -> None:
        """The fleet is being deleted: no replica holds on for another (`holds`)."""
        self._closing = True

    def stop(self) -> None:
        """Stop HAProxy and the control endpoint (the fleet is being deleted)."""
        self.haproxy.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)

    # -- what replicas say ----------------------------------------------------------------------

    def join(self, key: str, node: str, endpoint: Endpoint) -> list[Entry]:
        """A replica's child serves: loads and unloads reach it from now on; returns those
        recorded so far, for it to replay before it is `ready`."""
        self.registry.join(key, node, endpoint)
        return self.log.entries()

    def ready(self, key: str) -> None:
        """The replica replayed the loads and unloads: into rotation."""
        self.registry.ready(key)

    def heartbeat(self, key: str, node: str, endpoint: Endpoint, ready: bool, seq: int) -> int:
        """The replica lives; returns the newest load/unload this router knows (a replica that
        knows a newer one hands its copy over with `adopt`: the router restarted)."""
        self.registry.heartbeat(key, node, endpoint, ready)
        return self.log.seq

    def entries(self) -> list[Entry]:
        """The loads and unloads recorded, oldest first (a replica keeps a copy)."""
        return self.log.entries()

    def adopt(self, entries: Sequence[Entry]) -> None:
        """A replica's copy of the loads and unloads, after a restart of this router."""
        if self.log.adopt(entries):
            log.info("router: %d model load(s)/unload(s) taken from a replica", len(entries))

    def starting(self, key: str) -> int:
        """A replica's actor is starting its child (a successor `holds` waits for); returns the
        newest load/unload recorded, which its child's start reads the repository after."""
        self.registry.starting(key)
        return self.log.seq

    def holds(self, key: str) -> float:
        """How long a stopping replica must keep serving, from when it began to stop (0: it
        need not): while it is the only one in rotation and the fleet is not being deleted, for
        a successor to start (Registry.hand_over). Ray rolls out a new version (a switch
        between --replicas and --autoscale, new flags) by stopping an old replica while its
        successor starts: a one-replica fleet answered 503 for 2.6 s of such a switch without
        this."""
        return 0.0 if self._closing else self.registry.hand_over(key)

    def leave(self, key: str) -> None:
        """The replica stops."""
        self.registry.leave(key)


class _Servers:
    """The router's own servers on its event loop: control (REST, gRPC) and metrics."""

    def __init__(
        self, router: FleetRouter, host: str, metrics_port: int | None, with_grpc: bool
    ) -> None:
        self.router = router
        self.host = host
        self.asked_metrics_port = metrics_port
        self.with_grpc = with_grpc
        self.control_ports: tuple[int, int | None] = (0, None)
        self.metrics_port: int | None = None
        self._keep: list[Any] = []

    async def start(self) -> None:
        """Start the control endpoint (REST, gRPC), the metrics page and the sweeper."""
        app = Starlette(routes=self._routes())
        rest = await self._http(app, LOOPBACK, 0)
        grpc_port = None
        if self.with_grpc:
            server = grpc.aio.server()
            server.add_generic_rpc_handlers((control.grpc_handler(self.control),))
            grpc_port = server.add_insecure_port(f"{LOOPBACK}:0")
            await server.start()
            self._keep.append(server)
        self.control_ports = (rest, grpc_port)
        if self.asked_metrics_port is not None:
            self.metrics_port = await self._http(app, self.host, self.asked_metrics_port)
        self._keep.append(asyncio.get_running_loop().create_task(self.sweep_forever()))

    async def _http(self, app: Starlette, host: str, port: int) -> int:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        server = uvicorn.Server(config)
        self._keep.append(asyncio.get_running_loop().create_task(server.serve(sockets=[sock])))
        return int(sock.getsockname()[1])

    def _routes(self) -> list[Route]:
        model = "/v2/repository/models/{name}"
        return [
            Route(f"{model}/load", self._rest_control, methods=["POST"]),
            Route(f"{model}/unload", self._rest_control, methods=["POST"]),
            Route(FLEET_PATH, self._fleet, methods=["GET"]),
            Route("/metrics", self._metrics, methods=["GET"]),
        ]

    async def _rest_control(self, request: Request) -> Response:
        raw = request.scope.get("raw_path") or request.url.path.encode()
        ctype = request.headers.get("content-type", "application/json")
        body = await request.body()
        answer = await self.control(REST, raw.decode("latin-1"), body, ctype)
        return Response(answer.body, answer.status, media_type=answer.content_type)

    async def control(self, proto: str, path: str, body: bytes, ctype: str) -> Answer:
        """A load or unload from a client: recorded, then sent to every replica."""
        model = unquote(path.split("/")[-2]) if proto == REST else control.grpc_model(path, body)
        log_ = self.router.log
        entry, previous = log_.record(model, proto, path, body, ctype)
        return await control.fan_out(log_, entry, previous, self.router.registry.endpoints())

    async def sweep_forever(self) -> None:
        """Drop the replicas whose heartbeats stopped, twice a heartbeat; weigh the others by
        their measured work every WEIGH_S."""
        weighed = time.monotonic()
        while True:
            await asyncio.sleep(HEARTBEAT_S / 2)
            registry = getattr(self.router, "registry", None)  # None while HAProxy starts
            try:
                if registry is not None:
                    await asyncio.to_thread(registry.sweep)
                    if time.monotonic() - weighed >= WEIGH_S:
                        weighed = time.monotonic()
                        await asyncio.to_thread(registry.weigh)
            except Exception:  # HAProxy restarting: the next sweep tries again
                log.exception("router: sweeping or weighing the replicas failed")

    async def _fleet(self, request: Request) -> Response:
        return JSONResponse(await asyncio.to_thread(self.router.view))

    async def _metrics(self, request: Request) -> Response:
        page = await fleet_metrics(self.router.registry.replicas())
        return Response(page, media_type="text/plain; version=0.0.4; charset=utf-8")


def was_restarted() -> bool:
    """Whether Ray restarted this actor. Ray 2.60's own property reads its deprecated
    `actor_id`, which printed a RayDeprecationWarning into every `dlscale serve --ray`'s log."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
