"""A replica's Prometheus metrics copied into Ray's metrics export, under dlscale's names.

The replica keeps the serving core's collector (`serving.metrics.collectors.InferenceCollector`,
Triton's names); every few seconds each of its samples is set on a Ray Serve gauge of the same name
and labels, to which Ray adds the deployment, replica and application. Ray's exporter puts its
namespace in front (`ray_nv_inference_count`), and exports every value as a gauge: counters stay
cumulative (rate() works on them), histograms arrive as their `_bucket{le}`, `_sum` and `_count`
series (histogram_quantile() works on them). docs/scale.md shows how to query them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any, cast

from prometheus_client.registry import Collector
from ray.serve.metrics import Gauge

log = logging.getLogger("dlscale.scale")


def samples(collector: Collector) -> Iterator[tuple[str, str, dict[str, str], float]]:
    """(sample name, its family's help, labels, value) of every sample the collector gives now."""
    for family in collector.collect():
        for sample in family.samples:
            yield sample.name, family.documentation, dict(sample.labels), float(sample.value)


class RayMetricsMirror:
    """Sets one Ray Serve gauge per sample name from a Prometheus collector, periodically."""

    def __init__(self, collector: Collector, interval_s: float = 5.0) -> None:
        if interval_s <= 0:
            raise ValueError(f"metrics interval must be positive, got {interval_s}")
        self.collector = collector
        self.interval_s = interval_s
        self._gauges: dict[str, Gauge] = {}

    def push(self) -> int:
        """Copy every sample once; returns how many were set."""
        count = 0
        for name, help_text, labels, value in samples(self.collector):
            gauge = self._gauges.get(name)
            if gauge is None:
                # Ray annotates tag_keys as a 1-tuple; it takes any tuple of names.
                keys = cast(Any, tuple(sorted(labels)))
                gauge = Gauge(name, description=help_text, tag_keys=keys)
                self._gauges[name] = gauge
            gauge.set(value, tags=labels)
            count += 1
        return count

    async def run(self) -> None:
        """Push every `interval_s` until cancelled; a failed push is logged, not fatal."""
        while True:
            try:
                self.push()
            except Exception:  # metrics must never take the replica down
                log.exception("copying metrics to Ray failed")
            await asyncio.sleep(self.interval_s)
