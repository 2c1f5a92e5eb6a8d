"""Every Prometheus series the server exports: names, labels, types, and values after traffic
whose outcome is known (two answered requests, one the backend failed, one refused).

The expected types and values are written out below, in one place each, so that a deliberate
change to the exposition (counters typed as counters, statistics counted per request) changes
this file where it says so.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from tests.toolkit.gpu import host
from tests.toolkit.models import fails_on_even_batches, write_model, write_null_model
from tests.toolkit.repositories import BATCHED, NULL_TENSORS
from tests.toolkit.server import LocalServer, serving
from tritonclient.utils import InferenceServerException

#: Triton's counters go out typed as counters under their bare names
#: (serving/metrics/exposition.py).
COUNTER = "counter"
INFERENCE_COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    # Triton's response-cache counters: zero for models whose config does not enable it.
    "nv_cache_num_hits_per_model",
    "nv_cache_num_misses_per_model",
    "nv_cache_hit_duration_per_model",
    "nv_cache_miss_duration_per_model",
)
GPU_GAUGES = (
    "nv_gpu_utilization",
    "nv_gpu_memory_total_bytes",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_power_usage",
    "nv_gpu_power_limit",
    "nv_energy_consumption",
    "nv_gpu_temperature_celsius",
    "nv_gpu_sm_clock_hertz",
)
CPU_GAUGES = ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes")
TYPES = {
    **dict.fromkeys(INFERENCE_COUNTERS, COUNTER),
    "nv_inference_request_failure": COUNTER,
    "nv_inference_pending_request_count": "gauge",
    "dlscale_request_latency_seconds": "histogram",
    "dlscale_batch_size": "histogram",
    **dict.fromkeys(GPU_GAUGES + CPU_GAUGES, "gauge"),
    # The device schedulers' families (docs/qos.md), exported whether or not a model has [qos].
    "dlscale_qos_latency_objective_seconds": "gauge",
    "dlscale_qos_queue_budget_seconds": "gauge",
    "dlscale_qos_expected_service_seconds": "gauge",
    "dlscale_qos_queue_wait_seconds": "histogram",
    "dlscale_qos_rejected": "counter",
    "dlscale_qos_device_seconds": "counter",
    "dlscale_qos_batches": "counter",
    "dlscale_qos_batches_capped": "counter",
    # Models that stream and generative models (docs/generative.md), exported with none served.
    "dlscale_sequences_running": "gauge",
    "dlscale_sequences_waiting": "gauge",
    "dlscale_time_to_first_token_seconds": "histogram",
    "dlscale_time_per_output_token_seconds": "histogram",
    "dlscale_prompt_tokens": "counter",
    "dlscale_generation_tokens": "counter",
    "dlscale_kv_cache_usage_ratio": "gauge",
    "dlscale_kv_cache_cached_ratio": "gauge",
    "dlscale_qos_ttft_objective_seconds": "gauge",  # [qos] objectives (docs/scale.md)
    "dlscale_qos_tpot_objective_seconds": "gauge",
    # vLLM's names for the same measures (serving/metrics/vllm.py), exported with none served.
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    # Model memory (docs/memory.md), exported with no budget; the loads on demand with one.
    "dlscale_model_memory_bytes": "gauge",
    "dlscale_memory_budget_bytes": "gauge",
    "dlscale_memory_resident_bytes": "gauge",
    "dlscale_model_loads_running": "gauge",
    "dlscale_model_load_seconds": "histogram",
    "dlscale_model_evictions": "counter",
}
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
#: The traffic: rows per request to fails_even, which fails batches of an even row count. Sent
#: one after another with no batching delay, each request is a batch of its own.
ANSWERED, FAILED = (1, 3), (2,)
#: What the traffic leaves in the counters that count (durations are checked by relation).
COUNTS = {
    "nv_inference_request_success": len(ANSWERED),
    "nv_inference_count": sum(ANSWERED),  # rows computed; a failed batch computes none
    "nv_inference_exec_count": len(ANSWERED),  # batches computed
}
FAILURES = {"BACKEND": len(FAILED), "REJECTED": 1, "CANCELED": 0, "OTHER": 0}
Series = dict[str, list[Sample]]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("metrics-repo")
    write_model(root, "fails_even", fails_on_even_batches(), BATCHED.format(max_batch=7, delay=0))
    idle = NULL_TENSORS.format(inp="x", out="y", width=4, out_width=4)
    write_null_model(root, "idle", "max_batch_size = 8\n" + idle)
    with serving(root, metrics_port=0) as running:
        client = httpclient.InferenceServerClient(running.http_url)
        for rows in ANSWERED + FAILED:
            try:
                client.infer("fails_even", [_rows(rows, 4)])
            except InferenceServerException as exc:
                assert rows in FAILED and "onnxruntime failed" in exc.message()
        with pytest.raises(InferenceServerException, match="shape"):
            client.infer("fails_even", [_rows(1, 5)])  # refused: a row of 5, not 4
        yield running


def _rows(rows: int, width: int) -> httpclient.InferInput:
    tensor = httpclient.InferInput("x", [rows, width], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, width), np.float32))
    return tensor


@pytest.fixture(scope="module")
def scrape(server: LocalServer) -> tuple[dict[str, str], Series]:
    """(type by family, samples by family) of one scrape of the metrics port."""
    url = f"http://127.0.0.1:{server.server.ports['metrics']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    families = list(text_string_to_metric_families(text))
    return {f.name: f.type for f in families}, {f.name: f.samples for f in families}


def _value(samples: list[Sample], name: str, **labels: str) -> float:
    # The parser names a typed counter's samples NAME_total, whatever the text says.
    names = (name, f"{name}_total")
    found = [s.value for s in samples if s.name in names and s.labels == labels]
    assert len(found) == 1, (name, labels, samples)
    return found[0]


def _model(model: str) -> dict[str, str]:
    return {"model": model, "version": "1"}


def test_every_family_is_exported_with_its_type(scrape: tuple[dict[str, str], Series]) -> None:
    types, _ = scrape
    assert types == TYPES


def test_the_counters_count_the_known_traffic(scrape: tuple[dict[str, str], Series]) -> None:
    _, series = scrape
    for name, count in COUNTS.items():
        assert _value(series[name], name, **_model("fails_even")) == count, name
    failure = series["nv_inference_request_failure"]
    for reason, count in FAILURES.items():
        labels = {**_model("fails_even"), "reason": reason}
        assert _value(failure, "nv_inference_request_failure", **labels) == count, reason
    pending = series["nv_inference_pending_request_count"]
    assert _value(pending, "nv_inference_pending_request_count", **_model("fails_even")) == 0


def test_durations_are_consistent(scrape: tuple[dict[str, str], Series]) -> None:
    _, series = scrape

    def us(name: str) -> float:
        return _value(series[name], name, **_model("fails_even"))

    total, infer = (
        us("nv_inference_request_duration_us"),
        us("nv_inference_compute_infer_duration_us"),
    )
    # Every answered request's time in the server holds its batch's compute.
    assert 0 < infer <= total
    for part in ("queue", "compute_input", "compute_output"):
        assert 0 <= us(f"nv_inference_{part}_duration_us") <= total, part


def _histogram(samples: list[Sample], family: str, model: str) -> tuple[dict[float, float], float]:
    labels = _model(model)
    buckets = {
        float(s.labels["le"]): s.value
        for s in samples
        if s.name == f"{family}_bucket" and {k: s.labels[k] for k in labels} == labels
    }
    assert list(buckets.values()) == sorted(buckets.values())  # cumulative
    count = _value(samples, f"{family}_count", **labels)
    assert buckets[float("inf")] == count
    return buckets, _value(samples, f"{family}_sum", **labels)


def test_histograms_hold_each_answered_request_and_batch(
    scrape: tuple[dict[str, str], Series],
) -> None:
    _, series = scrape
    sizes, rows = _histogram(series["dlscale_batch_size"], "dlscale_batch_size", "fails_even")
    assert rows == sum(ANSWERED)
    assert {le: sizes[le] for le in (1.0, 2.0, 4.0, float("inf"))} == {
        1.0: 1,
        2.0: 1,
        4.0: 2,
        float("inf"): 2,
    }
    family = "dlscale_request_latency_seconds"
    latency, seconds = _histogram(series[family], family, "fails_even")
    assert latency[float("inf")] == len(ANSWERED)
    total_us = _value(
        series["nv_inference_request_duration_us"],
        "nv_inference_request_duration_us",
        **_model("fails_even"),
    )
    assert 0 < seconds * 1e6 <= total_us * (1 + 1e-9)  # the answered ones, of all


def test_a_model_without_traffic_reports_zeros(scrape: tuple[dict[str, str], Series]) -> None:
    _, series = scrape
    for name in (*INFERENCE_COUNTERS, "nv_inference_pending_request_count"):
        assert _value(series[name], name, **_model("idle")) == 0, name
    for reason in REASONS:
        labels = {**_model("idle"), "reason": reason}
        assert _value(series["nv_inference_request_failure"], "nv_inference_request_failure",
                      **labels) == 0  # fmt: skip
    for family in ("dlscale_batch_size", "dlscale_request_latency_seconds"):
        buckets, total = _histogram(series[family], family, "idle")
        assert set(buckets.values()) == {0} and total == 0


def test_labels_are_model_and_version_and_the_reason(
    scrape: tuple[dict[str, str], Series],
) -> None:
    _, series = scrape
    for name in (*INFERENCE_COUNTERS, "nv_inference_pending_request_count"):
        assert sorted(tuple(sorted(s.labels.items())) for s in series[name]) == [
            (("model", "fails_even"), ("version", "1")),
            (("model", "idle"), ("version", "1")),
        ], name
    reasons = {s.labels["reason"] for s in series["nv_inference_request_failure"]}
    assert reasons == set(REASONS)


def test_the_statistics_extension_reads_the_same_record(server: LocalServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    stats = client.get_inference_statistics("fails_even")["model_stats"][0]
    assert stats["inference_count"] == COUNTS["nv_inference_count"]
    assert stats["execution_count"] == COUNTS["nv_inference_exec_count"]
    assert stats["inference_stats"]["success"]["count"] == COUNTS["nv_inference_request_success"]
    assert stats["inference_stats"]["fail"]["count"] == sum(FAILURES.values())


def test_host_gauges_follow_the_detected_hardware(scrape: tuple[dict[str, str], Series]) -> None:
    _, series = scrape
    total = _value(series["nv_cpu_memory_total_bytes"], "nv_cpu_memory_total_bytes")
    used = _value(series["nv_cpu_memory_used_bytes"], "nv_cpu_memory_used_bytes")
    assert 0 < used <= total
    assert 0 <= _value(series["nv_cpu_utilization"], "nv_cpu_utilization") <= 1
    # One sample per whole GPU NVML sees (and per MIG instance); none on a machine without.
    uuids = {s.labels["gpu_uuid"] for s in series["nv_gpu_memory_total_bytes"]}
    assert uuids == {gpu.uuid for gpu in host().gpus}
