"""A REST answer as the routes make it, before the connection frames it for the wire."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from dlscale.wire.tensors import Buffer

JSON = "application/json"


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


def error_response(
    status: int, message: str, headers: tuple[tuple[str, str], ...] = ()
) -> RestResponse:
    """The protocol's error body: `{"error": "..."}`."""
    return RestResponse(status, [orjson.dumps({"error": message})], headers=headers)
