"""Loads' turns on one device: a few side by side whose sizes are known, or one alone.

A load whose size has never been measured runs alone on its devices, so that the growth read
around it is its own; a load whose size is known from an earlier load of its file reserves that
size in the ledger and may run beside up to `width - 1` others. Turns are taken first come,
first served: a load waiting to run alone is not passed by later ones, so it cannot starve.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class Turns:
    """Who is loading on one device: up to `width` loads at once, or one alone."""

    def __init__(self, width: int = 1) -> None:
        if width < 1:
            raise ValueError(f"loads at once on a device: 1 or more, not {width}")
        self.width = width
        self.running = 0
        #: Loads that entered since this object was made: a load alone from its start to its
        #: end saw the same count at both (nothing ran beside it).
        self.entered = 0
        #: The most loads that ran at once.
        self.most = 0
        self._alone = False
        self._queue: deque[tuple[bool, asyncio.Future[None]]] = deque()

    def idle(self) -> bool:
        """Nothing loading or waiting to."""
        return not self.running and not self._queue

    async def enter(self, alone: bool) -> None:
        """Wait for this load's turn: alone, or beside other loads of known size."""
        if not self._queue and self._fits(alone):
            self._take(alone)
            return
        turn = asyncio.get_running_loop().create_future()
        self._queue.append((alone, turn))
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.leave(alone)  # given the turn as it was cancelled: hand it on
            else:
                self._queue.remove((alone, turn))
                self._wake()  # it may have stood in front of loads that fit now
            raise

    def leave(self, alone: bool) -> None:
        """This load is done: the next ones in line take their turns."""
        self.running -= 1
        if alone:
            self._alone = False
        self._wake()

    def _fits(self, alone: bool) -> bool:
        return not self.running if alone else not self._alone and self.running < self.width

    def _take(self, alone: bool) -> None:
        self.running += 1
        self.entered += 1
        self.most = max(self.most, self.running)
        self._alone = alone

    def _wake(self) -> None:
        while self._queue and self._fits(self._queue[0][0]):
            alone, turn = self._queue.popleft()
            self._take(alone)
            turn.set_result(None)


@contextlib.asynccontextmanager
async def taking_turns(turns: list[Turns], alone: bool) -> AsyncIterator[None]:
    """This load's turn on each of its devices, taken in name order, so two loads never
    wait for each other's."""
    taken: list[Turns] = []
    try:
        for t in turns:
            await t.enter(alone)
            taken.append(t)
        yield
    finally:
        for t in taken:
            t.leave(alone)
