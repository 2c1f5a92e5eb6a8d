"""MIG layouts: the smallest set of MIG instances of a catalog GPU that holds each tenant's SLO.

Each tenant (a model with its load and p99 objective) gets the MIG profile that serves it with
the fewest compute slices: for every profile the GPU cut to that profile (`DeviceSpec.mig`:
compute by its slices, bandwidth by its memory share) gets a service curve, and the serving
planner's queueing model (plan/serve.py, the batcher's own policy) says how many instances of
it hold the p99 at the load. The instances are then packed onto as few GPUs as their compute
and memory slices allow (first fit, largest first). On a host whose GPU has MIG instances
(NVML), `assign` maps the plan onto them: the device strings for config.toml.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dlscale.errors import PlanError
from dlscale.hardware.detect import GpuInfo
from dlscale.hardware.spec import DeviceSpec, MigProfile
from dlscale.plan.serve import ServiceCurve, plan_device

#: A tenant's service curve on a device (a MIG slice of the GPU).
CurveOn = Callable[[DeviceSpec], ServiceCurve]


@dataclass(frozen=True)
class MigTenant:
    """A model sharing the GPU: its load, its p99 objective, and how it costs on a device."""

    name: str
    qps: float
    p99_s: float
    curve_on: CurveOn
    memory_bytes: float = 0.0  # the least memory an instance needs (weights, activations)


@dataclass(frozen=True)
class Placement:
    """A tenant's MIG profile, how many instances of it, and its batcher settings there."""

    tenant: str
    profile: str
    instances: int
    compute_slices: int
    memory_slices: int
    peak_rate_per_instance: float
    max_batch: int
    max_delay_s: float
    basis: str


@dataclass
class MigGpu:
    """One GPU of the layout: the (tenant, profile) instances it holds."""

    instances: list[tuple[str, str]] = field(default_factory=list)
    compute_slices: int = 0
    memory_slices: int = 0


@dataclass(frozen=True)
class MigLayout:
    """The plan: each tenant's placement, the GPUs they pack onto, who cannot be held."""

    device: str
    placements: list[Placement]
    gpus: list[MigGpu]
    unplaceable: list[str]

    @property
    def compute_slices(self) -> int:
        """Compute slices the layout uses in all."""
        return sum(p.instances * p.compute_slices for p in self.placements)


def memory_slices(device: DeviceSpec) -> tuple[int, float]:
    """The GPU's memory slices and one slice's bytes (the smallest profile's memory)."""
    if not device.mig_profiles or not device.memory_bytes:
        raise PlanError(f"{device.name} has no MIG profiles in the catalog")
    unit = min(p.memory_bytes for p in device.mig_profiles)
    return round(device.memory_bytes / unit), unit


def place(device: DeviceSpec, tenant: MigTenant) -> Placement | None:
    """The profile serving the tenant with the fewest compute slices (then memory); None if none."""
    _, unit = memory_slices(device)
    best: Placement | None = None
    for profile in sorted(device.mig_profiles, key=lambda p: (p.slices, p.memory_bytes)):
        if best is not None and best.instances * best.compute_slices <= profile.slices:
            break  # one instance of this profile already costs as much as the best
        if profile.memory_bytes < tenant.memory_bytes:
            continue
        plan = plan_device(tenant.curve_on(device.mig(profile.name)), tenant.qps, tenant.p99_s)
        if plan.devices is None:
            continue
        found = Placement(
            tenant.name,
            profile.name,
            plan.devices,
            profile.slices,
            round(profile.memory_bytes / unit),
            plan.peak_rate_per_device,
            plan.max_batch,
            plan.max_delay_s,
            plan.basis,
        )
        if best is None or _cost(found) < _cost(best):
            best = found
    return best


def _cost(p: Placement) -> tuple[int, int]:
    return (p.instances * p.compute_slices, p.instances * p.memory_slices)


def pack(device: DeviceSpec, placements: Sequence[Placement]) -> list[MigGpu]:
    """The instances on as few GPUs as fit (first fit, largest first), within each GPU's
    compute slices, memory slices and per-profile instance limits."""
    total_memory, _ = memory_slices(device)
    limits = {p.name: p for p in device.mig_profiles}
    items = [(p.tenant, p.profile, p.compute_slices, p.memory_slices)
             for p in placements for _ in range(p.instances)]  # fmt: skip
    items.sort(key=lambda i: (-i[2], -i[3]))
    gpus: list[MigGpu] = []
    for tenant, profile, compute, memory in items:
        gpu = next(
            (g for g in gpus if _fits(g, limits[profile], compute, memory, total_memory)), None
        )
        if gpu is None:
            gpu = MigGpu()
            gpus.append(gpu)
        gpu.instances.append((tenant, profile))
        gpu.compute_slices += compute
        gpu.memory_slices += memory
    return gpus


def _fits(gpu: MigGpu, profile: MigProfile, compute: int, memory: int, total_memory: int) -> bool:
    same = sum(1 for _, name in gpu.instances if name == profile.name)
    return (
        gpu.compute_slices + compute <= profile.total_slices
        and gpu.memory_slices + memory <= total_memory
        and same < profile.max_instances
    )


def plan_mig(device: DeviceSpec, tenants: Sequence[MigTenant]) -> MigLayout:
    """Each tenant's smallest holding profile, packed onto GPUs of `device`."""
    if not tenants:
        raise PlanError("give at least one tenant")
    placements, unplaceable = [], []
    for tenant in tenants:
        found = place(device, tenant)
        if found is None:
            unplaceable.append(tenant.name)
        else:
            placements.append(found)
    return MigLayout(device.name, placements, pack(device, placements), unplaceable)


def assign(layout: MigLayout, gpu: GpuInfo) -> dict[str, list[str]] | None:
    """Each tenant's MIG instance UUIDs on a host GPU whose instances match the layout's first
    GPU profile for profile; None when they do not (the GPU must be partitioned first)."""
    if not layout.gpus or not gpu.mig_enabled:
        return None
    free = list(gpu.mig_instances)
    out: dict[str, list[str]] = {}
    for tenant, profile in layout.gpus[0].instances:
        match = next((m for m in free if m.profile == profile), None)
        if match is None:
            return None
        free.remove(match)
        out.setdefault(tenant, []).append(match.uuid)
    return out
