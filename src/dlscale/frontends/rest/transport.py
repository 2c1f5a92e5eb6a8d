"""The REST frontend: HTTP/1.1 on an asyncio Protocol with httptools' parser (uvloop when present).

Why not a framework: see docs/decisions.md (measured against uvicorn and granian). The transport
does only HTTP: framing, keep-alive, pipelining in order, the body limit, flow control and a
graceful stop. Routes live in `api.py`; tensors in the wire codec (`dlscale.wire.rest`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import typing
from dataclasses import dataclass
from http import HTTPStatus

import httptools

from dlscale.frontends.rest.api import RestApi, RestResponse, error_response
from dlscale.serving.dataplane import DataPlane
from dlscale.wire.tensors import Buffer

log = logging.getLogger("dlscale.http")

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
#: Parsed requests a connection may hold while one is answered (pipelining) before it stops reading.
_MAX_PIPELINED = 32
#: How long a refused request's unread body is drained before the connection closes.
_DRAIN_AFTER_REFUSAL_S = 2.0


@dataclass(eq=False)
class _Message:
    """One parsed request waiting for its turn, or a refusal to send before closing."""

    method: str
    path: str
    headers: dict[str, str]
    body: Buffer
    keep_alive: bool
    refusal: RestResponse | None = None


class HttpFrontend:
    """Serves the Open Inference Protocol over REST from one DataPlane on one port."""

    def __init__(
        self,
        dataplane: DataPlane,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        max_body_bytes: int = 64 * 2**20,
        keep_alive_s: float = 75.0,
    ) -> None:
        if max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
        self.api = RestApi(dataplane, max_body_bytes)
        self.host = host
        self.requested_port = port
        self.max_body_bytes = max_body_bytes
        self.keep_alive_s = keep_alive_s
        self.stopping = False
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._all_closed = asyncio.Event()
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Bind and listen; returns once connections are accepted (port 0 picks a free port)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), self.host, self.requested_port, backlog=1024
        )
        self._sweeper = loop.create_task(self._sweep_idle())
        log.info("REST frontend listening on http://%s:%d", self.host, self.port)

    @property
    def port(self) -> int:
        """The port really bound."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the HTTP frontend is not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop accepting; answer what was received; close; abort what outlasts `grace_s`."""
        if self._server is None:
            return
        self.stopping = True
        self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self._connections):
            conn.close_if_idle()
        if self._connections:
            self._all_closed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_closed.wait(), grace_s)
        for conn in list(self._connections):
            log.warning("aborting a connection still busy after the %.1f s grace", grace_s)
            conn.abort()
        await self._server.wait_closed()
        self._server = None

    def _opened(self, conn: _Connection) -> None:
        self._connections.add(conn)

    def _closed(self, conn: _Connection) -> None:
        self._connections.discard(conn)
        if not self._connections:
            self._all_closed.set()

    async def _sweep_idle(self) -> None:
        # One sweep for all connections is cheaper than a timer armed on every request.
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(self.keep_alive_s / 4, 0.05))
            cutoff = loop.time() - self.keep_alive_s
            for conn in list(self._connections):
                if conn.idle_since(cutoff):
                    conn.abort()


