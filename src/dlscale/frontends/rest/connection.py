"""One REST client connection: parse with httptools, hold the client to its limits, answer in
order, keep alive; the frontend (transport.py) owns the listening socket and the sweeps.

A body of known length is read by the socket straight into one buffer (`body.py`). httptools'
callbacks, which read each request within the limits, are reading.py's `RequestReader`.
"""

from __future__ import annotations

import asyncio
import collections
import typing

import httptools

from dlscale.frontends.limits import Limits
from dlscale.frontends.rest.api import RestApi, RestResponse, error_response
from dlscale.frontends.rest.body import HEAD_READ
from dlscale.frontends.rest.framing import Pending, cut_response, frame
from dlscale.frontends.rest.reading import BODY, HEAD, IDLE, BodyOwner, RequestReader
from dlscale.frontends.rest.streaming import send_stream
from dlscale.wire import tracing

#: Parsed requests a connection may hold while one is answered (pipelining) before it stops reading.
_MAX_PIPELINED = 32
#: How long a refused request's unread body is drained before the connection closes.
DRAIN_AFTER_REFUSAL_S = 2.0
#: The same for a connection refused as it opens: short, as a flood of them holds descriptors.
DRAIN_AFTER_OPEN_REFUSAL_S = 0.5


class Owner(BodyOwner, typing.Protocol):
    """What a connection needs of the frontend that accepted it (transport.py's HttpFrontend):
    what reading a request needs (`BodyOwner`), and more.

    Declared here so that the connection does not import the transport, which imports it.
    """

    api: RestApi
    limits: Limits
    stopping: bool

    def opened(self, conn: Connection) -> str | None: ...

    def closed(self, conn: Connection) -> None: ...


