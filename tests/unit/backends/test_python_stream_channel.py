"""A Python model that answers faster than its stream is read waits for room (issue 33).

A decoupled model's responses cross from its thread to the event loop through a `Channel`.
Before, they piled up there without bound while the client did not read (until the unread-stream
bound cut the stream): now at most MAX_WAITING wait, the model's thread waits in `send`, and a
stream closed meanwhile lets it go. Real threads, a real event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from dlscale.backends.base import StreamPart
from dlscale.backends.python.streaming import MAX_WAITING, Channel

#: How long to watch a sender that should be waiting (a bound, not a speed: a sender that does
#: not wait gets far past MAX_WAITING in a fraction of this).
WATCH_S = 0.5
PATIENCE_S = 30.0


def _part(i: int) -> StreamPart:
    return StreamPart({"OUT": np.full(4, i, np.int32)})


async def _until(condition: object) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the sender never got there"
        await asyncio.sleep(0.01)


async def test_a_sender_waits_while_the_loop_holds_max_waiting_responses() -> None:
    channel = Channel(asyncio.get_running_loop())
    sent = []

    def model() -> None:  # as a model's thread answers: many responses, as fast as it can
        for i in range(10 * MAX_WAITING):
            channel.send(_part(i))
            sent.append(i)

    thread = threading.Thread(target=model, daemon=True)
    thread.start()
    await _until(lambda: len(sent) == MAX_WAITING)
    await asyncio.sleep(WATCH_S)
    assert len(sent) == MAX_WAITING  # nobody took one: the sender waits
    first = await channel.take()
    assert isinstance(first, StreamPart) and int(first.outputs["OUT"][0]) == 0
    await _until(lambda: len(sent) == MAX_WAITING + 1)  # one taken, one more sent
    taken = [first]
    while len(taken) < 10 * MAX_WAITING:  # a reader that keeps up gets every response, in order
        part = await channel.take()
        assert isinstance(part, StreamPart)
        taken.append(part)
    assert [int(p.outputs["OUT"][0]) for p in taken] == list(range(10 * MAX_WAITING))
    thread.join(PATIENCE_S)
    assert not thread.is_alive()


async def test_a_closed_stream_lets_its_waiting_sender_go() -> None:
    channel = Channel(asyncio.get_running_loop())
    done = threading.Event()

    def model() -> None:
        for i in range(MAX_WAITING + 1):  # the last one finds no room
            channel.send(_part(i))
        done.set()

    threading.Thread(target=model, daemon=True).start()
    await _until(lambda: channel.queue.qsize() == MAX_WAITING)
    assert not done.is_set()
    channel.cancelled.set()  # the client left: relay's close sets it
    await _until(done.is_set)


async def test_the_event_loop_never_waits_in_send() -> None:
    channel = Channel(asyncio.get_running_loop())
    for i in range(MAX_WAITING + 5):  # from the loop's own thread: no room is waited for
        channel.send(_part(i))
    await asyncio.sleep(0)
    assert channel.queue.qsize() == MAX_WAITING + 5
