"""A REST answer as the routes make it, before the connection frames it for the wire, and what
every group of routes (OIP, OpenAI, TF Serving) shares: a handler's type, a path's parts."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import orjson

from dlscale.errors import DlscaleError, redact_paths
from dlscale.serving.observe.logs import log_failure
from dlscale.wire.tensors import Buffer

log = logging.getLogger("dlscale.http")

JSON = "application/json"
#: Server-sent events: a streamed answer's content type (generate_stream, OpenAI streams).
EVENT_STREAM = "text/event-stream"
#: Paths whose route a group of routes remembers: clients repeat a few; a flood of distinct ones
#: only refills its cache, which holds routes that exist and never more than this many.
ROUTE_CACHE_SIZE = 1024


@dataclass(slots=True)  # one per request: slots make it and read it faster
class RestResponse:
    """A response ready for the wire: status, body parts, content type and extra headers; or,
    with `stream`, a body sent chunk by chunk as it is made (server-sent events: `parts` empty;
    rest/streaming.py writes it and closes it when the client leaves)."""

    status: int
    parts: list[Buffer]
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = ()
    stream: AsyncIterator[bytes] | None = None


def json_response(doc: Any, status: int = 200) -> RestResponse:
    """A JSON body."""
    return RestResponse(status, [orjson.dumps(doc)])


def event(doc: dict[str, Any]) -> bytes:
    """A server-sent event holding one JSON document."""
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def error_response(
    status: int, message: str, headers: tuple[tuple[str, str], ...] = ()
) -> RestResponse:
    """The protocol's error body: `{"error": "..."}`."""
    return RestResponse(status, [orjson.dumps({"error": message})], headers=headers)


def failure_response(
    what: str, model: str, exc: Exception, challenge: bool = False
) -> RestResponse:
    """The answer to request `what` (method and path) that raised `exc`, logged: its error's
    status, or 500 for a bug (which must answer, not drop the connection). With `challenge`, a
    401 names the scheme its caller must use (`WWW-Authenticate: Bearer`)."""
    if isinstance(exc, DlscaleError):
        log_failure("HTTP", model, exc.http_status, exc.reason, f"{what}: {exc}")
        headers = (("www-authenticate", "Bearer"),) if challenge and exc.http_status == 401 else ()
        return error_response(exc.http_status, exc.message, headers)
    log.exception("%s failed", what, exc_info=exc)
    return error_response(500, redact_paths(f"internal error: {exc!r}"))


#: A route's handler: its path arguments, the headers (lower-case names) and the body.
Handler = Callable[[list[str], Mapping[str, str], Buffer], Awaitable[RestResponse]]
#: Undoes a body's Content-Encoding within the body limit (the REST routes' own rule).
Decoder = Callable[[Mapping[str, str], Buffer], Buffer]


def path_parts(path: str) -> list[str]:
    """A path's parts without its query, unquoted: '/v2/models/a%20b' -> ['v2', 'models', 'a b']."""
    return [unquote(p) for p in path.split("?", 1)[0].strip("/").split("/")]