class Connection(RequestReader, asyncio.BufferedProtocol):
    """One client connection: parse, answer in order, keep alive.

    The socket writes into `get_buffer`'s buffer: a small one for heads, parsed by httptools,
    or, while a body of known length is still arriving, that body's own buffer; the parser is
    then renewed for the next request, since it never saw those bytes.
    """

    frontend: Owner

    def __init__(self, frontend: Owner) -> None:
        self.frontend = frontend
        self.api = frontend.api
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.limits = frontend.limits
        self.last_active = self.loop.time()
        self.on_message_begin()  # the state each request starts with (reading.py), before any
        self._phase = IDLE
        self._method = ""
        self._path = ""
        self._keep_alive = True
        self._direct = False  # the socket writes into the body's buffer
        self._reserved = 0  # bytes of frontend.reserve() this connection holds
        self._head = memoryview(bytearray(HEAD_READ))
        self._requests = 0
        self._cut: float | None = None  # the grace, once stop() has cut this connection
        self._refusal: RestResponse | None = None
        self._queue: collections.deque[Pending] = collections.deque()
        #: Answers this connection's requests in order, from its first to its close: between
        #: requests it waits on `_wake` (a future per request costs less than a task per request).
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self._busy = False  # answering: a request is queued, being computed or being written
        self._writable = asyncio.Event()
        self._writable.set()
        self._can_write = True  # `_writable` as read per answer: an attribute, not a call
        self._reading = True
        self._done = False  # no more requests are read on this connection
        self._drain_s = DRAIN_AFTER_REFUSAL_S
        self.peer = ""  # the client's address: connections are capped per peer

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, though they implement it.
        self.transport = typing.cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        refusal = self.frontend.opened(self)
        if refusal is not None:
            self._drain_s = DRAIN_AFTER_OPEN_REFUSAL_S
            retry = (("retry-after", "1"),)
            self._refuse(error_response(503, f"{refusal}; try again later", retry))

    def connection_lost(self, exc: Exception | None) -> None:
        self._done = True
        self._queue.clear()
        if self._task is not None and not self._task.done():
            # The client left: its queued request need not be computed (or, between requests,
            # the connection's answering task ends).
            self._task.cancel()
        self._writable.set()
        self._release()
        self.frontend.closed(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._direct and self._body is not None:
            return self._body.space()
        return self._head

    def buffer_updated(self, nbytes: int) -> None:
        if self._done:
            return
        self.last_active = self.loop.time()
        body = self._body
        if self._direct and body is not None:
            if tracing.active is not None:
                tracing.record(tracing.SOCKET_IN, body.space()[:nbytes])
            if body.received(nbytes):
                self._body_in_place()
            return
        data = self._head[:nbytes]
        if tracing.active is not None:
            tracing.record(tracing.SOCKET_IN, data)
        in_head = self._phase is HEAD
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
        else:
            if self._phase is HEAD:
                # The parser holds a header line until it ends: bound what it may hold.
                self._head_seen += nbytes if in_head else 0
                if self._head_seen > self.limits.max_head_bytes:
                    self._refuse(self._head_too_large())
            elif self._phase is BODY and not self._done:
                # The request the parser is in now, whose head it may just have read: the rest
                # of its body goes from the socket straight into its buffer.
                body = self._body
                if body is None and self._length > 0:
                    body = self._open_body()
                self._direct = body is not None and body.missing > 0

    def _body_in_place(self) -> None:
        self._direct = False
        # The parser stopped in the middle of this body: a new one reads the next request.
        self.parser = httptools.HttpRequestParser(self)
        self.on_message_complete()

    def pause_writing(self) -> None:
        self._can_write = False
        self._writable.clear()

    def resume_writing(self) -> None:
        self._can_write = True
        self._writable.set()

    # -- answering ---------------------------------------------------------------------------------

    def _refuse(self, response: RestResponse) -> None:
        """Answer `response` once earlier requests are answered, then close; parse no more."""
        self._done = True  # what still arrives is read and dropped (see _finish_refusal)
        self._enqueue(Pending("", "", {}, b"", False, refusal=response))

    def _enqueue(self, message: Pending) -> None:
        self._queue.append(message)
        if len(self._queue) >= _MAX_PIPELINED:
            self._pause_reading()
        if not self._busy:
            self._busy = True
            wake, self._wake = self._wake, None
            if wake is not None:
                if not wake.done():
                    wake.set_result(None)
            elif self._task is None:
                self._task = self.loop.create_task(self._answer_queue())

    async def _answer_queue(self) -> None:
        """Answer the queued requests in order, then wait for the next; end with the connection."""
        while True:
            try:
                while (
                    self._queue and self.transport is not None and not self.transport.is_closing()
                ):
                    message = self._queue.popleft()
                    if message.refusal is not None:
                        response = message.refusal
                    elif message.answer is not None:
                        response = message.answer
                    else:
                        try:
                            response = await self.api.handle(
                                message.method, message.path, message.headers, message.body
                            )
                        except asyncio.CancelledError:
                            if self._cut is None:
                                raise  # the client left
                            task = asyncio.current_task()
                            if task is not None:
                                task.uncancel()
                            message.refusal = response = cut_response(self._cut)
                    if not self._can_write:
                        await self._writable.wait()
                    if message.refusal is not None:
                        self._write(response, keep_alive=False)
                        self._finish_refusal()
                        return
                    keep = message.keep_alive and not self.frontend.stopping
                    if response.stream is None:
                        self._write(response, keep or bool(self._queue), message.method == "HEAD")
                    elif not await send_stream(
                        self.transport,
                        self._writable,
                        response,
                        keep,
                        self.limits.unread_stream_timeout_s,
                    ):
                        self.transport.close()  # a chunked body cut short: its end is the close
                        return
                    if not keep and not self._queue:
                        self.transport.close()
                        return
                    if (
                        not self._reading
                        and len(self._queue) < _MAX_PIPELINED // 2
                        and not self._done
                    ):
                        self._reading = True
                        self.transport.resume_reading()
            finally:
                self._busy = False
                self.last_active = self.loop.time()
                if self._phase is not IDLE:
                    self._phase_since = self.last_active  # its time starts once we can read it
            if self.transport is None or self.transport.is_closing():
                return
            self._wake = self.loop.create_future()
            await self._wake

    def _write(self, response: RestResponse, keep_alive: bool, head_only: bool = False) -> None:
        assert self.transport is not None
        chunks = frame(response, keep_alive, head_only)
        if len(chunks) == 1:
            self.transport.write(chunks[0])  # one write (one syscall) for a small response
            return
        if tracing.on():
            for chunk in chunks:
                tracing.record(tracing.SOCKET_OUT, chunk)
        self.transport.writelines(chunks)

    def _finish_refusal(self) -> None:
        # Closing with unread body bytes in the socket makes the kernel send RST, and the client
        # may lose the answer: shut our side, keep draining a moment, then close.
        assert self.transport is not None
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(self._drain_s, self.transport.close)

    def _pause_reading(self) -> None:
        if self._reading and self.transport is not None and not self.transport.is_closing():
            self._reading = False
            self.transport.pause_reading()

    # -- used by the frontend ----------------------------------------------------------------------

    def check_deadlines(self, now: float) -> None:
        """Answer 408 to a request whose head or body is late; close a keep-alive gone idle."""
        if self._done or not self._reading or self._busy:
            return  # refused already, or answering: a request read meanwhile is not late
        limits, since = self.limits, now - self._phase_since
        if self._phase is HEAD and since > limits.head_timeout_s:
            late = f"the request head did not arrive within {limits.head_timeout_s:g} s"
            self._refuse(error_response(408, f"{late} (head_timeout_s)"))
        elif self._phase is BODY and since > limits.body_timeout_s:
            late = f"the request body did not arrive within {limits.body_timeout_s:g} s"
            self._refuse(error_response(408, f"{late} (body_timeout_s)"))
        elif self._phase is IDLE and self.last_active < now - limits.keep_alive_s:
            self.abort()

    def idle_since(self) -> float | None:
        """When this keep-alive connection went idle, or None while a request is under way."""
        if self._phase is not IDLE or self._busy or self._done:
            return None
        return self.last_active

    def close_if_idle(self) -> None:
        """Close now if no request is being read or answered; refuse one half read with 503."""
        if self._busy or self.transport is None or self._done:
            return
        if self._phase is IDLE:
            self._done = True
            self.transport.close()
        else:
            self._refuse(error_response(503, "the server is shutting down"))

    def cut(self, grace_s: float) -> None:
        """The grace is over: answer the request in progress with 503, then close."""
        self._cut = grace_s
        if self._busy and self._task is not None:
            self._task.cancel()
        elif not self._done:
            self._refuse(cut_response(grace_s))

    def abort(self) -> None:
        """Drop the connection at once."""
        if self.transport is not None:
            self.transport.abort()
