"""Find-peak: the highest Server rate whose p99 stays under the bound.

The search runs whole LoadGen Server tests, each judged by LoadGen (VALID: p99 under the
bound, enough queries, early stopping satisfied) and by the bench (no failed requests):

1. Ramp: start from the warm-up's estimate and double the rate while runs pass.
2. Bisect between the highest passing and the lowest failing rate until they are within
   `precision` of each other (or `max_runs` is spent).

Every run is kept as a point of the sweep (rate, p99, throughput, verdict) for the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Runs a Server test at a rate and returns (passed, the run's result).
RunAt = Callable[[float], tuple[bool, Any]]


@dataclass
class PeakSearch:
    """The search's outcome: the best passing rate (None if none passed) and every run."""

    peak_qps: float | None
    best: Any | None
    runs: list[tuple[float, bool, Any]]


def find_peak(
    run_at: RunAt,
    start_qps: float,
    precision: float = 0.05,
    max_runs: int = 12,
    floor_qps: float = 1.0,
) -> PeakSearch:
    """Ramp then bisect; `run_at` is called once per tried rate, lowest first while ramping."""
    runs: list[tuple[float, bool, Any]] = []
    best: tuple[float, Any] | None = None
    failed_at: float | None = None
    qps = max(start_qps, floor_qps)

    def attempt(rate: float) -> bool:
        nonlocal best
        passed, result = run_at(rate)
        runs.append((rate, passed, result))
        if passed and (best is None or rate > best[0]):
            best = (rate, result)
        return passed

    # Ramp: up while passing; when the first rate already fails, down until one passes.
    if attempt(qps):
        while len(runs) < max_runs:
            qps *= 2
            if not attempt(qps):
                failed_at = qps
                break
    else:
        failed_at = qps
        while len(runs) < max_runs and qps / 2 >= floor_qps:
            qps /= 2
            if attempt(qps):
                break
            failed_at = qps
    # Bisect between the best pass and the lowest failure.
    while best is not None and failed_at is not None and len(runs) < max_runs:
        low = best[0]
        if (failed_at - low) / low <= precision:
            break
        mid = (low + failed_at) / 2
        if not attempt(mid):
            failed_at = mid
    peak_qps, result = best or (None, None)
    return PeakSearch(peak_qps, result, runs)
