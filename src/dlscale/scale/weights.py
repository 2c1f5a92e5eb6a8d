"""Routing by work: each replica's weight follows the compute time it measured per row.

HAProxy picks the replica with the fewest requests in flight divided by its weight
(`balance leastconn`). With every weight equal that counts requests; with each weight made
inversely proportional to the replica's time per row, it estimates the work waiting on each
replica, so a replica three times slower (an older GPU, a smaller MIG slice, a noisy host) is
sent a third of the requests without batching, not a half (fewer with batching, below). The
times come from each replica's own statistics (the protocol's `/v2/models/stats`: rows inferred
and their compute time, summed over models), read as differences over the last interval, so
that old history does not hide a change. The same times give each replica's batch clock
(`Weigher.clocks`), by which HAProxy places requests where they finish first once every replica
is measured (scale/finish.py): the weights route until then.

The queueing argument, for a replica `r` times slower than the fastest, which batches up to `B`
rows per batch time `t` (BENCHMARKS.md, "Routing by work", checks it against a simulation and
the real fleet):
- HAProxy's leastconn sends a request to an idle replica before any busy one, whatever the
  weights (its src/lb_fwlc.c: "servers with no connection are always picked first"; the key of
  an idle server is 0). So an idle slower replica always takes the next request, and its weight
  decides only when it takes a second one: with one in flight, once the fastest holds `f` with
  `(f + 1) / W > 2 / w` (`W`, `w` the two weights).
- Light load, short queues: a request joining the fastest replica holding `f` waits at most
  about `t * (f / B + 1)`; one joining the busy slower replica waits at most two of its batches,
  `2 r t` (the rest of the one it computes, then its own). Leastconn compares `f + 1` with
  `2 W / w`: a weight ratio of `B (r - 1) + 1` makes the two worst waits about equal there
  (`f ~ 2 B (r - 1) + 1`). Without batching (`B` 1) that is the speed ratio itself.
- Heavy load, long queues on both: by Little's law a replica holding `n` waits about
  `n t_i / B`, so equal waits need `n` in proportion to speed: the weight ratio is the speed
  ratio `r`. The light-load weight would then keep the slower replica fed one row per batch
  (at a fraction of its capacity) while the fastest's queue grows: at 85% of the pair's
  capacity it doubled the p99 of the speed ratio's (BENCHMARKS.md).
- So the weight moves from the first to the second with the load, read as the rate the fleet
  carries over its light-load capacity: the fastest replica's whole capacity (`B / t`) and one
  row per batch of each slower one. Below LIGHT of it the light-load weight, above HEAVY the
  speed ratio, in between geometrically.
"""

from __future__ import annotations

import json
import math
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

#: HAProxy's weights run from 1 to 256; the fastest replica gets the most.
MAX_WEIGHT = 256
#: Seconds between two readings of a fleet's replicas (by its supervisor or router actor).
WEIGH_S = 2.0
#: Fewer rows than this in an interval say too little of a replica's speed: its weight stays.
MIN_ROWS = 8
#: The fleet's load, over its light-load capacity, below which the light-load weight holds
#: and above which the speed ratio does (the module's docstring).
LIGHT, HEAVY = 0.85, 1.0


@dataclass(frozen=True)
class Work:
    """What a replica has computed since it started: rows, and their compute time."""

    rows: int
    compute_ns: int
    #: The most rows it ran in one batch (1 without batching): the requests one batch clears.
    largest_batch: int = 1
    #: When it was read (time.monotonic()): rows over time is the rate the replica carries.
    at: float = 0.0


def read_work(host: str, http_port: int, headers: Mapping[str, str] | None = None) -> Work:
    """A replica's totals from its statistics endpoint (every model, every version), within 2 s."""
    url = f"http://{host}:{http_port}/v2/models/stats"
    request = urllib.request.Request(url, headers=dict(headers or {}))
    with urllib.request.urlopen(request, timeout=2.0) as answer:
        stats = json.load(answer)
    rows = compute = 0
    largest = 1
    for model in stats.get("model_stats", []):
        rows += int(model.get("inference_count", 0))
        compute += int(model.get("inference_stats", {}).get("compute_infer", {}).get("ns", 0))
        sizes = [int(b.get("batch_size", 1)) for b in model.get("batch_stats", [])]
        largest = max(largest, *sizes) if sizes else largest
    return Work(rows, compute, largest, time.monotonic())


