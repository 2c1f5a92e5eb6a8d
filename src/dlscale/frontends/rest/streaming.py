"""A REST answer sent as it is made: HTTP/1.1 chunked transfer of a `RestResponse.stream`.

Server-sent events (`text/event-stream`: generate_stream, OpenAI streams) go out one chunk per
event, as soon as the model sends each response, paced by the socket (the connection's
`writable`). The stream is closed when it ends, when it fails, and when the client leaves
(the connection cancels the task that awaits here): closing it closes the Plane stream behind
it, which frees the request's sequence at once.
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus

from dlscale.frontends.loop import done_within
from dlscale.frontends.rest.responses import RestResponse
from dlscale.serving.streams import aclose

log = logging.getLogger("dlscale.http")

_END = b"0\r\n\r\n"


def stream_head(response: RestResponse, keep_alive: bool) -> bytes:
    """The status line and headers of a chunked answer."""
    reason = HTTPStatus(response.status).phrase
    lines = [
        f"HTTP/1.1 {response.status} {reason}\r\n",
        f"content-type: {response.content_type}\r\n",
        "transfer-encoding: chunked\r\n",
        "cache-control: no-cache\r\n",
    ]
    lines += [f"{name}: {value}\r\n" for name, value in response.headers]
    if not keep_alive:
        lines.append("connection: close\r\n")
    return ("".join(lines) + "\r\n").encode("latin-1")


async def send_stream(
    transport: asyncio.Transport,
    writable: asyncio.Event,
    response: RestResponse,
    keep_alive: bool,
    unread_s: float,
) -> bool:
    """Write `response`'s head and each chunk of its stream; whether it ended whole (else the
    connection must close: the client cannot tell where an unfinished chunked body ends).

    A client that leaves the socket full for `unread_s` (unread_stream_timeout_s) is dropped:
    its stream is closed first, which frees its sequence and seat at once."""
    assert response.stream is not None
    transport.write(stream_head(response, keep_alive))
    unread = False
    try:
        async for chunk in response.stream:
            if not chunk:
                continue  # an empty chunk would end the body
            # A client that read enough for the socket to take more in time is kept.
            if not writable.is_set() and not await done_within(writable.wait(), unread_s):
                unread = True
                break
            if transport.is_closing():
                return False
            transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
    except Exception:  # the route turns the model's errors into events: this is a bug
        log.exception("a streamed answer failed")
        return False
    finally:
        await aclose(response.stream)
    if unread:
        log.warning(
            "a streamed answer was not read for %g s: cut (unread_stream_timeout_s)", unread_s
        )
        transport.abort()  # close() would wait to flush what this client does not read
        return False
    transport.write(_END)
    return True
