"""An OpenAI generation's pieces: one stream per prompt, merged as they come, as events.

The first piece of every prompt's stream is awaited before the answer's status is sent (a
refusal answers its 4xx); then the pieces of all streams are merged in the order they arrive
(`merged`), each written as a chunk of its choice (`events`) or added to the whole answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from dlscale.errors import DlscaleError, Unavailable
from dlscale.frontends.rest.openai.encode import DONE, Answer, Piece
from dlscale.frontends.rest.openai.errors import status_and_document
from dlscale.frontends.rest.responses import event
from dlscale.serving.observe.logs import log_failure
from dlscale.serving.streams import aclose
from dlscale.types import InferenceResponse

log = logging.getLogger("dlscale.http")


async def firsts(model: str, streams: list[AsyncIterator[InferenceResponse]]) -> list[Piece]:
    """Each stream's first piece, awaited together (a refusal answers the request's status)."""

    async def first(responses: AsyncIterator[InferenceResponse]) -> Piece:
        response = await anext(responses, None)
        if response is None:
            raise Unavailable(f"model {model!r} ended the generation without answering")
        return Piece.of(response)

    if len(streams) == 1:
        try:
            return [await first(streams[0])]
        except DlscaleError as exc:
            raise ModelError(model, exc) from None
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(first(s)) for s in streams]
    except* DlscaleError as failed:
        raise ModelError(model, failed.exceptions[0]) from None  # type: ignore[arg-type]
    return [t.result() for t in tasks]


async def merged(
    firsts: list[Piece], streams: list[AsyncIterator[InferenceResponse]]
) -> AsyncIterator[tuple[int, Piece]]:
    """(choice index, piece) of every stream as they come, each stream's first piece first."""
    if len(streams) == 1:
        piece: Piece | None = firsts[0]
        while piece is not None:
            yield 0, piece
            response = await anext(streams[0], None)
            piece = Piece.of(response) if response is not None else None
        return
    arrived: asyncio.Queue[tuple[int, Piece | DlscaleError | None]] = asyncio.Queue()
    for index, first in enumerate(firsts):
        arrived.put_nowait((index, first))

    async def pump(index: int) -> None:
        try:
            while (response := await anext(streams[index], None)) is not None:
                arrived.put_nowait((index, Piece.of(response)))
        except DlscaleError as exc:
            arrived.put_nowait((index, exc))
            return
        arrived.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(i)) for i in range(len(streams))]
    try:
        running = len(streams)
        while running:
            index, item = await arrived.get()
            if isinstance(item, DlscaleError):
                raise item
            if item is None:
                running -= 1
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def close_all(streams: list[AsyncIterator[InferenceResponse]]) -> None:
    for responses in streams:
        await aclose(responses)


async def events(
    reply: Answer,
    firsts: list[Piece],
    streams: list[AsyncIterator[InferenceResponse]],
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """The `data:` events of a streamed answer; closing it early closes the generations.

    The responses are read to their end, past the final one: a stream closed before its end
    counts as cancelled (its client left), one read to its end as answered.
    """
    pieces = merged(firsts, streams)
    try:
        if reply.chat:
            yield reply.chunk(None, include_usage, first=True)
        held = reply.tools.parsed  # a tool call is known at its end: one chunk, then
        async for index, piece in pieces:
            reply.add(piece, index)
            if piece.carries_news and not held:
                yield reply.chunk(piece, include_usage, index=index)
        if held:
            yield reply.held_chunk(include_usage)
        if include_usage:
            yield reply.usage_chunk()
    except DlscaleError as exc:
        log_failure("HTTP", reply.model, exc.http_status, exc.reason, f"stream: {exc}")
        yield event(status_and_document(exc, reply.model)[1])
    finally:
        await aclose(pieces)
        await close_all(streams)
    yield DONE


class ModelError(Exception):
    """An error about a named model: its 404 says "The model `x` does not exist."."""

    def __init__(self, model: str, cause: DlscaleError) -> None:
        super().__init__(str(cause))
        self.model = model
        self.cause = cause
