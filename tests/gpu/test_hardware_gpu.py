"""On a GPU machine: detection, telemetry and the collector against the real NVML."""

from __future__ import annotations

import time

import pytest
from tests.toolkit.gpu import gpus_seen, host

from dlscale.hardware.detect import detect

pytestmark = pytest.mark.gpu


if not host().gpus:
    pytest.skip(gpus_seen(), allow_module_level=True)


def test_detect_finds_and_matches_the_gpus() -> None:
    host = detect()
    assert host.nvml == "ok" and host.driver_version
    assert len(host.gpus) >= 1
    for gpu in host.gpus:
        assert gpu.uuid.startswith("GPU-")
        assert gpu.memory_bytes and gpu.memory_bytes > 1e9
        assert gpu.compute_capability
        if gpu.mig_enabled:
            assert all(m.uuid.startswith("MIG-") for m in gpu.mig_instances)
    datacenter = [g for g in host.gpus if any(k in g.name for k in ("H100", "H200", "A100", "L4"))]
    assert all(g.catalog for g in datacenter), [g.name for g in datacenter]


def test_telemetry_reads_power_and_memory() -> None:
    from dlscale.hardware.telemetry import TelemetrySampler

    with TelemetrySampler(interval_s=0.05) as sampler:
        time.sleep(0.5)
    avg = sampler.averages()
    assert avg["nvml"] == "ok"
    whole = [row for row in avg["gpus"] if not row["mig_instance"]]
    assert whole and all(row["memory_total_bytes"] for row in whole)
    assert avg["power_watts"] is None or avg["power_watts"] > 0


def test_collector_exports_every_gpu() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from dlscale.hardware.metrics import TelemetryCollector

    registry = CollectorRegistry()
    TelemetryCollector().register(registry)
    text = generate_latest(registry).decode()
    for gpu in detect().gpus:
        assert f'nv_gpu_memory_total_bytes{{gpu_uuid="{gpu.uuid}",mig_instance=""}}' in text
