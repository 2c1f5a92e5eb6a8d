"""The REST frontend: HTTP/1.1 on an asyncio Protocol with httptools' parser (uvloop when present).

Why not a framework: see docs/decisions.md (measured against uvicorn and granian). The transport
does only HTTP: framing, keep-alive, pipelining in order, the limits on what a client may send
and hold (frontends/limits.py), flow control, TLS and a graceful stop. Routes live in `api.py`;
tensors in the wire codec (`dlscale.wire.rest`); the connection reads a body of known length
straight into one buffer (`body.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl

from dlscale.errors import DlscaleError
from dlscale.frontends import GRACE_S
from dlscale.frontends.access import Access
from dlscale.frontends.limits import Limits, connection_cap, descriptor_budget
from dlscale.frontends.plane import Plane
from dlscale.frontends.rest.api import RestApi
from dlscale.frontends.rest.body import BodyBuffers
from dlscale.frontends.rest.connection import DRAIN_AFTER_REFUSAL_S, Connection

log = logging.getLogger("dlscale.http")


class HttpFrontend:
    """Serves the Open Inference Protocol over REST from one DataPlane on one port."""

    def __init__(
        self,
        dataplane: Plane,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        limits: Limits | None = None,
        tls: ssl.SSLContext | None = None,
        access: Access | None = None,
        bodies: BodyBuffers | None = None,
        reuse_port: bool = False,
    ) -> None:
        self.limits = limits or Limits()
        self.api = RestApi(dataplane, self.limits, access)
        #: Where large request bodies are received (page-locked ones on a CUDA server).
        self.bodies = bodies or BodyBuffers()
        self._receiving = 0  # bytes reserved for bodies still arriving
        self.host = host
        self.requested_port = port
        #: Share the port with other processes (SO_REUSEPORT): the REST worker processes do.
        self.reuse_port = reuse_port
        self.tls = tls
        self.max_connections = self.limits.max_connections
        self.stopping = False
        self._server: asyncio.Server | None = None
        self._connections: set[Connection] = set()  # every open one, refused ones included
        self._counted: set[Connection] = set()  # the ones served: within the limits below
        self._peers: dict[str, int] = {}  # connections served per client address
        #: The descriptors REST connections share with shared-memory regions (limits.py).
        self.descriptors = descriptor_budget()
        self._all_closed = asyncio.Event()
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Bind and listen; returns once connections are accepted (port 0 picks a free port)."""
        loop = asyncio.get_running_loop()
        self.max_connections = connection_cap(self.limits.max_connections)
        try:
            self._server = await loop.create_server(
                lambda: Connection(self),
                self.host,
                self.requested_port,
                backlog=1024,
                reuse_port=self.reuse_port or None,
                ssl=self.tls,
                ssl_handshake_timeout=self.limits.head_timeout_s if self.tls else None,
            )
        except OSError as exc:  # a busy port is the user's to fix: a message, not a traceback
            address = f"{self.host}:{self.requested_port}"
            raise DlscaleError(f"REST cannot listen on {address}: {exc.strerror or exc}") from exc
        self._sweeper = loop.create_task(self._sweep())
        self.descriptors.add_reaper(self.reap_idle)
        scheme = "https" if self.tls else "http"
        log.info("REST frontend listening on %s://%s:%d", scheme, self.host, self.port)

    @property
    def port(self) -> int:
        """The port really bound."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the HTTP frontend is not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float = GRACE_S) -> None:
        """Stop accepting; answer what was received; close; cut what outlasts `grace_s` with 503."""
        if self._server is None:
            return
        self.stopping = True
        self._server.close()
        self.descriptors.remove_reaper(self.reap_idle)
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self._connections):
            conn.close_if_idle()
        if self._connections:
            self._all_closed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_closed.wait(), grace_s)
        if self._connections:
            log.warning(
                "%d connection(s) still busy after the %.1f s grace: answering 503",
                len(self._connections),
                grace_s,
            )
            for conn in list(self._connections):
                conn.cut(grace_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_closed.wait(), DRAIN_AFTER_REFUSAL_S + 1)
        for conn in list(self._connections):
            conn.abort()
            self._uncount(conn)  # now: the loop may stop before it reports the connection lost
        await self._server.wait_closed()
        self._server = None
        self.bodies.close()

    def opened(self, conn: Connection) -> str | None:
        """Count a new connection; None to serve it, else why it is refused (a 503's message).

        A full server first closes its longest-idle keep-alive connection (idle at least
        reap_idle_s) to make room, so that idle connections cannot keep new clients out.
        """
        self._connections.add(conn)
        limits = self.limits
        cap, held = limits.max_connections_per_peer, self._peers.get(conn.peer, 0)
        if cap and held >= cap:
            return (
                f"this client ({conn.peer}) holds its maximum of {cap} connections "
                "(max_connections_per_peer); reuse or close one"
            )
        if len(self._counted) >= self.max_connections and not self.reap_idle():
            return f"the server holds its maximum of {self.max_connections} connections"
        if not self.descriptors.acquire():
            return "the server has no file descriptor left for a new connection"
        self._counted.add(conn)
        self._peers[conn.peer] = held + 1
        return None

    def reap_idle(self) -> bool:
        """Close the longest-idle keep-alive connection (idle at least reap_idle_s), if any."""
        oldest: Connection | None = None
        since = asyncio.get_running_loop().time() - self.limits.reap_idle_s
        for conn in self._counted:
            idle = conn.idle_since()
            if idle is not None and idle <= since:
                oldest, since = conn, idle
        if oldest is None:
            return False
        oldest.abort()  # idle between requests: nothing is lost, the client opens another
        self._uncount(oldest)
        return True

    def _uncount(self, conn: Connection) -> None:
        if conn not in self._counted:
            return
        self._counted.discard(conn)
        self.descriptors.release()
        left = self._peers.pop(conn.peer) - 1
        if left:
            self._peers[conn.peer] = left

    def reserve(self, size: int) -> bool:
        """Reserve `size` bytes for a body received in place; False when the bound is reached."""
        if self._receiving + size > self.limits.max_receiving_bytes:
            return False
        self._receiving += size
        return True

    def release(self, size: int) -> None:
        """A reserved body arrived whole, or its connection went."""
        self._receiving -= size

    def closed(self, conn: Connection) -> None:
        """Forget a closed connection; the last one wakes a stop waiting for them all."""
        self._uncount(conn)
        self._connections.discard(conn)
        if not self._connections:
            self._all_closed.set()

    async def _sweep(self) -> None:
        # One sweep for all connections is cheaper than a timer armed on every request.
        limits = self.limits
        shortest = min(limits.keep_alive_s, limits.head_timeout_s, limits.body_timeout_s)
        period = min(max(shortest / 4, 0.05), 1.0)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            for conn in list(self._connections):
                conn.check_deadlines(now)
