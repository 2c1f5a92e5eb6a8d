"""The telemetry sampler on this CPU and through the NVML stand-in."""

from __future__ import annotations

import threading

import pytest
from fake_nvml import FakeNvml

from dlscale.hardware.telemetry import GPU_WIDE, GpuProbe, TelemetrySampler, read_now


def _busy_until(done: threading.Event) -> None:
    while not done.is_set():
        sum(i * i for i in range(10_000))


def test_sampler_on_cpu_reads_utilization_and_memory() -> None:
    done = threading.Event()
    worker = threading.Thread(target=_busy_until, args=(done,))
    sampler = TelemetrySampler(interval_s=0.02)
    with sampler:
        worker.start()
        while len(sampler.samples) < 5:
            done.wait(0.01)
        done.set()
        worker.join()
    avg = sampler.averages()
    assert avg["samples"] >= 6  # five from the thread, one more at stop
    assert 0 < avg["cpu"]["utilization"] <= 1  # the busy thread shows up
    assert 0 < avg["cpu"]["memory_used_bytes"] < avg["cpu"]["memory_total_bytes"]
    assert avg["duration_s"] > 0
    if avg["nvml"] != "ok":  # this machine: no GPU, said plainly
        assert avg["gpus"] == [] and avg["power_watts"] is None


def test_sampler_through_the_stand_in(fake_nvml: FakeNvml) -> None:
    sampler = TelemetrySampler(interval_s=0.01, lib=fake_nvml).start()
    while len(sampler.samples) < 3:
        threading.Event().wait(0.01)
    sampler.stop()
    avg = sampler.averages()
    rows = {(r["gpu_uuid"], r["mig_instance"]): r for r in avg["gpus"]}
    assert set(rows) == {
        ("GPU-h100", ""),
        ("GPU-h100", "MIG-aaa"),
        ("GPU-h100", "MIG-bbb"),
        ("GPU-a100", ""),
        ("GPU-t4", ""),
    }
    h100 = rows[("GPU-h100", "")]
    assert h100["utilization"] == pytest.approx(0.37)
    assert h100["power_watts"] == pytest.approx(350)
    assert h100["sm_clock_hz"] == pytest.approx(1.98e9)
    assert h100["temperature_celsius"] == 41
    # the stand-in's counter moves 50 J per read: energy is the difference, never the raw counter
    assert h100["energy_joules"] == pytest.approx(50 * (avg["samples"] - 1))

    mig = rows[("GPU-h100", "MIG-aaa")]
    assert mig["utilization"] is None and mig["power_watts"] is None
    assert mig["memory_used_bytes"] == 2 << 30
    assert GPU_WIDE in mig["unanswered"]
    assert any("Not Supported" in why for why in mig["unanswered"])

    t4 = rows[("GPU-t4", "")]
    assert t4["power_watts"] is None and t4["energy_joules"] is None
    assert "nvmlDeviceGetPowerUsage: Not Supported" in t4["unanswered"]
    # whole GPUs only, and only those that report power: H100 and A100
    assert avg["power_watts"] == pytest.approx(700)
    assert fake_nvml.inits == 0


def test_probe_without_nvml_reads_nothing() -> None:
    probe = GpuProbe(FakeNvml([], init_error=FakeNvml.NVMLError(9)))
    assert probe.status.startswith("unavailable")
    reading = read_now(probe)
    assert reading.devices == () and reading.cpu_memory_total_bytes > 0


def test_sampler_rejects_a_bad_interval_and_a_second_start() -> None:
    with pytest.raises(ValueError):
        TelemetrySampler(interval_s=0)
    sampler = TelemetrySampler(interval_s=0.05).start()
    with pytest.raises(RuntimeError):
        sampler.start()
    sampler.stop()
    sampler.stop()  # stopping twice is harmless
