"""Detection through the NVML stand-in: MIG on and off, instances, unsupported calls, no NVML."""

from __future__ import annotations

import pynvml
from fake_nvml import FakeNvml

from dlscale.hardware.detect import detect
from dlscale.hardware.nvml import Nvml, NvmlUnavailable


def test_gpus_with_mig_on_and_off(fake_nvml: FakeNvml) -> None:
    host = detect(fake_nvml)
    assert host.nvml == "ok" and host.driver_version == "550.54.15"
    h100, a100, t4 = host.gpus
    assert (h100.catalog, a100.catalog, t4.catalog) == ("H100-SXM", "A100-SXM-40GB", "T4")
    assert h100.compute_capability == "9.0" and t4.compute_capability == "7.5"
    assert h100.power_limit_watts == 700 and h100.sm_clock_max_mhz == 1980
    assert a100.name == "NVIDIA A100-SXM4-40GB"  # bytes decoded

    assert h100.mig_enabled is True
    assert [(m.index, m.profile, m.uuid) for m in h100.mig_instances] == [
        (0, "3g.40gb", "MIG-aaa"),
        (2, "1g.10gb", "MIG-bbb"),  # the empty slot 1 is skipped
    ]
    assert h100.mig_instances[1].gpu_instance_id == 9
    assert h100.mig_instances[0].memory_bytes == 40 << 30

    assert a100.mig_enabled is False and a100.mig_instances == ()
    assert t4.mig_enabled is None  # no MIG on Turing: NotSupported, not an error
    assert any("nvmlDeviceGetMigMode: Not Supported" in why for why in t4.unanswered)
    assert fake_nvml.inits == 0  # NVML shut down after detection


def test_unsupported_calls_leave_fields_empty(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[0].unsupported |= {
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetMaxClockInfo",
    }
    host = detect(fake_nvml)
    h100 = host.gpus[0]
    assert h100.power_limit_watts is None and h100.sm_clock_max_mhz is None
    assert len(h100.unanswered) == 3  # power limit and two clocks
    assert host.to_dict()["gpus"][0]["unanswered"]


def test_no_nvml_is_a_clean_cpu_only_answer() -> None:
    broken = FakeNvml([], init_error=pynvml.NVMLError_DriverNotLoaded())
    host = detect(broken)
    assert host.gpus == ()
    assert host.nvml.startswith("unavailable: NVML did not start: Driver Not Loaded")
    assert host.cpu.physical_cores >= 1
    assert host.to_dict()["gpus"] == []


def test_nvml_on_this_host_never_raises() -> None:
    host = detect()  # real pynvml: on a machine without a driver it reports, not raises
    assert host.nvml == "ok" or host.nvml.startswith("unavailable")


def test_ask_turns_nvml_errors_into_reasons(fake_nvml: FakeNvml) -> None:
    nvml = Nvml.open(fake_nvml)
    t4 = fake_nvml.gpus[2]
    answer = nvml.ask("nvmlDeviceGetPowerUsage", t4)
    assert not answer.ok and answer.value is None
    assert answer.why == "nvmlDeviceGetPowerUsage: Not Supported"
    assert nvml.value("nvmlDeviceGetUUID", t4) == "GPU-t4"
    nvml.close()
    try:
        Nvml.open(FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound()))
    except NvmlUnavailable as exc:
        assert "Library Not Found" in str(exc)
    else:
        raise AssertionError("expected NvmlUnavailable")


def test_a_gpu_nvml_cannot_open_is_reported_not_raised(fake_nvml: FakeNvml) -> None:
    fake_nvml.lost = {1}
    gpus = detect(fake_nvml).gpus
    assert [g.catalog for g in gpus] == ["H100-SXM", None, "T4"]
    assert gpus[1].unanswered == ("nvmlDeviceGetHandleByIndex: GPU is lost",)
