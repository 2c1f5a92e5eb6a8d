"""Telemetry: GPU (per GPU and per MIG instance, where NVML answers) and CPU readings over time."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil

from dlscale.hardware.catalog import scaled
from dlscale.hardware.detect import mig_handles
from dlscale.hardware.nvml import CLOCK_SM, TEMPERATURE_GPU, Nvml, NvmlUnavailable

#: What a MIG instance cannot report on its own: NVML gives these for the whole GPU only.
GPU_WIDE = "power, energy, temperature and SM clock are the whole GPU's (see its row)"


@dataclass(frozen=True)
class DeviceReading:
    """One GPU or MIG instance at one moment; None where NVML gave no answer."""

    gpu_uuid: str
    mig_instance: str  # "" for the whole GPU, else the MIG device UUID
    name: str
    utilization: float | None  # 0..1
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None  # NVML's counter since the driver loaded
    temperature_celsius: float | None = None
    sm_clock_hz: float | None = None
    unanswered: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reading:
    """Everything read at one moment."""

    time: float
    cpu_utilization: float  # 0..1, all cores
    cpu_memory_used_bytes: int
    cpu_memory_total_bytes: int
    devices: tuple[DeviceReading, ...]


class GpuProbe:
    """Reads every GPU and MIG instance through NVML; with no NVML, reads nothing and says why."""

    def __init__(self, lib: Any | None = None) -> None:
        self.status = "ok"
        self._nvml: Nvml | None = None
        try:
            self._nvml = Nvml.open(lib)
        except NvmlUnavailable as exc:
            self.status = f"unavailable: {exc}"

    def read(self) -> tuple[DeviceReading, ...]:
        """One reading of each GPU, followed by its MIG instances."""
        nvml = self._nvml
        if nvml is None:
            return ()
        out: list[DeviceReading] = []
        for index in range(int(nvml.value("nvmlDeviceGetCount") or 0)):
            handle = nvml.value("nvmlDeviceGetHandleByIndex", index)
            if handle is None:  # counted but not openable; detect() reports why
                continue
            gpu = _read_gpu(nvml, handle)
            out.append(gpu)
            mode = nvml.value("nvmlDeviceGetMigMode", handle)
            if mode is not None and int(mode[0]) == 1:
                out.extend(
                    _read_mig(nvml, gpu.gpu_uuid, mig) for _, mig in mig_handles(nvml, handle)
                )
        return tuple(out)

    def close(self) -> None:
        """Release NVML."""
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None


def read_now(probe: GpuProbe) -> Reading:
    """CPU and GPU readings taken now."""
    memory = psutil.virtual_memory()
    return Reading(
        time=time.monotonic(),
        cpu_utilization=psutil.cpu_percent(interval=None) / 100,
        cpu_memory_used_bytes=int(memory.total - memory.available),
        cpu_memory_total_bytes=int(memory.total),
        devices=probe.read(),
    )


class TelemetrySampler:
    """Samples CPU and GPUs every `interval_s` on a background thread; `averages()` sums it up."""

    def __init__(self, interval_s: float = 1.0, lib: Any | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval must be positive, got {interval_s}")
        self.interval_s = interval_s
        self._lib = lib
        self._samples: list[Reading] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._probe: GpuProbe | None = None

    def start(self) -> TelemetrySampler:
        """Begin sampling (the first sample is taken at once)."""
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self._probe = GpuProbe(self._lib)
        psutil.cpu_percent(interval=None)  # primes the counter: its first answer is meaningless
        self._samples = []
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="dlscale-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Take a last sample and stop."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        assert self._probe is not None
        self._keep(read_now(self._probe))
        self._probe.close()

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def samples(self) -> list[Reading]:
        """The readings so far."""
        with self._lock:
            return list(self._samples)

    def averages(self) -> dict[str, Any]:
        """Means over the samples, energy used per GPU, and what could not be read."""
        samples = self.samples
        status = self._probe.status if self._probe is not None else "not started"
        if not samples:
            return {"samples": 0, "nvml": status}
        devices: dict[tuple[str, str], list[DeviceReading]] = {}
        for sample in samples:
            for dev in sample.devices:
                devices.setdefault((dev.gpu_uuid, dev.mig_instance), []).append(dev)
        rows = [_average_device(readings) for readings in devices.values()]
        whole = [row for row in rows if not row["mig_instance"]]
        return {
            "samples": len(samples),
            "duration_s": samples[-1].time - samples[0].time,
            "interval_s": self.interval_s,
            "nvml": status,
            "cpu": {
                "utilization": _mean([s.cpu_utilization for s in samples[1:] or samples]),
                "memory_used_bytes": _mean([s.cpu_memory_used_bytes for s in samples]),
                "memory_total_bytes": samples[-1].cpu_memory_total_bytes,
            },
            "gpus": rows,
            "power_watts": _total([row["power_watts"] for row in whole]),
            "energy_joules": _total([row["energy_joules"] for row in whole]),
        }

    def _run(self) -> None:
        assert self._probe is not None
        while True:
            self._keep(read_now(self._probe))
            if self._stop.wait(self.interval_s):
                return

    def _keep(self, reading: Reading) -> None:
        with self._lock:
            self._samples.append(reading)


def _read_gpu(nvml: Nvml, handle: Any) -> DeviceReading:
    ask = {
        "util": nvml.ask("nvmlDeviceGetUtilizationRates", handle),
        "memory": nvml.ask("nvmlDeviceGetMemoryInfo", handle),
        "power": nvml.ask("nvmlDeviceGetPowerUsage", handle),
        "limit": nvml.ask("nvmlDeviceGetEnforcedPowerLimit", handle),
        "energy": nvml.ask("nvmlDeviceGetTotalEnergyConsumption", handle),
        "temp": nvml.ask("nvmlDeviceGetTemperature", handle, TEMPERATURE_GPU),
        "clock": nvml.ask("nvmlDeviceGetClockInfo", handle, CLOCK_SM),
    }
    util, memory = ask["util"].value, ask["memory"].value
    return DeviceReading(
        gpu_uuid=nvml.value("nvmlDeviceGetUUID", handle) or "",
        mig_instance="",
        name=nvml.value("nvmlDeviceGetName", handle) or "",
        utilization=util.gpu / 100 if util is not None else None,
        memory_used_bytes=int(memory.used) if memory is not None else None,
        memory_total_bytes=int(memory.total) if memory is not None else None,
        power_watts=scaled(ask["power"].value, 1e-3),
        power_limit_watts=scaled(ask["limit"].value, 1e-3),
        energy_joules=scaled(ask["energy"].value, 1e-3),
        temperature_celsius=scaled(ask["temp"].value, 1.0),
        sm_clock_hz=scaled(ask["clock"].value, 1e6),
        unanswered=tuple(a.why for a in ask.values() if a.why),
    )


def _read_mig(nvml: Nvml, gpu_uuid: str, mig: Any) -> DeviceReading:
    util = nvml.ask("nvmlDeviceGetUtilizationRates", mig)
    memory = nvml.ask("nvmlDeviceGetMemoryInfo", mig)
    return DeviceReading(
        gpu_uuid=gpu_uuid,
        mig_instance=nvml.value("nvmlDeviceGetUUID", mig) or "",
        name=nvml.value("nvmlDeviceGetName", mig) or "",
        utilization=util.value.gpu / 100 if util.ok else None,
        memory_used_bytes=int(memory.value.used) if memory.ok else None,
        memory_total_bytes=int(memory.value.total) if memory.ok else None,
        unanswered=(*(a.why for a in (util, memory) if a.why), GPU_WIDE),
    )


def _average_device(readings: list[DeviceReading]) -> dict[str, Any]:
    first, last = readings[0], readings[-1]
    energy = None
    if first.energy_joules is not None and last.energy_joules is not None:
        energy = last.energy_joules - first.energy_joules
    return {
        "gpu_uuid": last.gpu_uuid,
        "mig_instance": last.mig_instance,
        "name": last.name,
        "utilization": _mean([r.utilization for r in readings]),
        "memory_used_bytes": _mean([r.memory_used_bytes for r in readings]),
        "memory_total_bytes": last.memory_total_bytes,
        "power_watts": _mean([r.power_watts for r in readings]),
        "power_limit_watts": last.power_limit_watts,
        "energy_joules": energy,
        "temperature_celsius": _mean([r.temperature_celsius for r in readings]),
        "sm_clock_hz": _mean([r.sm_clock_hz for r in readings]),
        "unanswered": sorted({why for r in readings for why in r.unanswered}),
    }


def _mean(values: list[float | None] | list[float] | list[int | None] | list[int]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _total(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return float(sum(known)) if known else None
