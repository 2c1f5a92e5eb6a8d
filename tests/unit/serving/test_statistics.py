"""Statistics counted as Triton's statistics extension defines them, and the Prometheus text the
metrics port serves (counters typed as counters under Triton's exact names)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.toolkit.models import write_null_model

from dlscale.errors import InvalidInput
from dlscale.serving.host import HostPlane
from dlscale.serving.manager import ModelManager
from dlscale.serving.metrics.collectors import InferenceCollector
from dlscale.serving.metrics.exposition import render
from dlscale.types import InferenceRequest

# Each batch holds the one instance 50 ms, so requests sent meanwhile share the next batch.
SLOW = """max_batch_size = 16
[backend_options]
delay_us = 50000
[[inputs]]
name = "x"
datatype = "FP32"
shape = [4]
[[outputs]]
name = "y"
datatype = "FP32"
shape = [4]
"""

COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


def _request(rows: int) -> InferenceRequest:
    return InferenceRequest("slow", {"x": np.ones((rows, 4), np.float32)})


@pytest.fixture
async def plane(tmp_path: Path) -> HostPlane:
    write_null_model(tmp_path, "slow", SLOW)
    manager = ModelManager.open(tmp_path)
    await manager.load_all()
    return HostPlane(manager, "explicit")


async def _traffic(plane: HostPlane) -> None:
    """One request of 1 row alone, then three of 2 rows merged into one batch of 6, then a
    request refused for its shape."""
    first = asyncio.create_task(plane.infer(_request(1)))
    await asyncio.sleep(0.01)  # the first batch holds the instance now
    await asyncio.gather(first, *(plane.infer(_request(2)) for _ in range(3)))
    with pytest.raises(InvalidInput):
        await plane.infer(InferenceRequest("slow", {"x": np.ones((1, 5), np.float32)}))


async def test_counts_are_per_request_and_per_batch_as_tritons(plane: HostPlane) -> None:
    await _traffic(plane)
    (stats,) = plane.statistics("slow")
    s = stats.inference_stats
    # Requests: success, queue and compute_* count each successful request once.
    assert (s.success.count, s.fail.count) == (4, 1)
    assert s.queue.count == s.compute_input.count == s.compute_infer.count == 4
    assert s.compute_output.count == 4
    # A request's compute time is its batch's: three requests shared the batch of 6.
    by_size = {b.batch_size: b for b in stats.batch_stats}
    assert sorted(by_size) == [1, 6]
    assert s.compute_infer.ns == by_size[1].compute_infer.ns + 3 * by_size[6].compute_infer.ns
    assert all(b.compute_infer.count == b.compute_input.count == 1 for b in by_size.values())
    # Rows of successful requests, and batches run.
    assert (stats.inference_count, stats.execution_count) == (7, 2)
    await plane.manager.close()


async def test_the_exposition_types_counters_under_tritons_names(plane: HostPlane) -> None:
    await _traffic(plane)
    text = render(InferenceCollector(plane.manager)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    for name in COUNTERS:
        assert families[name].type == "counter", name
        assert f"# TYPE {name} counter\n" in text
        # The series carry exactly Triton's name (prometheus_client's parser would report them
        # with `_total` added, its OpenMetrics naming; Prometheus keeps what is written).
        assert any(line.startswith(name + "{") for line in lines), name
    assert "_total" not in text
    assert families["nv_inference_pending_request_count"].type == "gauge"
    assert families["dlscale_request_latency_seconds"].type == "histogram"

    def value(name: str, **labels: str) -> float:
        want = {"model": "slow", "version": "1", **labels}
        series = (s for s in families[name].samples if not s.name.endswith("_created"))
        return next(s.value for s in series if s.labels == want)

    (stats,) = plane.statistics("slow")
    assert value("nv_inference_request_success") == 4
    assert value("nv_inference_count") == 7
    assert value("nv_inference_exec_count") == 2
    assert value("nv_inference_request_failure", reason="REJECTED") == 1
    assert value("nv_inference_request_duration_us") == stats.inference_stats.success.ns / 1000
    await plane.manager.close()