class Weigher:
    """Turns successive readings of each replica's Work into HAProxy weights."""

    def __init__(self, follow_load: bool = True) -> None:
        #: False: the light-load weight whatever the load (the rule before the load counted).
        self.follow_load = follow_load
        self._last: dict[str, Work] = {}
        #: Nanoseconds of compute per row, by replica, from its last interval with enough rows.
        self.ns_per_row: dict[str, float] = {}
        #: Rows per second, by replica, over that same interval.
        self.rows_per_s: dict[str, float] = {}
        #: The fleet's last load over its light-load capacity (0 until measured).
        self.load = 0.0
        #: The most rows one batch of any replica held: the batch size of the fleet's model.
        self.batch = 1

    def weights(self, readings: Mapping[str, Work]) -> dict[str, int]:
        """Each replica's weight after these readings; replicas not read are forgotten.

        A replica not yet measured gets the highest weight, so that it is sent enough requests
        to be measured.
        """
        for key in [k for k in self._last if k not in readings]:
            del self._last[key]
            self.ns_per_row.pop(key, None)
            self.rows_per_s.pop(key, None)
        for key, work in readings.items():
            self._measure(key, work)
        fastest = min(self.ns_per_row, key=self.ns_per_row.__getitem__, default=None)
        if fastest is None:
            return dict.fromkeys(readings, MAX_WEIGHT)
        batch = readings[fastest].largest_batch
        self.batch = max(self.batch, *(w.largest_batch for w in readings.values()))
        self.load = self._load(fastest, batch)
        heavy = heaviness(self.load) if self.follow_load else 0.0
        return {
            key: MAX_WEIGHT
            if key not in self.ns_per_row
            else weight_of(self.ns_per_row[key] / self.ns_per_row[fastest], batch, heavy)
            for key in readings
        }

    def clocks(self) -> dict[str, tuple[float, int]]:
        """Each measured replica's batch clock for finish-first routing (scale/finish.py):
        seconds per batch, and rows per batch.

        A replica's statistics count each request with the compute time of the batch it was
        in, so its time per row is its time per batch. The rows per batch are the fleet's
        largest batch seen: a replica that was sent one request at a time never showed its own,
        and the replicas serve the same models.
        """
        return {key: (ns / 1e9, self.batch) for key, ns in self.ns_per_row.items()}

    def _measure(self, key: str, work: Work) -> None:
        """The replica's time per row and rate over its interval, once it has enough rows."""
        last = self._last.get(key)
        if last is None or work.rows < last.rows:  # new, or restarted: counts begin again
            self._last[key] = work
            return
        rows = work.rows - last.rows
        if rows < MIN_ROWS:  # the interval grows until it has enough rows
            return
        self.ns_per_row[key] = max(1.0, (work.compute_ns - last.compute_ns) / rows)
        if work.at > last.at:
            self.rows_per_s[key] = rows / (work.at - last.at)
        self._last[key] = work

    def _load(self, fastest: str, batch: int) -> float:
        """The rows per second the fleet carries over its light-load capacity: the fastest
        replica's `batch` rows per batch time, one row per batch time of each slower one."""
        capacity = sum(
            1e9 / ns * (max(1, batch) if key == fastest else 1)
            for key, ns in self.ns_per_row.items()
        )
        return sum(self.rows_per_s.values()) / capacity


def read_each(
    members: Mapping[str, tuple[str, int]], headers: Mapping[str, str] | None = None
) -> dict[str, Work]:
    """Each member's Work, by key, from (host, http_port); one that does not answer (dying, or
    busy past the timeout) is left out, and its weight stays as it was."""
    readings = {}
    for key, (host, port) in members.items():
        try:
            readings[key] = read_work(host, port, headers)
        except (OSError, ValueError):
            continue
    return readings


def heaviness(load: float) -> float:
    """How far the load is from light (0) to heavy (1): LIGHT and HEAVY of the light-load
    capacity."""
    return min(1.0, max(0.0, (load - LIGHT) / (HEAVY - LIGHT)))


def weight_of(slower: float, batch: int, heavy: float = 0.0) -> int:
    """The weight of a replica `slower` times the fastest's time, the fastest batching `batch`
    rows at most: the light-load ratio `batch * (slower - 1) + 1`, moved towards the speed ratio
    `slower` as `heavy` goes from 0 to 1 (the module's docstring derives both)."""
    light = max(1, batch) * (slower - 1.0) + 1.0
    ratio = math.exp((1.0 - heavy) * math.log(light) + heavy * math.log(max(1.0, slower)))
    return max(1, round(MAX_WEIGHT / ratio))
