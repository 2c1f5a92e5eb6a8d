"""Python models that stream: which ones do, and their responses from user threads to the loop.

A Triton model streams when its config.pbtxt says `model_transaction_policy { decoupled: true }`
(or config.toml's [backend_options] `decoupled = true`): `execute` gets each request with a
response sender and returns None. A dlscale `Model` streams when its class defines `stream`, a
generator of output dicts. Both are read from the files, without running user code. User code
runs in a thread of the model's own; each response crosses to the event loop through the
request's `Channel`, and closing the stream (the client left) sets `cancelled`, which the model
sees (`request.is_cancelled()`, or its generator closed at its next yield).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from dlscale.backends.base import StreamPart
from dlscale.backends.python.loader import NATIVE_CLASS, Api
from dlscale.backends.python.source import defines_method
from dlscale.errors import BackendError, ConfigError, DlscaleError

#: The method of a dlscale `Model` that makes it stream.
STREAM_METHOD = "stream"
#: Responses of one stream waiting for the event loop, at most: a model that answers faster than
#: its client reads waits in `send` (in its own thread) instead of piling answers up in memory
#: until the unread-stream bound cuts the stream (issue 33).
MAX_WAITING = 64
#: How often a sender waiting for room looks whether its stream was closed meanwhile.
_CHECK_S = 0.1


def streams(path: Path, api: Api, extra: Mapping[str, Any]) -> bool:
    """Whether the model.py at `path` answers with streams (see the module's docstring): a
    native model that defines `stream`, a Triton model whose config says it is decoupled
    (config.pbtxt's `model_transaction_policy`, read into `backend_options.decoupled`)."""
    if api == "native":
        return defines_method(path, NATIVE_CLASS, STREAM_METHOD)
    flag = extra.get("decoupled", False)
    if not isinstance(flag, bool):
        raise ConfigError(f"field 'backend_options.decoupled': expected true or false, {flag!r}")
    return flag


class Channel:
    """One request's responses, sent from user threads, read on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()  # made on the loop, by `relay`
        #: Each response, and whether it holds one of the MAX_WAITING places (`taken` frees it).
        self.queue: asyncio.Queue[tuple[StreamPart | DlscaleError, bool]] = asyncio.Queue()
        #: Set when the stream is closed early (the client left, or its deadline passed).
        self.cancelled = threading.Event()
        self.ended = False
        self._lock = threading.Lock()
        self._room = threading.Semaphore(MAX_WAITING)

    def send(self, item: StreamPart | DlscaleError) -> None:
        """Pass one response (or the error that ends the stream) to the loop; wait while
        MAX_WAITING responses wait there already, until the loop takes one or the stream ends."""
        with self._lock:
            if self.ended:
                raise BackendError("the stream already ended: its final response was sent")
            self.ended = isinstance(item, DlscaleError) or item.final
        held = threading.get_ident() != self._loop_thread  # the loop itself never waits here
        while held and not self._room.acquire(timeout=_CHECK_S):
            if self.cancelled.is_set():
                return  # nobody reads this stream any more
        with contextlib.suppress(RuntimeError):  # the loop closed: the server is gone
            self._loop.call_soon_threadsafe(self.queue.put_nowait, (item, held))

    async def take(self) -> StreamPart | DlscaleError:
        """The next response, on the loop; a sender waiting for its place may go on."""
        item, held = await self.queue.get()
        if held:
            self._room.release()
        return item


async def relay(executor: Executor, run: Callable[[Channel], None]) -> AsyncIterator[StreamPart]:
    """Run `run(channel)` in `executor`, yielding what it sends until the final response."""
    loop = asyncio.get_running_loop()
    channel = Channel(loop)
    loop.run_in_executor(executor, _guarded, run, channel)
    try:
        while True:
            item = await channel.take()
            if isinstance(item, DlscaleError):
                raise item
            yield item
            if item.final:
                return
    finally:
        channel.cancelled.set()


def _guarded(run: Callable[[Channel], None], channel: Channel) -> None:
    """`run`, whose failure (user code raised) ends the stream with its error."""
    try:
        run(channel)
    except DlscaleError as exc:
        if not channel.ended:
            channel.send(exc)
    except Exception as exc:  # the runners wrap user code: anything else is a bug of ours
        if not channel.ended:
            channel.send(BackendError(f"the stream failed: {exc!r}"))
