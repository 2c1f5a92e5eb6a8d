"""Load on demand (--model-control on-demand): a request for a model that is not loaded loads it.

Requests for the same cold model wait for one load, each within its own timeout; requests for
resident models never wait here. Loads run a few at a time (`parallel`), first come first
served, and only so many cold models may wait for theirs (`waiting`): beyond, a request is
refused at once (503), so that a flood of requests naming cold models cannot queue without bound
nor evict every model. A load whose requests have all gone (timed out, or its call was cancelled)
before its turn is dropped: it neither delays the loads behind it nor counts against `waiting`.
A model's waiting requests count against its [qos] max_in_flight, as its queued ones do.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from dlscale.errors import DlscaleError, TimedOut, TooManyRequests
from dlscale.serving.manager import ModelManager
from dlscale.serving.memory.ledger import PARALLEL
from dlscale.serving.memory.policy import MemoryFull
from dlscale.serving.served import ModelState
from dlscale.serving.versions import unknown_model

log = logging.getLogger("dlscale.models")

#: Loads on demand that run at once (`--parallel-loads`, and at least two: one may read its
#: config and files while another loads; how many share a device is the memory ledger's rule,
#: serving/memory/turns.py).
PARALLEL_LOADS = max(2, PARALLEL)
#: Cold models that may wait for their load at once; a request for one more is refused (503).
WAITING_LOADS = 8


class OnDemand:
    """Loads the models requests name when they are in the repository and not loaded."""

    def __init__(
        self, manager: ModelManager, parallel: int = PARALLEL_LOADS, waiting: int = WAITING_LOADS
    ) -> None:
        self.manager = manager
        self.waiting = waiting
        self._gate = asyncio.Semaphore(parallel)
        self._loads: dict[str, asyncio.Task[None]] = {}
        self._waiters: Counter[str] = Counter()
        self._started: set[str] = set()  # loads past the gate: they run to their end
        #: Loads started by requests, requests refused because too many were waiting, and loads
        #: dropped before their turn because no request waited for them any more.
        self.loads = 0
        self.refused = 0
        self.dropped = 0

    def loading(self) -> list[str]:
        """The cold models whose load requests wait for now."""
        return sorted(self._loads)

    async def resident(self, name: str, timeout_us: int = 0) -> None:
        """Return once `name` is READY, loading it if it is a repository model not loaded; a
        model the repository lacks returns at once (the request is answered NotFound), or is
        refused NotFound here when it was loaded once and its folder has gone since."""
        if self.manager.state(name) is ModelState.READY:
            return
        if name not in self.manager.repository.names():
            if self.manager.state(name) is ModelState.UNAVAILABLE:
                # Unloaded or evicted, and its folder is gone: missing, not "not ready".
                names, ready = self.manager.repository.names, self.manager.ready_names()
                raise unknown_model(name, names, ready)
            return
        self._admit(name)
        task = self._loads.get(name) or self._start(name)
        self._waiters[name] += 1
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout_us / 1e6 if timeout_us else None)
        except TimeoutError:
            raise TimedOut(
                f"model {name!r} was still loading when the request's timeout of {timeout_us} us "
                "expired"
            ) from None
        finally:
            self._waiters[name] -= 1
            if not self._waiters[name]:
                del self._waiters[name]
                self._drop(name, task)

    def _drop(self, name: str, task: asyncio.Task[None]) -> None:
        """The last request for `name` has gone: a load still waiting for its turn is dropped,
        so that the loads behind it and the requests for other cold models do not wait for a
        model nobody asks for (a load past the gate runs to its end: a model half loaded would
        be left behind)."""
        if name in self._started or task.done() or self._loads.get(name) is not task:
            return
        task.cancel()
        del self._loads[name]  # at once: the bound on waiting loads no longer counts it
        self.dropped += 1
        log.info("model %s: load on demand dropped, no request waits for it any more", name)

    def _admit(self, name: str) -> None:
        """Refuse a request that would wait beyond the bounds: cold models, or its [qos]."""
        if name not in self._loads and len(self._loads) >= self.waiting:
            self.refused += 1
            raise MemoryFull(
                f"model {name!r} is not loaded and {len(self._loads)} other models are waiting "
                f"to load (the most at once is {self.waiting}); retry later"
            )
        try:
            qos = self.manager.repository.config(name).qos
        except DlscaleError:
            return  # its load says why
        if qos is not None and qos.max_in_flight and self._waiters[name] >= qos.max_in_flight:
            raise TooManyRequests(
                f"model {name!r} is loading and {self._waiters[name]} requests already wait for "
                f"it: its [qos] max_in_flight is {qos.max_in_flight}"
            )

    def _start(self, name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._load(name))
        self._loads[name] = task
        task.add_done_callback(lambda t: self._done(name, t))
        return task

    def _done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._loads.get(name) is task:  # not a later load of the name, after a drop
            del self._loads[name]
        if not task.cancelled() and task.exception() is not None:
            log.warning("model %s: load on demand failed: %s", name, task.exception())

    async def _load(self, name: str) -> None:
        async with self._gate:
            if self.manager.state(name) is ModelState.READY:
                return  # loaded meanwhile (by the API, or a pipeline that uses it)
            self.loads += 1
            self._started.add(name)
            try:
                await self.manager.load(name)
            finally:
                self._started.discard(name)
