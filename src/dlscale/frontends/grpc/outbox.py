"""The answers of one gRPC stream that wait for its client to read them, within a bound.

A client that sends requests and never reads their answers would otherwise make the server hold
every answer until the stream ends (issue 33: 3,000 answers of 64 KiB, +247 MB). An outbox holds
at most `size` answers; a request with one more waits in `put` until the client reads, so each
request in flight holds at most the one answer in its hands (docs/limits.md).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any


class Outbox:
    """At most `size` answers waiting to be written; `put` waits for room, `get` for an answer."""

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError(f"an outbox holds at least one answer, not {size}")
        self.size = size
        self._answers: collections.deque[Any] = collections.deque()
        self._putting = 0  # requests waiting in put, each with its answer in hand
        self._room = asyncio.Event()
        self._ready = asyncio.Event()
        self._ended = False
        #: The most answers this stream held at once, queued or in the hands of a waiting put.
        self.most_held = 0

    @property
    def queued(self) -> int:
        """Answers queued now for the writer."""
        return len(self._answers)

    @property
    def held(self) -> int:
        """Answers the server holds now for this stream: queued, or waiting to be."""
        return len(self._answers) + self._putting

    async def put(self, answer: Any) -> None:
        """Queue `answer`; while the outbox is full, wait until the writer takes one."""
        self._putting += 1
        self.most_held = max(self.most_held, self.held)
        try:
            await self.wait_room()
        finally:
            self._putting -= 1
        self._answers.append(answer)
        self._ready.set()

    def end(self) -> None:
        """No more answers will come: `get` returns None once the queued ones are taken."""
        self._ended = True
        self._ready.set()

    async def get(self) -> Any | None:
        """The oldest answer, waiting for one; None once the outbox has ended and is empty."""
        while not self._answers:
            if self._ended:
                return None
            self._ready.clear()
            await self._ready.wait()
        answer = self._answers.popleft()
        self._room.set()
        return answer

    async def wait_room(self) -> None:
        """Return once the outbox has room (the stream's reader waits here before reading on)."""
        while len(self._answers) >= self.size:
            self._room.clear()
            await self._room.wait()
