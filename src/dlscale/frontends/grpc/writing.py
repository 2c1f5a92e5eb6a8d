"""A stream's answers written by the handler itself, each within a bound on the client's reading.

grpc.aio writes what an async-generator handler yields and waits, without a limit, for the
client's HTTP/2 window to open; a client that never reads would hold the stream, its requests
and their seats for ever (issue 33). `written` turns such a handler into one that writes each
answer itself: one not taken within `unread_s` (unread_stream_timeout_s) cuts the stream, with
DEADLINE_EXCEEDED, and closes the handler's generator first, which cancels the stream's
requests and frees their seats at once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from dlscale.frontends.loop import done_within
from dlscale.serving.streams import aclose

log = logging.getLogger(__name__)

StreamHandler = Callable[[AsyncIterator[Any], Any], AsyncIterator[Any]]


def written(handler: StreamHandler, unread_s: float) -> Callable[[Any, Any], Awaitable[None]]:
    """`handler` (an async generator of answers) as a coroutine handler that writes them."""

    async def write(requests: AsyncIterator[Any], context: Any) -> None:
        answers = handler(requests, context)
        unread = False
        try:
            async for answer in answers:
                # Whether gRPC took the answer in time (the client's window let it through).
                if not await done_within(context.write(answer), unread_s):
                    unread = True
                    break
        finally:
            await aclose(answers)
        if unread:
            log.warning(
                "a gRPC stream was not read for %g s: cut (unread_stream_timeout_s)", unread_s
            )
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the client did not read this stream's answers within {unread_s:g} s "
                "(unread_stream_timeout_s): the stream is cut and its requests cancelled",
            )

    return write
