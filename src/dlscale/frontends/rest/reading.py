"""Reading one HTTP/1.1 request of a REST connection: httptools' callbacks, which hold the
request to the client limits (request target, header lines, head, body; frontends/limits.py),
find its body a buffer and queue it, once read in full, for the connection to answer.

`RequestReader` is the part of `Connection` (connection.py) that these callbacks make up; the
connection's `__init__` sets the state declared here.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import typing

import httptools

from dlscale.frontends.limits import Limits
from dlscale.frontends.rest.api import RestApi, RestResponse, error_response
from dlscale.frontends.rest.body import HEAD_READ, Body, BodyBuffers
from dlscale.frontends.rest.framing import Pending
from dlscale.wire.tensors import Buffer

_HEADER_OVERHEAD = 4  # bytes counted for a header line's separators (": " and CRLF)
_COMMON_NAMES = (
    "host", "content-length", "content-type", "inference-header-content-length", "accept",
    "accept-encoding", "user-agent", "connection", "content-encoding", "expect",
    "transfer-encoding", "authorization", "traceparent", "keep-alive",
)  # fmt: skip
#: Header names as clients spell them (lower case or capitalised), to the lower-case name:
#: a fixed table, which names a client makes up never grow.
_NAMES = {said.encode(): name for name in _COMMON_NAMES for said in (name, name.title())}


class _Phase(enum.Enum):
    """Where a connection is in reading a request; the timeouts apply to HEAD and BODY."""

    IDLE = "idle"
    HEAD = "head"
    BODY = "body"


#: The phases, bound once: read per request, and on Python 3.11 `_Phase.HEAD` is a Python-level
#: `__getattr__` call on the enum class.
IDLE, HEAD, BODY = _Phase.IDLE, _Phase.HEAD, _Phase.BODY


class BodyOwner(typing.Protocol):
    """What reading a request needs of the frontend: body buffers, and memory reserved for them."""

    bodies: BodyBuffers

    def reserve(self, size: int) -> bool: ...

    def release(self, size: int) -> None: ...


class RequestReader:
    """httptools' callbacks for one connection: each request is read within the limits, then
    queued with `_enqueue`; a request over a limit raises `_Refused` with `_refusal` set."""

    frontend: BodyOwner
    api: RestApi
    parser: httptools.HttpRequestParser
    transport: asyncio.Transport | None
    limits: Limits
    last_active: float
    _phase: _Phase
    _phase_since: float
    _head_seen: int  # bytes fed while the head was still arriving
    _url: bytes
    _head_size: int
    _headers: dict[str, str]
    _header_lines: int
    _method: str
    _path: str
    _keep_alive: bool
    _early: RestResponse | None  # the answer of a request whose body is skipped
    _body: Body | None
    _length: int  # a body's declared length, while its buffer waits for its bytes
    _whole: bytes  # a body that came whole with its head
    _body_size: int
    _reserved: int
    _requests: int
    _refusal: RestResponse | None
    _queue: collections.deque[Pending]
    _done: bool

    def _enqueue(self, message: Pending) -> None:
        """Queue a request read in full; the connection answers its requests in order."""
        raise NotImplementedError

    def on_message_begin(self) -> None:
        # A phase starts at the clock buffer_updated has just read (the callbacks run inside it).
        self._phase, self._phase_since = HEAD, self.last_active
        self._head_seen = 0
        self._url = b""
        self._head_size = 0
        self._headers = {}
        self._header_lines = 0
        self._body = None
        self._length = -1
        self._whole = b""
        self._body_size = 0
        self._early = None

    def on_url(self, url: bytes) -> None:
        url = self._url + url  # most targets come in one piece: the same bytes, not a copy
        if len(url) > self.limits.max_url_bytes:
            self._refusal = error_response(
                414,
                f"the request target exceeds the limit of {self.limits.max_url_bytes} bytes "
                "(max_url_bytes)",
            )
            raise _Refused
        self._url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value)
        lines = self._header_lines = self._header_lines + 1
        head = self._head_size = self._head_size + size + _HEADER_OVERHEAD
        limits = self.limits
        if (
            size > limits.max_header_bytes
            or lines > limits.max_headers
            or head + len(self._url) > limits.max_head_bytes
        ):
            self._refuse_header(name, size)
        known = _NAMES.get(name)  # most names are common ones: no decode and lower-casing
        self._headers[known or name.decode("latin-1").lower()] = value.decode("latin-1")

    def _refuse_header(self, name: bytes, size: int) -> typing.NoReturn:
        """Refuse the head at a header line over a limit: the first limit it is over, in order."""
        limits = self.limits
        if size > limits.max_header_bytes:
            shown = name[:64].decode("latin-1")
            self._refusal = error_response(
                431,
                f"header {shown!r} is {size} bytes, above the limit of {limits.max_header_bytes} "
                "bytes per header line (max_header_bytes)",
            )
        elif self._header_lines > limits.max_headers:
            self._refusal = error_response(
                431, f"more than {limits.max_headers} header lines (max_headers)"
            )
        else:
            self._refusal = self._head_too_large()
        raise _Refused

    def _head_too_large(self) -> RestResponse:
        return error_response(
            431,
            f"the request head exceeds the limit of {self.limits.max_head_bytes} bytes "
            "(max_head_bytes)",
        )

    def on_headers_complete(self) -> None:
        self._phase, self._phase_since = BODY, self.last_active
        headers = self._headers
        length = headers.get("content-length")
        declared = int(length) if length is not None and length.isdigit() else -1
        limit = self.limits.max_body_bytes
        if declared > limit:
            # Refused before the body is read: the connection closes after this answer.
            self._refusal = error_response(
                413, f"the request body of {length} bytes exceeds the limit of {limit} bytes"
            )
            raise _Refused
        if "transfer-encoding" in headers:
            declared = -1
        # Known now, and needed after a body read in place (when a new parser holds no request).
        parser = self.parser
        method = self._method = parser.get_method().decode("ascii")
        path = self._path = self._url.decode("latin-1")
        self._keep_alive = parser.should_keep_alive()
        early = self.api.refusal_before_body(method, path, headers)
        if early is not None:
            self._refuse_before_body(early, declared)
            return
        if "expect" in headers and headers["expect"].lower() == "100-continue" and not self._queue:
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if declared < 0:
            self._body = Body.chunked()
        else:  # its buffer waits for the bytes: a body that comes whole with its head needs none
            self._length = declared

    def _open_body(self) -> Body:
        """The buffer of a declared body that did not come whole with its head."""
        length = self._length
        if self.frontend.reserve(length):
            # A buffer of the declared size before the rest came: reserved within a bound, so
            # that clients declaring bodies they never send cannot make the server hold memory.
            self._reserved = length
            self._body = Body.declared(self.frontend.bodies, length)
        else:
            self._body = Body.chunked()
        return self._body

    def _refuse_before_body(self, answer: RestResponse, declared: int) -> None:
        # A small body of known length is skipped as it passes and the connection kept; a
        # large or unknown one (-1: chunked) is not waited for: answered now, and closed.
        if 0 <= declared <= HEAD_READ:
            self._early = answer
            return
        self._refusal = answer
        raise _Refused

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self.limits.max_body_bytes:
            self._refusal = error_response(
                413, f"the request body exceeds the limit of {self.limits.max_body_bytes} bytes"
            )
            raise _Refused
        if self._early is not None:
            return  # refused already: its bytes are dropped as they pass
        buffer = self._body
        if buffer is None:
            if len(body) == self._length:
                self._whole = body  # the whole body in one piece, as the parser copied it
                return
            buffer = self._open_body()
        buffer.add(body)

    def on_message_complete(self) -> None:
        self._phase, self._phase_since = IDLE, self.last_active
        if self._done:
            return  # pipelined behind the connection's last request: left unanswered, as closed
        body: Buffer = self._whole
        self._whole = b""
        if self._body is not None:
            body = self._body.finish()
            self._body = None
        if self._reserved:
            self._release()
        keep_alive = self._keep_alive
        self._requests += 1
        most = self.limits.max_keep_alive_requests
        if most and self._requests >= most:
            keep_alive = False  # answered with "connection: close"; the client opens another
            self._done = True
        # Positional: keywords would build a dict per request.
        self._enqueue(
            Pending(self._method, self._path, self._headers, body, keep_alive, None, self._early)
        )

    def _release(self) -> None:
        if self._reserved:
            self.frontend.release(self._reserved)
            self._reserved = 0


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that is refused."""
