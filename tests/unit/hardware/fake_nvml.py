"""A stand-in for the NVML library: GPUs with MIG on and off, MIG instances, unsupported calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml


@dataclass
class FakeMig:
    """One MIG device."""

    name: str
    uuid: str
    memory_total: int
    memory_used: int
    gpu_instance: int
    compute_instance: int


@dataclass
class FakeGpu:
    """One GPU; calls named in `unsupported` raise NVMLError_NotSupported."""

    name: str | bytes
    uuid: str
    memory_total: int
    memory_used: int = 1 << 30
    capability: tuple[int, int] = (9, 0)
    mig: bool | None = None  # None: the GPU has no MIG
    migs: list[FakeMig | None] = field(default_factory=list)  # None: an empty slot
    power_mw: int = 350_000
    limit_mw: int = 700_000
    energy_mj: int = 1_000_000
    temperature: int = 41
    sm_mhz: int = 1980
    util: int = 37
    unsupported: set[str] = field(default_factory=set)


class FakeNvml:
    """The pynvml calls dlscale makes, over fake GPUs; errors are pynvml's own classes."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[FakeGpu], init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.inits = 0
        self.lost: set[int] = set()  # indices whose handle NVML cannot open

    def _check(self, handle: Any, call: str) -> None:
        if isinstance(handle, FakeGpu) and call in handle.unsupported:
            raise pynvml.NVMLError_NotSupported()

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if index in self.lost:
            raise pynvml.NVMLError_GpuIsLost()
        return self.gpus[index]

    def nvmlDeviceGetName(self, h: FakeGpu | FakeMig) -> str | bytes:
        return h.name

    def nvmlDeviceGetUUID(self, h: FakeGpu | FakeMig) -> str:
        return h.uuid

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu | FakeMig) -> SimpleNamespace:
        self._check(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=h.memory_total, used=h.memory_used)

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        return h.capability

    def nvmlDeviceGetMaxClockInfo(self, h: FakeGpu, kind: int) -> int:
        self._check(h, "nvmlDeviceGetMaxClockInfo")
        return h.sm_mhz if kind == 1 else 2619

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, kind: int) -> int:
        self._check(h, "nvmlDeviceGetClockInfo")
        return h.sm_mhz

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        self._check(h, "nvmlDeviceGetEnforcedPowerLimit")
        return h.limit_mw

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        self._check(h, "nvmlDeviceGetPowerUsage")
        return h.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        self._check(h, "nvmlDeviceGetTotalEnergyConsumption")
        h.energy_mj += 50_000  # the counter moves between reads
        return h.energy_mj

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        self._check(h, "nvmlDeviceGetTemperature")
        return h.temperature

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu | FakeMig) -> SimpleNamespace:
        if isinstance(h, FakeMig):
            raise pynvml.NVMLError_NotSupported()  # as real NVML answers for MIG devices
        self._check(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=h.util, memory=12)

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> list[int]:
        if h.mig is None:
            raise pynvml.NVMLError_NotSupported()
        return [int(h.mig), int(h.mig)]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        return 7 if h.mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, index: int) -> FakeMig:
        mig = h.migs[index] if index < len(h.migs) else None
        if mig is None:
            raise pynvml.NVMLError_NotFound()
        return mig

    def nvmlDeviceGetGpuInstanceId(self, h: FakeMig) -> int:
        return h.gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, h: FakeMig) -> int:
        return h.compute_instance


GIB = 1 << 30


def three_gpus() -> FakeNvml:
    """An H100 with MIG on (two instances, one empty slot between), an A100 with MIG off, a T4."""
    h100 = FakeGpu(
        name="NVIDIA H100 80GB HBM3",
        uuid="GPU-h100",
        memory_total=81559 * 2**20,
        mig=True,
        migs=[
            FakeMig("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "MIG-aaa", 40 * GIB, 2 * GIB, 1, 0),
            None,
            FakeMig("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "MIG-bbb", 10 * GIB, 1 * GIB, 9, 0),
        ],
    )
    a100 = FakeGpu(
        name=b"NVIDIA A100-SXM4-40GB",  # older pynvml returns bytes
        uuid="GPU-a100",
        memory_total=40 * GIB,
        capability=(8, 0),
        mig=False,
    )
    t4 = FakeGpu(
        name="Tesla T4",
        uuid="GPU-t4",
        memory_total=15 * GIB,
        capability=(7, 5),
        unsupported={"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerUsage"},
    )
    return FakeNvml([h100, a100, t4])
