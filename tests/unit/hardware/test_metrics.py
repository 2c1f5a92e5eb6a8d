"""The Prometheus collector: Triton's names, the MIG label, registrable on a given registry."""

from __future__ import annotations

from fake_nvml import FakeNvml
from prometheus_client import CollectorRegistry, generate_latest

from dlscale.hardware.metrics import TelemetryCollector


def _scrape(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_exposition_has_triton_names_per_gpu_and_mig(fake_nvml: FakeNvml) -> None:
    registry = CollectorRegistry()
    collector = TelemetryCollector(fake_nvml).register(registry)
    first = _scrape(registry)
    for name in (
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage",
        "nv_gpu_power_limit",
        "nv_energy_consumption",
        "nv_gpu_temperature_celsius",
        "nv_gpu_sm_clock_hertz",
        "nv_cpu_utilization",
        "nv_cpu_memory_total_bytes",
        "nv_cpu_memory_used_bytes",
    ):
        assert f"# TYPE {name} gauge" in first, name
    assert 'nv_gpu_utilization{gpu_uuid="GPU-h100",mig_instance=""} 0.37' in first
    assert 'nv_gpu_power_usage{gpu_uuid="GPU-h100",mig_instance=""} 350.0' in first
    assert 'nv_gpu_memory_used_bytes{gpu_uuid="GPU-h100",mig_instance="MIG-bbb"}' in first
    assert 'nv_gpu_utilization{gpu_uuid="GPU-h100",mig_instance="MIG-aaa"}' not in first
    assert 'nv_gpu_power_usage{gpu_uuid="GPU-t4"' not in first  # NotSupported: no sample
    assert 'nv_energy_consumption{gpu_uuid="GPU-h100",mig_instance=""} 0.0' in first
    second = _scrape(registry)  # energy counts from the first scrape, as Triton's does
    assert 'nv_energy_consumption{gpu_uuid="GPU-h100",mig_instance=""} 50.0' in second
    collector.close()
    assert fake_nvml.inits == 0


def test_interval_reuses_a_recent_reading(fake_nvml: FakeNvml) -> None:
    registry = CollectorRegistry()
    TelemetryCollector(fake_nvml, interval_s=3600).register(registry)
    _scrape(registry)
    fake_nvml.gpus[0].util = 99
    assert 'mig_instance=""} 0.37' in _scrape(registry)


def test_cpu_only_host_exports_cpu_metrics() -> None:
    # This host's own NVML, whatever it has, then one that does not start (a CPU-only host).
    for lib in (None, FakeNvml([], init_error=FakeNvml.NVMLError(9))):
        registry = CollectorRegistry()
        collector = TelemetryCollector(lib).register(registry)
        text = _scrape(registry)
        assert "nv_cpu_memory_used_bytes " in text and "nv_cpu_utilization " in text
        collector.close()
    assert "nv_gpu_utilization{" not in text
