"""The rules of one model version's request queue, whatever waits in it.

The Batcher (requests that join batches) and the Seats (requests that wait for one of a
streaming model's sequence slots) each order what waits in their own way; what a request meets
on the way in, while it waits, and when the model closes is decided here, once: the closing
check, the priority level, the `max_queue_size` bound, the model's [qos] admission (and its
early refusal), the default timeout and its timer, the count of requests pending and the wait
for none to be left.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from dlscale.errors import DlscaleError, QueueFull, Unavailable
from dlscale.serving.observe.stats import ModelStats
from dlscale.serving.policy import BatchPolicy
from dlscale.serving.qos.admission import Admission


class RequestQueue:
    """Admission, bounds, timeouts and draining of one model version's waiting requests."""

    def __init__(
        self,
        policy: BatchPolicy,
        stats: ModelStats,
        admission: Admission | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.policy = policy
        self.stats = stats
        self.admission = admission
        self.clock = clock
        self.closing = False
        #: Why new requests are refused once closing (a dead backend names its cause).
        self.refusal: DlscaleError = Unavailable("the model is unloading and takes no new requests")
        self._idle = asyncio.Event()
        self._idle.set()

    def refuse_early(self) -> DlscaleError | None:
        """The refusal `admit` would raise now by the model's [qos] admission, or None."""
        if self.admission is None:
            return None
        return self.admission.refuse_early(self.stats.pending, self.clock())

    def admit(self, priority: int, waiting: int, waits: bool = True) -> int:
        """Take a request in; the queue level of its priority. `waiting`: requests already
        waiting; `waits`: whether this one would wait too (a bound counts only those).

        Raises Unavailable (the model is closing), InvalidInput (a priority out of range),
        QueueFull, or TooManyRequests (the [qos] limits). Once it returns, the caller owes one
        `done` when the request leaves, whatever the outcome.
        """
        if self.closing:
            raise self.refusal
        level = self.policy.level_of(priority)
        limit = self.policy.batching.max_queue_size
        if limit and waits and waiting >= limit:
            raise QueueFull(
                f"the queue is full ({waiting} requests waiting, max_queue_size {limit}); "
                "retry later"
            )
        if self.admission is not None:
            self.admission.admit(self.stats.pending, self.clock())
        if not self.stats.pending:  # the first one in: no longer idle (set again at none)
            self._idle.clear()
        self.stats.pending += 1
        return level

    def done(self) -> None:
        """A request `admit` took in has left: answered, failed, timed out or abandoned."""
        self.stats.pending -= 1
        if self.stats.pending == 0:
            self._idle.set()

    def expire(
        self, timeout_us: int, callback: Callable[..., Any], *args: Any
    ) -> asyncio.TimerHandle | None:
        """Call `callback(*args, timeout)` once the request's timeout (or the model's default)
        passes; None when neither sets one. The caller cancels the handle when it is served."""
        timeout = timeout_us or self.policy.batching.default_timeout_us
        if not timeout:
            return None
        return asyncio.get_running_loop().call_later(
            timeout / 1e6, lambda: callback(*args, timeout)
        )

    def refuse(self, error: DlscaleError) -> None:
        """Its model can serve no more: every new request is refused with `error`."""
        self.closing = True
        self.refusal = error

    async def close(self, grace_s: float | None = None) -> bool:
        """Refuse new requests; wait until every request taken in has left, at most `grace_s`
        seconds when given. Whether none is left."""
        self.closing = True
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
        except TimeoutError:
            return False
        return True
