"""The fleet during a replay: its replica count and each replica's answers, sampled each second.

From `--fleet-metrics URL` (the fleet's metrics port): the replicas serving are those of the
router's view (`/dlscale/fleet`: ready and not drained or down in HAProxy) and, for a fleet
without that view (`--device-workers`), those with samples on the metrics page; each replica's
answers so far are its successful requests of the replayed models (bench/fleet_load.py). A
thread of its own, so a busy event loop never delays the samples.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import httpx

from dlscale.bench import fleet_load
from dlscale.bench.goodput import FleetSample
from dlscale.errors import BenchError

#: HAProxy's states of a replica that takes no new requests.
_OUT = ("MAINT", "DRAIN", "DOWN", "NOLB")


def replicas_in_view(view: object) -> int | None:
    """Replicas serving in the router's `/dlscale/fleet` answer (None: not such an answer)."""
    if not isinstance(view, dict) or not isinstance(view.get("replicas"), list):
        return None
    return sum(
        1
        for r in view["replicas"]
        if isinstance(r, dict)
        and r.get("ready")
        and not str(r.get("router_state", "")).upper().startswith(_OUT)
    )


class FleetWatch:
    """Samples the fleet every second from `start` (time.monotonic) until stopped."""

    def __init__(self, url: str, models: Sequence[str], start: float):
        self.base = url.rstrip("/").removesuffix("/metrics")
        self.models = list(models)
        self.start = start
        self.samples: list[FleetSample] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-watch", daemon=True)

    def sample(self) -> FleetSample:
        """The fleet now; BenchError when its metrics page cannot be read."""
        at = time.monotonic() - self.start
        answered: dict[str, float] = {}
        for model in self.models:
            for replica, counts in fleet_load.snapshot(self.base, model).items():
                answered[replica] = answered.get(replica, 0.0) + counts["requests"]
        return FleetSample(at, self._count(answered), answered)

    def _count(self, answered: dict[str, float]) -> int:
        try:
            reply = httpx.get(f"{self.base}/dlscale/fleet", timeout=10)
            counted = replicas_in_view(reply.json()) if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            counted = None
        return len(answered) if counted is None else counted

    def __enter__(self) -> FleetWatch:
        self.samples.append(self.sample())  # the fleet as the load begins; errors stop here
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self._take()

    def _take(self) -> None:
        try:
            self.samples.append(self.sample())
        except BenchError:  # a page missed is a gap in the step function, not the end
            self.failures += 1
