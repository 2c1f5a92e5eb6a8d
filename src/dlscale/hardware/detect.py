"""What this host has: its CPU and, through NVML, its GPUs and their MIG instances."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from dlscale.hardware.catalog import match
from dlscale.hardware.cpu import CpuInfo, read_cpu
from dlscale.hardware.nvml import CLOCK_MEM, CLOCK_SM, Nvml, NvmlUnavailable

_MIG_PROFILE = re.compile(r"(\d+g\.\d+gb(?:\+me)?)")
_MIG_ENABLED = 1


@dataclass(frozen=True)
class MigInstance:
    """One MIG device: its UUID (what CUDA_VISIBLE_DEVICES takes), profile and memory."""

    index: int
    uuid: str
    name: str
    profile: str | None
    memory_bytes: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as NVML reports it, matched to its catalog entry."""

    index: int
    name: str
    uuid: str
    memory_bytes: int | None
    compute_capability: str | None
    sm_clock_max_mhz: int | None
    memory_clock_max_mhz: int | None
    power_limit_watts: float | None
    mig_enabled: bool | None  # None: the GPU has no MIG
    mig_instances: tuple[MigInstance, ...] = ()
    catalog: str | None = None
    unanswered: tuple[str, ...] = ()  # the NVML calls that gave no answer, with the reason


@dataclass(frozen=True)
class HostInfo:
    """The CPU, the GPUs (empty without NVML), the driver, and what NVML said when asked."""

    cpu: CpuInfo
    gpus: tuple[GpuInfo, ...] = ()
    driver_version: str | None = None
    nvml: str = "ok"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            **self.__dict__,
            "cpu": self.cpu.to_dict(),
            "gpus": [asdict(g) for g in self.gpus],
        }


def detect(lib: Any | None = None) -> HostInfo:
    """The host's CPU and GPUs; without a GPU or NVML a CPU-only answer, never an exception."""
    cpu = read_cpu()
    try:
        nvml = Nvml.open(lib)
    except NvmlUnavailable as exc:
        return HostInfo(cpu=cpu, nvml=f"unavailable: {exc}")
    try:
        count = nvml.ask("nvmlDeviceGetCount")
        if not count.ok:
            return HostInfo(cpu=cpu, nvml=f"unavailable: {count.why}")
        gpus = tuple(_gpu(nvml, index) for index in range(int(count.value)))
        return HostInfo(cpu=cpu, gpus=gpus, driver_version=nvml.value("nvmlSystemGetDriverVersion"))
    finally:
        nvml.close()


def _gpu(nvml: Nvml, index: int) -> GpuInfo:
    got = nvml.ask("nvmlDeviceGetHandleByIndex", index)
    if not got.ok:  # a GPU NVML counts but cannot open (lost, or no permission): say so
        return GpuInfo(index, f"GPU {index}", "", None, None, None, None, None, None,
                       unanswered=(str(got.why),))  # fmt: skip
    handle = got.value
    answers = {
        call: nvml.ask(call, handle)
        for call in (
            "nvmlDeviceGetName",
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetCudaComputeCapability",
            "nvmlDeviceGetEnforcedPowerLimit",
            "nvmlDeviceGetMigMode",
        )
    }
    answers["sm_clock"] = nvml.ask("nvmlDeviceGetMaxClockInfo", handle, CLOCK_SM)
    answers["mem_clock"] = nvml.ask("nvmlDeviceGetMaxClockInfo", handle, CLOCK_MEM)
    name = answers["nvmlDeviceGetName"].value or f"GPU {index}"
    memory = answers["nvmlDeviceGetMemoryInfo"].value
    total = int(memory.total) if memory is not None else None
    capability = answers["nvmlDeviceGetCudaComputeCapability"].value
    limit_mw = answers["nvmlDeviceGetEnforcedPowerLimit"].value
    mig_mode = answers["nvmlDeviceGetMigMode"].value
    mig_enabled = None if mig_mode is None else int(mig_mode[0]) == _MIG_ENABLED
    spec = match(name, total)
    return GpuInfo(
        index=index,
        name=name,
        uuid=answers["nvmlDeviceGetUUID"].value or "",
        memory_bytes=total,
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
        sm_clock_max_mhz=answers["sm_clock"].value,
        memory_clock_max_mhz=answers["mem_clock"].value,
        power_limit_watts=limit_mw / 1000 if limit_mw is not None else None,
        mig_enabled=mig_enabled,
        mig_instances=_mig_instances(nvml, handle) if mig_enabled else (),
        catalog=spec.name if spec else None,
        unanswered=tuple(a.why for a in answers.values() if a.why is not None),
    )


def mig_handles(nvml: Nvml, handle: Any) -> list[tuple[int, Any]]:
    """The (index, handle) of each MIG device present on a GPU (empty slots are skipped)."""
    slots = nvml.value("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    asked = [nvml.ask("nvmlDeviceGetMigDeviceHandleByIndex", handle, s) for s in range(int(slots))]
    return [(slot, mig.value) for slot, mig in enumerate(asked) if mig.ok]


def _mig_instances(nvml: Nvml, handle: Any) -> tuple[MigInstance, ...]:
    instances = []
    for slot, mig in mig_handles(nvml, handle):
        name = nvml.value("nvmlDeviceGetName", mig) or ""
        profile = _MIG_PROFILE.search(name)
        memory = nvml.value("nvmlDeviceGetMemoryInfo", mig)
        instances.append(
            MigInstance(
                index=slot,
                uuid=nvml.value("nvmlDeviceGetUUID", mig) or "",
                name=name,
                profile=profile.group(1) if profile else None,
                memory_bytes=int(memory.total) if memory is not None else None,
                gpu_instance_id=nvml.value("nvmlDeviceGetGpuInstanceId", mig),
                compute_instance_id=nvml.value("nvmlDeviceGetComputeInstanceId", mig),
            )
        )
    return tuple(instances)
