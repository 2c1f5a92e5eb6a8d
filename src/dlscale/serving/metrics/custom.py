"""The custom metrics Python models define (pb_utils.MetricFamily), as Prometheus families.

The families live in the python backend's store (backends/python/custom_metrics.py), which
worker processes feed; a scrape reads a copy. Counters keep the name the model gave (no
`_total`), as Triton exports them.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from dlscale.backends.python import custom_metrics as custom
from dlscale.serving.observe.stats import Histogram


class CustomCollector(Collector):
    """Reads the models' custom families at scrape time."""

    def __init__(self, store: custom.MetricStore = custom.STORE) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        for family in self.store.snapshot():
            if family.series:
                yield _family(family)


def _family(family: custom.FamilyState) -> Metric:
    metric = Metric(family.name, family.description, family.kind)
    for labels, state in family.series.items():
        if family.kind == custom.HISTOGRAM:
            _histogram(metric, dict(labels), state)
        else:
            metric.add_sample(family.name, dict(labels), state.value)
    return metric


def _histogram(metric: Metric, labels: dict[str, str], state: custom.SeriesState) -> None:
    buckets = Histogram(state.buckets)
    buckets.counts = state.counts  # per bucket, then +Inf: as a Histogram keeps them
    for le, seen in buckets.cumulative():
        metric.add_sample(f"{metric.name}_bucket", {**labels, "le": le}, seen)
    metric.add_sample(f"{metric.name}_count", labels, state.count)
    metric.add_sample(f"{metric.name}_sum", labels, state.total)
