"""A Triton Python model's own readiness (`TritonPythonModel.is_ready`), asked as Triton asks it.

Triton's python backend (its README, "is_ready"): the method is optional, sync or `async def`,
and answers True or False; a check that gets no answer within five seconds says not ready; one
call runs per instance at a time, and checks that come while it runs wait for it and take its
answer (a slow `is_ready` is not called again by each probe that finds it slow).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from dlscale.backends.python.loader import UserCodeError, log_failure
from dlscale.errors import DlscaleError

log = logging.getLogger("dlscale.python")

#: How long a readiness check waits for the model's answer (Triton's python backend: 5 s).
READY_TIMEOUT_S = 5.0


class ReadinessCheck:
    """Asks `ask` (the model's is_ready, here or in its worker) at most once at a time, off the
    event loop; each check waits READY_TIMEOUT_S at most for the call under way."""

    def __init__(self, model: str, ask: Callable[[], bool]) -> None:
        self.model = model
        self._ask = ask
        self._calls = ThreadPoolExecutor(1, thread_name_prefix=f"{model}-is-ready")
        self._under_way: Future[bool] | None = None

    async def ready(self) -> bool:
        """The model's answer; False when it raised, answered other than a bool or took longer
        than READY_TIMEOUT_S (the call goes on, and the next check waits for it)."""
        if self._under_way is None or self._under_way.done():  # on the loop: no race
            self._under_way = self._calls.submit(self._ask)
        waiting = asyncio.shield(asyncio.wrap_future(self._under_way))
        try:
            return await asyncio.wait_for(waiting, READY_TIMEOUT_S)
        except TimeoutError:
            log.warning(
                "model %r: is_ready gave no answer within %g s: not ready",
                self.model, READY_TIMEOUT_S,
            )  # fmt: skip
        except UserCodeError as exc:
            log_failure(exc)
        except DlscaleError as exc:  # its worker process is gone or restarting
            log.warning("model %r: not ready: %s", self.model, exc)
        return False

    def close(self) -> None:
        """Stop taking checks (a call under way finishes in its thread)."""
        self._calls.shutdown(wait=False, cancel_futures=True)
