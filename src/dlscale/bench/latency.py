"""Latency percentiles from per-query timings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

#: The percentiles every report gives (MLPerf's SingleStream metric is p90, Server's p99).
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


def percentile_name(p: float) -> str:
    """`p50`, `p99`, `p99.9`."""
    return f"p{p:g}"


def summarize(
    latencies_ns: Sequence[float] | np.ndarray,
    percentiles: Sequence[float] = PERCENTILES,
    method: Literal["higher", "linear"] = "higher",
) -> dict[str, float | None]:
    """Percentiles, mean, min and max in seconds; None values when there are no timings."""
    keys = [percentile_name(p) for p in percentiles] + ["mean", "min", "max"]
    if len(latencies_ns) == 0:
        return dict.fromkeys(keys)
    arr = np.asarray(latencies_ns, dtype=np.float64) / 1e9
    # "higher": a reported percentile is a latency some query really had, as LoadGen reports.
    values = np.percentile(arr, percentiles, method=method)
    out: dict[str, float | None] = {
        percentile_name(p): float(v) for p, v in zip(percentiles, values, strict=True)
    }
    out.update(mean=float(arr.mean()), min=float(arr.min()), max=float(arr.max()))
    return out
