"""Prometheus metrics under Triton's names, read from the ModelStats behind the statistics API,
and the device schedulers' (QoS).

Counters keep Triton's exact names (no `_total`): serve them with `serving/metrics/exposition.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from dlscale.hardware.metrics import TelemetryCollector
from dlscale.serving.manager import ModelManager
from dlscale.serving.metrics.custom import CustomCollector
from dlscale.serving.metrics.streams import StreamCollector
from dlscale.serving.metrics.vllm import VllmCollector
from dlscale.serving.observe.stats import ModelStats
from dlscale.serving.qos.admission import MAX_IN_FLIGHT, RATE_LIMIT
from dlscale.serving.served import ServedVersion

_LABELS = ["model", "version"]
_DEVICE = [*_LABELS, "device"]
#: The device scheduler's decisions (serving/qos/scheduler.py): fair share, an objective at risk,
#: or the scheduler off.
DECISIONS = ("fair", "urgent", "off")


#: Triton's per-model counters: name -> (help, the value read from a model's statistics).
COUNTERS: dict[str, tuple[str, Callable[[ModelStats], float]]] = {
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
    "nv_cache_num_hits_per_model": (
        "Requests answered from the response cache",
        lambda s: s.cache_hit.count,
    ),
    "nv_cache_num_misses_per_model": (
        "Response cache lookups that missed",
        lambda s: s.cache_miss.count,
    ),
    "nv_cache_hit_duration_per_model": (
        "Cumulative time of cache lookups that answered, microseconds",
        lambda s: s.cache_hit.ns / 1000,
    ),
    "nv_cache_miss_duration_per_model": (
        "Cumulative time of cache lookups that missed and of inserting, microseconds",
        lambda s: s.cache_miss.ns / 1000,
    ),
}


class InferenceCollector(Collector):
    """Reads every served version's ModelStats at scrape time; nothing is counted twice."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    def collect(self) -> Iterator[Metric]:
        stats = [v.stats for v in self.manager.served()]
        for name, (doc, value) in COUNTERS.items():
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
            latency.add_metric([s.name, s.version], s.latency.cumulative(), s.latency.total)
            batch.add_metric([s.name, s.version], s.batch_size.cumulative(), s.batch_size.total)
        yield latency
        yield batch


def _counter(name: str, doc: str) -> Metric:
    # A plain Metric keeps the name as given (CounterMetricFamily would add `_total`); the
    # exposition in serving/metrics/exposition.py writes it so.
    return Metric(name, doc, "counter")


class QosCollector(Collector):
    """Reads every served version's standing at the device gates at scrape time."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    def collect(self) -> Iterator[Metric]:
        served = [v for v in self.manager.served() if v.qos is not None]
        objective = GaugeMetricFamily(
            "dlscale_qos_latency_objective_seconds",
            "The p99 latency objective of a model ([qos] latency_objective_us)",
            labels=_LABELS,
        )
        waited = HistogramMetricFamily(
            "dlscale_qos_queue_wait_seconds",
            "Time each request waited from its arrival to its batch's start on the device",
            labels=_LABELS,
        )
        rejected = CounterMetricFamily(
            "dlscale_qos_rejected",
            "Requests refused at once by a model's [qos] limit",
            labels=[*_LABELS, "limit"],
        )
        for v in served:
            assert v.qos is not None
            labels = [v.stats.name, v.stats.version]
            qos = v.qos.config.qos
            if qos is not None and qos.latency_objective_us:
                objective.add_metric(labels, qos.latency_objective_us / 1e6)
            waited.add_metric(labels, v.qos.waited.cumulative(), v.qos.waited.total)
            refused = v.qos.admission.refused if v.qos.admission is not None else {}
            for limit in (RATE_LIMIT, MAX_IN_FLIGHT):
                rejected.add_metric([*labels, limit], refused.get(limit, 0))
        yield objective
        yield waited
        yield rejected
        yield from _per_device(served)


def _per_device(served: list[ServedVersion]) -> Iterator[Metric]:
    budget = GaugeMetricFamily(
        "dlscale_qos_queue_budget_seconds",
        "Objective minus the expected service time of a typical batch: the time it may queue",
        labels=_DEVICE,
    )
    service = GaugeMetricFamily(
        "dlscale_qos_expected_service_seconds",
        "Expected time on the device of a model's typical batch, learned from its batches",
        labels=_DEVICE,
    )
    device_time = CounterMetricFamily(
        "dlscale_qos_device_seconds", "Device time a model's batches held", labels=_DEVICE
    )
    batches = CounterMetricFamily(
        "dlscale_qos_batches",
        "Batches the device scheduler started, by its decision (fair, urgent, off)",
        labels=[*_DEVICE, "decision"],
    )
    capped = CounterMetricFamily(
        "dlscale_qos_batches_capped",
        "Batches cut short so that another model keeps its objective",
        labels=_DEVICE,
    )
    for v in served:
        assert v.qos is not None
        for device, tenant in v.qos.tenants.items():
            labels = [v.stats.name, v.stats.version, device]
            left = tenant.budget()
            if left is not None:
                budget.add_metric(labels, left)
            service.add_metric(labels, tenant.service.expected(tenant.typical_rows))
            device_time.add_metric(labels, tenant.device_s)
            for decision in DECISIONS:
                batches.add_metric([*labels, decision], tenant.decisions[decision])
            capped.add_metric(labels, tenant.capped)
    yield from (budget, service, device_time, batches, capped)


def build_registry(manager: ModelManager, telemetry_interval_s: float = 1.0) -> CollectorRegistry:
    """A registry with the inference metrics and the GPU/CPU telemetry (Triton's nv_gpu_* names)."""
    registry = models_registry(manager)
    TelemetryCollector(interval_s=telemetry_interval_s).register(registry)
    return registry


def models_registry(manager: ModelManager) -> CollectorRegistry:
    """The models' metrics alone (Triton's, dlscale's and vLLM's names), read at scrape time:
    what the REST port's /metrics serves, as vLLM's API port does."""
    registry = CollectorRegistry()
    registry.register(InferenceCollector(manager))
    registry.register(QosCollector(manager))
    registry.register(StreamCollector(manager))
    registry.register(VllmCollector(manager))
    registry.register(CustomCollector())  # Python models' own (pb_utils.MetricFamily)
    return registry
