"""`--device-workers SPEC` read against NVML stand-ins: GPUs, MIG slices, counts and lists."""

from __future__ import annotations

import pynvml
import pytest
from tests.unit.hardware.fake_nvml import FakeGpu, FakeNvml, three_gpus

from dlscale.errors import ConfigError
from dlscale.hardware.detect import detect
from dlscale.scale.devices import Device, devices_for

GIB = 1 << 30


def test_auto_is_one_worker_per_mig_slice_and_per_gpu_without_mig() -> None:
    # an H100 with MIG on (slices in slots 0 and 2), an A100 with MIG off, a T4 (no MIG)
    devices = devices_for("auto", detect(three_gpus()))
    assert devices == [
        Device("gpu0.mig0", "MIG-aaa"),
        Device("gpu0.mig2", "MIG-bbb"),
        Device("gpu1", "GPU-a100"),
        Device("gpu2", "GPU-t4"),
    ]
    env = devices[1].env({"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "MIG-bbb", "DLSCALE_DEVICE": "gpu0.mig2"}


def test_auto_without_a_visible_device_says_why_and_what_to_do() -> None:
    no_driver = FakeNvml([], init_error=pynvml.NVMLError_DriverNotLoaded())
    with pytest.raises(ConfigError, match=r"no GPU or MIG slice is visible \(NVML: unavailable"):
        devices_for("auto", detect(no_driver))
    bare = FakeNvml([FakeGpu("NVIDIA A100-SXM4-40GB", "GPU-x", 40 * GIB, mig=True)])
    with pytest.raises(ConfigError, match=r"MIG is on and no slice is made.*--device-workers 4"):
        devices_for("auto", detect(bare))


def test_a_count_spreads_over_the_devices_or_runs_on_the_cpu() -> None:
    one = FakeNvml([FakeGpu("NVIDIA A100-SXM4-40GB", "GPU-a", 40 * GIB, mig=False)])
    assert devices_for("3", detect(one)) == [
        Device("gpu0", "GPU-a"), Device("gpu0#2", "GPU-a"), Device("gpu0#3", "GPU-a")
    ]  # fmt: skip
    cpu_only = FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound())
    assert devices_for("2", detect(cpu_only)) == [Device("cpu0"), Device("cpu1")]
    assert Device("cpu0").env({}) == {"DLSCALE_DEVICE": "cpu0"}  # CUDA's view left alone
    with pytest.raises(ConfigError, match="one worker or more"):
        devices_for("0", detect(cpu_only))


def test_a_list_names_gpus_and_uuids_and_a_mig_gpu_stands_for_its_slices() -> None:
    host = detect(three_gpus())
    assert devices_for("gpu0", host) == [
        Device("gpu0.mig0", "MIG-aaa"),
        Device("gpu0.mig2", "MIG-bbb"),
    ]
    assert devices_for("GPU-t4, MIG-bbb", host) == [
        Device("gpu2", "GPU-t4"),
        Device("gpu0.mig2", "MIG-bbb"),
    ]
    with pytest.raises(
        ConfigError, match=r"'GPU-nope' is not a device of this host.*gpu1 \(GPU-a100\)"
    ):
        devices_for("gpu1,GPU-nope", host)
    with pytest.raises(ConfigError, match="gpu7 is not on this host"):
        devices_for("gpu7", host)
    with pytest.raises(ConfigError, match="names gpu1 twice"):
        devices_for("gpu1,GPU-a100", host)
