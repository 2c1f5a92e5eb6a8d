"""The QoS metrics after known traffic: two ONNX models sharing the CPU under [qos]."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from prometheus_client.registry import CollectorRegistry
from tests.toolkit.models import identity_graph, write_model

from dlscale.errors import TooManyRequests
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager
from dlscale.serving.metrics.collectors import DECISIONS, QosCollector
from dlscale.types import InferenceRequest

FAST = "max_batch_size = 8\n[qos]\nlatency_objective_us = 50000\n"
# One request per 100 s after a burst of 3: the fourth is refused whatever the machine's speed.
BULK = "max_batch_size = 8\n[qos]\nweight = 2.0\nrate_limit = 0.01\nrate_burst = 3\n"


@pytest.fixture
async def manager(tmp_path: Path) -> ModelManager:
    write_model(tmp_path, "fast", identity_graph(), FAST)
    write_model(tmp_path, "bulk", identity_graph(), BULK)
    manager = ModelManager.open(tmp_path)
    await manager.load_all()
    yield manager  # type: ignore[misc]
    await manager.close()


def _request(model: str) -> InferenceRequest:
    return InferenceRequest(model, {"input": np.ones((1, 16), np.float32)})


async def test_qos_metrics_after_known_traffic(manager: ModelManager) -> None:
    plane = DataPlane(manager)
    for _ in range(10):
        await plane.infer(_request("fast"))
    for _ in range(3):
        await plane.infer(_request("bulk"))
    with pytest.raises(TooManyRequests, match="rate limit"):
        await plane.infer(_request("bulk"))
    registry = CollectorRegistry()
    registry.register(QosCollector(manager))

    def value(name: str, model: str, **labels: str) -> float:
        found = registry.get_sample_value(name, {"model": model, "version": "1", **labels})
        assert found is not None, (name, model, labels)
        return found

    assert value("dlscale_qos_queue_wait_seconds_count", "fast") == 10
    assert value("dlscale_qos_queue_wait_seconds_count", "bulk") == 3
    assert value("dlscale_qos_rejected_total", "bulk", limit="rate_limit") == 1
    assert value("dlscale_qos_rejected_total", "fast", limit="rate_limit") == 0
    assert value("dlscale_qos_latency_objective_seconds", "fast") == pytest.approx(0.05)
    cpu = {"device": "cpu"}
    budget = value("dlscale_qos_queue_budget_seconds", "fast", **cpu)
    service = value("dlscale_qos_expected_service_seconds", "fast", **cpu)
    assert budget == pytest.approx(0.05 - service) and 0 < service < 0.05
    assert (
        registry.get_sample_value(
            "dlscale_qos_queue_budget_seconds", {"model": "bulk", "version": "1", "device": "cpu"}
        )
        is None
    )  # no objective, no budget
    for model, requests in (("fast", 10), ("bulk", 3)):
        executed = manager.get(model).stats.execution_count
        started = sum(
            value("dlscale_qos_batches_total", model, decision=d, **cpu) for d in DECISIONS
        )
        assert started == executed and 1 <= executed <= requests
        assert value("dlscale_qos_device_seconds_total", model, **cpu) > 0
        assert value("dlscale_qos_batches_capped_total", model, **cpu) == 0
