"""A replica's autoscaler figures, read from its server in the background.

Ray Serve asks each replica for its figures (`record_autoscaling_stats`), gives up on an answer
after 10 s (RAY_SERVE_RECORD_AUTOSCALING_STATS_TIMEOUT_S) and keeps what it got for its look-back
window only (LOOK_BACK_S, 5 s). Read from the server on Ray's call, a server slow to answer left
the window empty: a CI run beside two CPU burners timed out four times in a minute, both
replicas' figures were missing at once, and the rule read the fleet as idle and scaled it down
under load. Here a task reads the server every READ_S and the replica answers Ray at once with
the last figures read. Figures older than KEPT_S are withheld: a replica whose server has stopped
answering says nothing rather than a load long past. Reading stops once Ray has not asked for
KEPT_S (a fleet redeployed fixed keeps its replicas, and Ray stops asking).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from dlscale.scale import autoscale

log = logging.getLogger("dlscale.scale")

#: Seconds between two readings: Ray Serve's metrics interval (autoscale.autoscaling_config).
READ_S = 1.0
#: Seconds one reading may take before it is given up (the next one tries again).
READ_TIMEOUT_S = 20.0
#: Seconds the last figures stay reported when no reading succeeds: a few slow readings.
KEPT_S = 30.0


class FiguresReader:
    """A server's figures over the interval between its last two readings (autoscale.figures)."""

    def __init__(
        self,
        stats_url: str,
        metrics_url: str,
        repository: Path,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stats_url, self.metrics_url = stats_url, metrics_url
        self.repository = repository
        self.clock = clock
        # One client for the replica's life: a client per reading built its TLS context anew.
        self._client = httpx.AsyncClient(timeout=READ_TIMEOUT_S)
        self._reading: autoscale.Reading | None = None
        self._figures: dict[str, float] = {}
        self._asked = clock()

    async def read_once(self) -> None:
        """Read the server's counters; the figures cover the time since the last reading."""
        stats = (await self._client.get(self.stats_url)).raise_for_status()
        page = (await self._client.get(self.metrics_url)).raise_for_status()
        now = autoscale.read(self.clock(), stats.json(), page.text)
        before, self._reading = self._reading or now, now
        counts = await asyncio.to_thread(autoscale.instances, self.repository, list(now.models))
        self._figures = autoscale.figures(before, now, counts)

    async def run(self, stop: asyncio.Event) -> None:
        """Read every READ_S until `stop` is set or nobody asked for KEPT_S; a failed reading
        is logged and tried again."""
        try:
            while not stop.is_set() and self.clock() - self._asked <= KEPT_S:
                try:
                    await self.read_once()
                except Exception as exc:  # the server busy or restarting: the next reading
                    log.info("autoscaler figures not read (%s)", exc or type(exc).__name__)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), READ_S)
        finally:
            await self._client.aclose()

    def latest(self) -> dict[str, float]:
        """The last figures read, or none when the last reading is older than KEPT_S."""
        self._asked = self.clock()
        if self._reading is None or self.clock() - self._reading.at > KEPT_S:
            return {}
        return dict(self._figures)
