"""Routing by work: each replica's weight follows the compute time it measured per row.

HAProxy picks the replica with the fewest requests in flight divided by its weight
(`balance leastconn`). With every weight equal that counts requests; with each weight made
inversely proportional to the replica's time per row, it estimates the work waiting on each
replica, so a replica three times slower (an older GPU, a smaller MIG slice, a noisy host) is
sent a third of the requests without batching, not a half (fewer with batching, below). The
times come from each replica's own statistics (the protocol's `/v2/models/stats`: rows inferred
and their compute time, summed over models), read as differences over the last interval, so
that old history does not hide a change.

With batching the ratio of speeds is not enough: a request queued on the fastest replica waits
about one batch time per `largest_batch` requests ahead of it, while one sent to an idle slower
replica takes that replica's whole batch time. Leastconn sends to the slower one once the fast
one holds `weight ratio - 1` requests; the two waits are equal at `largest_batch * (slower - 1)`
requests, so the weight ratio is `largest_batch * (slower - 1) + 1` (the speed ratio itself
without batching). BENCHMARKS.md ("Routing by work") measured it: 1x and 3x replicas batching
4 rows, p99 about 300 ms with a third of the weight, about 190-270 ms with a ninth.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

#: HAProxy's weights run from 1 to 256; the fastest replica gets the most.
MAX_WEIGHT = 256
#: Seconds between two readings of a fleet's replicas (by its supervisor or router actor).
WEIGH_S = 2.0
#: Fewer rows than this in an interval say too little of a replica's speed: its weight stays.
MIN_ROWS = 8


@dataclass(frozen=True)
class Work:
    """What a replica has computed since it started: rows, and their compute time."""

    rows: int
    compute_ns: int
    #: The most rows it ran in one batch (1 without batching): the requests one batch clears.
    largest_batch: int = 1


def read_work(
    host: str, http_port: int, headers: Mapping[str, str] | None = None, timeout_s: float = 2.0
) -> Work:
    """A replica's totals from its statistics endpoint (every model, every version)."""
    url = f"http://{host}:{http_port}/v2/models/stats"
    request = urllib.request.Request(url, headers=dict(headers or {}))
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:
        stats = json.load(answer)
    rows = compute = 0
    largest = 1
    for model in stats.get("model_stats", []):
        rows += int(model.get("inference_count", 0))
        compute += int(model.get("inference_stats", {}).get("compute_infer", {}).get("ns", 0))
        sizes = [int(b.get("batch_size", 1)) for b in model.get("batch_stats", [])]
        largest = max(largest, *sizes) if sizes else largest
    return Work(rows, compute, largest)


class Weigher:
    """Turns successive readings of each replica's Work into HAProxy weights."""

    def __init__(self) -> None:
        self._last: dict[str, Work] = {}
        #: Nanoseconds of compute per row, by replica, from its last interval with enough rows.
        self.ns_per_row: dict[str, float] = {}

    def weights(self, readings: Mapping[str, Work]) -> dict[str, int]:
        """Each replica's weight after these readings; replicas not read are forgotten.

        A replica not yet measured gets the highest weight, so that it is sent enough requests
        to be measured.
        """
        for key in [k for k in self._last if k not in readings]:
            del self._last[key]
            self.ns_per_row.pop(key, None)
        for key, work in readings.items():
            last = self._last.get(key)
            if last is None or work.rows < last.rows:  # new, or restarted: counts begin again
                self._last[key] = work
                continue
            rows = work.rows - last.rows
            if rows >= MIN_ROWS:  # else the interval grows until it has enough rows
                self.ns_per_row[key] = max(1.0, (work.compute_ns - last.compute_ns) / rows)
                self._last[key] = work
        fastest = min(self.ns_per_row, key=self.ns_per_row.__getitem__, default=None)
        if fastest is None:
            return dict.fromkeys(readings, MAX_WEIGHT)
        batch = readings[fastest].largest_batch
        return {
            key: MAX_WEIGHT
            if key not in self.ns_per_row
            else _weight(self.ns_per_row[key] / self.ns_per_row[fastest], batch)
            for key in readings
        }


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


def _weight(slower: float, batch: int) -> int:
    """The weight of a replica `slower` times the fastest's time, the fastest batching `batch`
    rows at most (the module's docstring derives it)."""
    return max(1, round(MAX_WEIGHT / (max(1, batch) * (slower - 1.0) + 1.0)))
