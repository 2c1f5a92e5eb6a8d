"""Prometheus metrics under Triton's names, read from the ModelStats behind the statistics API.

Counters keep Triton's exact names (no `_total`): serve them with `serving/exposition.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import (
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from dlscale.hardware.metrics import TelemetryCollector
from dlscale.serving.manager import ModelManager
from dlscale.serving.stats import ModelStats

_LABELS = ["model", "version"]


class InferenceCollector(Collector):
    """Reads every served version's ModelStats at scrape time; nothing is counted twice."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    def _stats(self) -> list[ModelStats]:
        return [v.stats for e in self.manager.entries() for v in e.versions.values()]

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        counters: dict[str, tuple[str, Callable[[ModelStats], float]]] = {
            "nv_inference_request_success": (
                "Number of successful inference requests, all batch sizes",
                lambda s: s.success.count,
            ),
            "nv_inference_count": (
                "Number of inferences performed (a request of batch size N counts N)",
                lambda s: s.inference_count,
            ),
            "nv_inference_exec_count": (
                "Number of model executions performed (batches)",
                lambda s: s.execution_count,
            ),
            "nv_inference_request_duration_us": (
                "Cumulative time of successful requests in the server, microseconds",
                lambda s: s.success.ns / 1000,
            ),
            "nv_inference_queue_duration_us": (
                "Cumulative time requests waited in the queue, microseconds",
                lambda s: s.queue.ns / 1000,
            ),
            "nv_inference_compute_input_duration_us": (
                "Cumulative time merging inputs into batches, microseconds",
                lambda s: s.compute_input.ns / 1000,
            ),
            "nv_inference_compute_infer_duration_us": (
                "Cumulative time computing batches, microseconds",
                lambda s: s.compute_infer.ns / 1000,
            ),
            "nv_inference_compute_output_duration_us": (
                "Cumulative time splitting outputs back to requests, microseconds",
                lambda s: s.compute_output.ns / 1000,
            ),
        }
        for name, (doc, value) in counters.items():
            family = _counter(name, doc)
            for s in stats:
                family.add_sample(name, {"model": s.name, "version": s.version}, value(s))
            yield family

        failure = _counter("nv_inference_request_failure", "Failed inference requests, by reason")
        for s in stats:
            for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
                labels = {"model": s.name, "version": s.version, "reason": reason}
                failure.add_sample(failure.name, labels, s.failures.get(reason, 0))
        yield failure

        pending = GaugeMetricFamily(
            "nv_inference_pending_request_count",
            "Requests queued or computing now",
            labels=_LABELS,
        )
        for s in stats:
            pending.add_metric([s.name, s.version], s.pending)
        yield pending

        latency = HistogramMetricFamily(
            "dlscale_request_latency_seconds",
            "Time from a request's arrival at the DataPlane to its answer",
            labels=_LABELS,
        )
        batch = HistogramMetricFamily(
            "dlscale_batch_size", "Rows in each executed batch", labels=_LABELS
        )
        for s in stats:
            latency.add_metric(
                [s.name, s.version],
                [(_le(b), n) for b, n in s.latency.cumulative()],
                s.latency.total,
            )
            batch.add_metric(
                [s.name, s.version],
                [(_le(b), n) for b, n in s.batch_size.cumulative()],
                s.batch_size.total,
            )
        yield latency
        yield batch


def _counter(name: str, doc: str) -> Metric:
    # A plain Metric keeps the name as given (CounterMetricFamily would add `_total`); the
    # exposition in serving/exposition.py writes it so.
    return Metric(name, doc, "counter")


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def build_registry(manager: ModelManager, telemetry_interval_s: float = 1.0) -> CollectorRegistry:
    """A registry with the inference metrics and the GPU/CPU telemetry (Triton's nv_gpu_* names)."""
    registry = CollectorRegistry()
    registry.register(InferenceCollector(manager))
    TelemetryCollector(interval_s=telemetry_interval_s).register(registry)
    return registry
