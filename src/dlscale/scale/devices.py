"""Which devices `dlscale serve --device-workers SPEC` puts a worker process on.

A worker sees one device: a GPU, or a MIG slice, named to CUDA by its UUID in
CUDA_VISIBLE_DEVICES (a process sees one slice at most, which is why a slice needs a process of
its own). SPEC is `auto` (each GPU NVML sees, or each MIG slice of a GPU with MIG on), a count
N (N workers spread over those devices in turn, or N processes on the CPU where there is no GPU)
or a list (`gpu0,gpu1`, GPU-... and MIG-... UUIDs; a GPU with MIG on stands for its slices).

The host's GPUs are handed in (hardware/detect.py's answer, read by the command line): this
module only reads their fields, so a test gives it NVML stand-ins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from dlscale.errors import ConfigError

#: The environment variable naming a worker's device, for its logs and the user's own code.
DEVICE_ENV = "DLSCALE_DEVICE"
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


class MigSlice(Protocol):
    """What is read of a MIG instance (hardware.detect.MigInstance)."""

    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str: ...


class Gpu(Protocol):
    """What is read of a GPU (hardware.detect.GpuInfo)."""

    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str: ...
    @property
    def mig_enabled(self) -> bool | None: ...
    @property
    def mig_instances(self) -> Sequence[MigSlice]: ...


class Host(Protocol):
    """What is read of the host (hardware.detect.HostInfo): its GPUs, and NVML's state."""

    @property
    def gpus(self) -> Sequence[Gpu]: ...
    @property
    def nvml(self) -> str: ...


@dataclass(frozen=True)
class Device:
    """One worker's device: its name (gpu0, gpu0.mig2, cpu1) and what CUDA is shown."""

    name: str
    #: The UUID put in CUDA_VISIBLE_DEVICES; None leaves the environment as it is (CPU).
    visible: str | None = None

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The worker's environment: `base`, its device named, and CUDA shown only that one."""
        env = {**base, DEVICE_ENV: self.name}
        if self.visible is not None:
            env[VISIBLE_ENV] = self.visible
        return env


def visible_devices(host: Host) -> list[Device]:
    """Each GPU with MIG off, and each MIG slice of a GPU with MIG on (a lost GPU is left out)."""
    return [device for gpu in host.gpus for device in _devices(gpu)]


def _devices(gpu: Gpu) -> list[Device]:
    if gpu.mig_enabled:
        return [Device(f"gpu{gpu.index}.mig{m.index}", m.uuid) for m in gpu.mig_instances]
    return [Device(f"gpu{gpu.index}", gpu.uuid)] if gpu.uuid else []


def devices_for(spec: str, host: Host) -> list[Device]:
    """The devices of `--device-workers SPEC`, one per worker; a ConfigError says what is wrong."""
    text = spec.strip()
    if text == "auto":
        return _auto(host)
    if text.isdigit():
        return _counted(int(text), host)
    return _listed([item.strip() for item in text.split(",")], host)


def _auto(host: Host) -> list[Device]:
    found = visible_devices(host)
    if not found:
        mig_without_slices = any(g.mig_enabled and not g.mig_instances for g in host.gpus)
        why = "MIG is on and no slice is made" if mig_without_slices else f"NVML: {host.nvml}"
        raise ConfigError(
            f"--device-workers auto: no GPU or MIG slice is visible ({why}); give a count "
            "(--device-workers 4) for worker processes on the CPU"
        )
    return found


def _counted(count: int, host: Host) -> list[Device]:
    """N workers over the visible devices in turn (gpu0, gpu1, gpu0#2...), or N on the CPU."""
    if count < 1:
        raise ConfigError("--device-workers 0: one worker or more (or auto)")
    found = visible_devices(host)
    if not found:
        return [Device(f"cpu{i}") for i in range(count)]
    workers = []
    for i in range(count):
        device, turn = found[i % len(found)], i // len(found)
        name = device.name if turn == 0 else f"{device.name}#{turn + 1}"
        workers.append(Device(name, device.visible))
    return workers


def _listed(items: list[str], host: Host) -> list[Device]:
    """gpuK (a GPU with MIG on: its slices) and UUIDs, each known to NVML, none twice."""
    known = {d.visible: d for d in visible_devices(host) if d.visible}
    picked: list[Device] = []
    for item in items:
        if item in known:
            picked.append(known[item])
        elif item.startswith("gpu") and item[3:].isdigit():
            picked += _gpu(int(item[3:]), host)
        else:
            shown = ", ".join(f"{d.name} ({d.visible})" for d in known.values()) or "none"
            raise ConfigError(
                f"--device-workers: {item!r} is not a device of this host; expected gpuK or a "
                f"GPU-/MIG- UUID that NVML lists (visible: {shown}; NVML: {host.nvml})"
            )
    names = [d.name for d in picked]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(
            f"--device-workers names {', '.join(twice)} twice; a count (--device-workers N) "
            "puts more than one worker on a device"
        )
    return picked


def _gpu(index: int, host: Host) -> list[Device]:
    for gpu in host.gpus:
        if gpu.index == index and (gpu.uuid or gpu.mig_enabled):
            if gpu.mig_enabled and not gpu.mig_instances:
                raise ConfigError(f"--device-workers: gpu{index} has MIG on and no slice made")
            return _devices(gpu)
    raise ConfigError(
        f"--device-workers: gpu{index} is not on this host ({len(host.gpus)} GPUs; NVML: "
        f"{host.nvml})"
    )
