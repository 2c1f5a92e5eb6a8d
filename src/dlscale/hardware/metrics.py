"""A Prometheus collector for GPU and CPU telemetry under Triton's `nv_gpu_*` / `nv_cpu_*` names."""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from dlscale.hardware.telemetry import DeviceReading, GpuProbe, Reading, read_now

LABELS = ("gpu_uuid", "mig_instance")

#: (name, help, the DeviceReading attribute) for each per-device gauge; Triton's names first.
GPU_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "utilization"),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "memory_total_bytes"),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "memory_used_bytes"),
    ("nv_gpu_power_usage", "GPU power usage in watts", "power_watts"),
    ("nv_gpu_power_limit", "GPU power management limit in watts", "power_limit_watts"),
    ("nv_gpu_temperature_celsius", "GPU temperature, in degrees Celsius", "temperature_celsius"),
    ("nv_gpu_sm_clock_hertz", "GPU SM clock, in hertz", "sm_clock_hz"),
)
ENERGY = "nv_energy_consumption"
#: (name, help, the Reading attribute) for each CPU gauge.
CPU_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "cpu_utilization"),
    ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", "cpu_memory_total_bytes"),
    ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", "cpu_memory_used_bytes"),
)


class TelemetryCollector(Collector):
    """Reads NVML and psutil at a scrape, at most once per `interval_s` (Triton's metrics interval).

    Register it on the server's CollectorRegistry; without NVML it exports the CPU metrics only.
    """

    def __init__(self, lib: Any | None = None, interval_s: float = 0.0) -> None:
        self._probe = GpuProbe(lib)
        self._energy_start: dict[str, float] = {}
        self._interval_s = interval_s
        self._last: Reading | None = None

    def register(self, registry: CollectorRegistry) -> TelemetryCollector:
        """Register on `registry` and return self."""
        registry.register(self)
        return self

    def describe(self) -> Iterable[Metric]:
        """The metric families without reading the devices (registration needs only names)."""
        return list(self._families(Reading(0.0, 0.0, 0, 0, ())))

    def collect(self) -> Iterable[Metric]:
        """One reading of every device and the CPU, as gauges."""
        reading = self._last
        if reading is None or time.monotonic() - reading.time >= self._interval_s:
            reading = self._last = read_now(self._probe)
        return list(self._families(reading))

    def close(self) -> None:
        """Release NVML."""
        self._probe.close()

    def _families(self, reading: Reading) -> Iterator[Metric]:
        devices = list(reading.devices)
        for name, doc, attr in GPU_GAUGES:
            yield _gauge(name, doc, devices, operator.attrgetter(attr))
        yield _gauge(
            ENERGY,
            "GPU energy consumption in joules since the collector started",
            devices,
            self._energy_since_start,
        )
        for name, doc, attr in CPU_GAUGES:
            yield GaugeMetricFamily(name, doc, value=getattr(reading, attr))

    def _energy_since_start(self, device: DeviceReading) -> float | None:
        if device.energy_joules is None:
            return None
        start = self._energy_start.setdefault(device.gpu_uuid, device.energy_joules)
        return device.energy_joules - start


def _gauge(
    name: str,
    doc: str,
    devices: list[DeviceReading],
    value_of: Callable[[DeviceReading], float | None],
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=LABELS)
    for device in devices:
        value = value_of(device)
        if value is not None:
            family.add_metric([device.gpu_uuid, device.mig_instance], value)
    return family