class _Connection(asyncio.Protocol):
    """One client connection: parse, answer in order, keep alive."""

    def __init__(self, frontend: HttpFrontend) -> None:
        self.frontend = frontend
        self.api = frontend.api
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.last_active = self.loop.time()
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._body_size = 0
        self._refusal: RestResponse | None = None
        self._queue: collections.deque[_Message] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._reading = True
        self._done = False  # no more requests are read on this connection

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, though they implement it.
        self.transport = typing.cast(asyncio.Transport, transport)
        self.frontend._opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._done = True
        self._queue.clear()
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client left: its queued request need not be computed
        self._writable.set()
        self.frontend._closed(self)

    def data_received(self, data: bytes) -> None:
        if self._done:
            return
        self.last_active = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(error_response(400, "protocol upgrades are not supported"))
        except httptools.HttpParserCallbackError:
            if self._refusal is None:
                raise
            self._refuse(self._refusal)
        except httptools.HttpParserError as exc:
            self._refuse(error_response(400, f"malformed HTTP request: {exc}"))

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._body = []
        self._body_size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        length = self._headers.get("content-length")
        limit = self.frontend.max_body_bytes
        if length is not None and length.isdigit() and int(length) > limit:
            # Refused before the body is read: the connection closes after this answer.
            self._refusal = error_response(
                413, f"the request body of {length} bytes exceeds the limit of {limit} bytes"
            )
            raise _Refused
        if self._headers.get("expect", "").lower() == "100-continue" and not self._queue:
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self.frontend.max_body_bytes:
            self._refusal = error_response(
                413, f"the request body exceeds the limit of {self.frontend.max_body_bytes} bytes"
            )
            raise _Refused
        self._body.append(body)

    def on_message_complete(self) -> None:
        parts = self._body
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        message = _Message(
            self.parser.get_method().decode("ascii"),
            self._url.decode("latin-1"),
            self._headers,
            body,
            self.parser.should_keep_alive(),
        )
        self._enqueue(message)

    # -- answering ---------------------------------------------------------------------------------

    def _refuse(self, response: RestResponse) -> None:
        """Answer `response` once earlier requests are answered, then close; parse no more."""
        self._done = True  # what still arrives is read and dropped (see _finish_refusal)
        self._enqueue(_Message("", "", {}, b"", False, refusal=response))

    def _enqueue(self, message: _Message) -> None:
        self._queue.append(message)
        if len(self._queue) >= _MAX_PIPELINED:
            self._pause_reading()
        if self._task is None:
            self._task = self.loop.create_task(self._answer_queue())

    async def _answer_queue(self) -> None:
        try:
            while self._queue and self.transport is not None and not self.transport.is_closing():
                message = self._queue.popleft()
                if message.refusal is not None:
                    response = message.refusal
                else:
                    response = await self.api.handle(
                        message.method, message.path, message.headers, message.body
                    )
                if not self._writable.is_set():
                    await self._writable.wait()
                if message.refusal is not None:
                    self._write(response, keep_alive=False)
                    self._finish_refusal()
                    return
                keep = message.keep_alive and not self.frontend.stopping
                self._write(response, keep or bool(self._queue), message.method == "HEAD")
                if not keep and not self._queue:
                    self.transport.close()
                    return
                if not self._reading and len(self._queue) < _MAX_PIPELINED // 2 and not self._done:
                    self._reading = True
                    self.transport.resume_reading()
        finally:
            self._task = None
            self.last_active = self.loop.time()

    def _write(self, response: RestResponse, keep_alive: bool, head_only: bool = False) -> None:
        assert self.transport is not None
        size = sum(len(p) for p in response.parts)
        parts = [] if head_only else response.parts  # a HEAD answer has headers and no body
        head = [
            b"HTTP/1.1 %d %s\r\n" % (response.status, _REASONS.get(response.status, b"")),
            b"content-type: %s\r\ncontent-length: %d\r\n" % (response.content_type.encode(), size),
        ]
        for name, value in response.headers:
            head.append(f"{name}: {value}\r\n".encode("latin-1"))
        if not keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        if size < 65536:
            # One write (one syscall) for the common small response.
            self.transport.write(b"".join([*head, *parts]))
        else:
            self.transport.writelines([b"".join(head), *parts])

    def _finish_refusal(self) -> None:
        # Closing with unread body bytes in the socket makes the kernel send RST, and the client
        # may lose the answer: shut our side, keep draining a moment, then close.
        assert self.transport is not None
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(_DRAIN_AFTER_REFUSAL_S, self.transport.close)

    def _pause_reading(self) -> None:
        if self._reading and self.transport is not None and not self.transport.is_closing():
            self._reading = False
            self.transport.pause_reading()

    # -- used by the frontend ----------------------------------------------------------------------

    def idle_since(self, cutoff: float) -> bool:
        """Whether nothing has been received or answered since `cutoff` and nothing is pending."""
        return self._task is None and self.last_active < cutoff

    def close_if_idle(self) -> None:
        """Close now if no request is being answered; otherwise close after answering."""
        if self._task is None and self.transport is not None:
            self._done = True
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection at once."""
        if self.transport is not None:
            self.transport.abort()


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that is refused."""
