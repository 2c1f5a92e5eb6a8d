"""Serving capacity planner: the fewest devices of each kind that serve a load within a p99 SLO.

A batch's service time comes from a measured profile (scaled to other devices by the ratio of
their rooflines) or from the roofline divided by an efficiency factor; the queueing model then
finds, for each batching configuration, the highest per-device rate whose p99 holds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.errors import PlanError
from dlscale.hardware.catalog import load_catalog
from dlscale.hardware.roofline import Roofline
from dlscale.hardware.roofline import roofline as hardware_roofline
from dlscale.hardware.spec import DeviceSpec
from dlscale.plan.queueing import BatchingServer, ServiceTime, batching_policy, peak_rate

#: Share of the roofline a served model reaches by default. The best published MLPerf ResNet-50
#: INT8 Offline results reach 38-56% of the INT8 compute ceiling (H100 38%, H200 40%, L4 44%,
#: L40S 50%, A100 56%) with TensorRT and batches of 2048; an ordinary deployment does no better.
DEFAULT_EFFICIENCY = 0.4
DEFAULT_MAX_BATCH = 256


@dataclass(frozen=True)
class Workload:
    """What one inference costs: operations per sample, and bytes moved per sample at a batch."""

    name: str
    flops_per_sample: float
    bytes_per_sample: Callable[[str, int], float]


def roofline(device: DeviceSpec, workload: Workload, precision: str, batch: int) -> Roofline:
    """The device's roofline for this workload at `batch` (dlscale.hardware.roofline)."""
    return hardware_roofline(
        device, precision, workload.flops_per_sample, workload.bytes_per_sample(precision, batch)
    )


@dataclass(frozen=True)
class ServiceCurve:
    """Batch size → seconds on one device, the largest batch it covers, and how it was derived.

    `spread`: measured times over their mean (queueing.BatchingServer), empty when unknown.
    """

    device: DeviceSpec
    time: ServiceTime
    max_batch: int
    basis: str
    spread: tuple[float, ...] = ()


def roofline_curve(
    device: DeviceSpec,
    workload: Workload,
    precision: str,
    efficiency: float = DEFAULT_EFFICIENCY,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> ServiceCurve:
    """Service time from the roofline: b / (attainable rate at b × efficiency)."""
    if not 0 < efficiency <= 1:
        raise PlanError(f"efficiency must be in (0, 1], got {efficiency}")
    roofline(device, workload, precision, 1)  # fails early when the device lacks figures

    def time(b: int) -> float:
        return b / (roofline(device, workload, precision, b).attainable_rate * efficiency)

    bound = roofline(device, workload, precision, max_batch).bound
    basis = f"roofline x {efficiency:g} ({bound}-bound at batch {max_batch})"
    return ServiceCurve(device, time, max_batch, basis)


@dataclass(frozen=True)
class Profile:
    """A measured batch-size → service-time table of one model on one catalog device.

    The JSON it is read from: {"model": ..., "device": catalog name, "precision": ...,
    "batch_latency_s": {"1": seconds, "8": seconds, ...}}, and optionally
    "batch_latency_spread": [time / mean time of each measured run, ...].
    """

    model: str
    device: str
    precision: str
    batch_latency_s: Mapping[int, float]
    spread: tuple[float, ...] = ()

    @classmethod
    def load(cls, path: Path) -> Profile:
        """Read and check a profile file, or the `profile` of a `dlscale bench` report.json."""
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise PlanError(f"cannot read profile {path}: {exc}") from None
        if isinstance(raw, dict) and "batch_latency_s" not in raw and "profile" in raw:
            if not raw["profile"]:
                raise PlanError(
                    f"{path}: this bench report has no profile (no batch was timed: bench a "
                    "model in process, or a server with the statistics extension)"
                )
            raw = raw["profile"]
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: Any, source: str = "profile") -> Profile:
        """Check the fields of a parsed profile."""
        try:
            table = {int(b): float(t) for b, t in raw["batch_latency_s"].items()}
            if raw["device"] is None:
                raise ValueError("no catalog device named (a remote target's report?)")
            spread = tuple(float(f) for f in raw.get("batch_latency_spread") or ())
            model, device, precision = str(raw["model"]), str(raw["device"]), str(raw["precision"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PlanError(f"{source}: not a profile ({exc!r}); see docs/plan.md") from None
        if not table or min(table) < 1 or min(table.values()) <= 0:
            raise PlanError(f"{source}: batch sizes must be >= 1 and latencies > 0")
        if any(not 0 < f < math.inf for f in spread):
            raise PlanError(f"{source}: batch_latency_spread factors must be positive")
        return cls(model, device, precision, table, spread)

    def time(self, batch: int) -> float:
        """Measured seconds for `batch`: linear between measured sizes, the first size's below.

        Below the smallest measured size this is an upper bound (fewer rows rarely cost more);
        `plan serve` says so when the profile does not start at batch 1.
        """
        sizes = sorted(self.batch_latency_s)
        if batch > sizes[-1]:
            raise PlanError(f"profile covers batches up to {sizes[-1]}, not {batch}")
        times = [self.batch_latency_s[b] for b in sizes]
        return float(np.interp(batch, sizes, times))


def profile_curve(
    profile: Profile, measured_on: DeviceSpec, target: DeviceSpec, workload: Workload
) -> ServiceCurve:
    """The measured curve moved to `target`: times × (roofline here / roofline there) per batch.

    The measured spread of service times stays with the device it was measured on.
    """
    top = max(profile.batch_latency_s)
    if target.name == measured_on.name:
        return ServiceCurve(
            target, profile.time, top, f"measured on {profile.device}", profile.spread
        )
    p = profile.precision

    def time(b: int) -> float:
        here = roofline(measured_on, workload, p, b).attainable_rate
        return profile.time(b) * here / roofline(target, workload, p, b).attainable_rate

    src, dst = roofline(measured_on, workload, p, top), roofline(target, workload, p, top)
    basis = (
        f"measured on {profile.device} x {src.attainable_rate / dst.attainable_rate:.3g} "
        f"(roofline ratio at batch {top}: {src.bound}-bound there, {dst.bound}-bound here)"
    )
    return ServiceCurve(target, time, top, basis)  # the spread was this host's, not theirs


def curve_on(
    workload: Workload,
    profile: Profile | None,
    precision: str,
    efficiency: float | None = None,
    max_batch: int | None = None,
) -> Callable[[DeviceSpec], ServiceCurve]:
    """A device's service curve for `workload`: the measured profile moved to it, else its
    roofline at `precision` (the efficiency and max batch given, else the defaults)."""
    if profile is not None:
        measured = load_catalog().get(profile.device)
        return lambda device: profile_curve(profile, measured, device, workload)
    share, top = efficiency or DEFAULT_EFFICIENCY, max_batch or DEFAULT_MAX_BATCH
    return lambda device: roofline_curve(device, workload, precision, share, top)


@dataclass(frozen=True)
class DevicePlan:
    """The answer for one device kind; `devices` is None when no configuration holds the SLO."""

    device: str
    devices: int | None
    max_batch: int
    max_delay_s: float
    peak_rate_per_device: float
    power_watts: float | None
    cost_per_million: float | None
    basis: str


def _batch_sizes(top: int) -> list[int]:
    sizes = [1 << k for k in range(top.bit_length()) if 1 << k <= top]
    return sorted({*sizes, top})


def best_config(curve: ServiceCurve, p99_bound: float) -> tuple[float, int, float]:
    """(peak requests/s per device, max batch, max queue delay) of the best batcher settings.

    Delays are tried at 0 and half a batch time, in whole µs as config.toml takes them: a fixed
    grid (not one drawn from the SLO) keeps the answer monotone in the SLO.
    """
    best = (0.0, 1, 0.0)
    for b in _batch_sizes(curve.max_batch):
        s = curve.time(b)
        if s >= p99_bound or b / s <= best[0]:
            continue  # cannot hold the bound, or cannot beat the best even when saturated
        for delay in (0.0, s / 2):
            policy = batching_policy(b, delay)
            server = BatchingServer(curve.time, policy, service_spread=curve.spread)
            rate = peak_rate(server, p99_bound)
            if rate > best[0]:
                best = (rate, b, policy.max_queue_delay_s)
    return best


def plan_device(
    curve: ServiceCurve, qps: float, p99_bound: float, price_per_hour: float | None = None
) -> DevicePlan:
    """The fewest devices of the curve's kind serving `qps` within `p99_bound` seconds.

    Each device has its own queue and gets an equal share of a Poisson stream (a random split
    of a Poisson stream is Poisson), as behind a load balancer.
    """
    if qps <= 0:
        raise PlanError(f"load must be positive, got {qps} requests/s")
    rate, batch, delay = best_config(curve, p99_bound)
    devices = math.ceil(qps / rate) if rate > 0 else None
    tdp = curve.device.tdp_watts
    power = devices * tdp if devices is not None and tdp is not None else None
    cost = None
    if devices is not None and price_per_hour is not None:
        cost = devices * price_per_hour / (qps * 3600) * 1e6
    return DevicePlan(curve.device.name, devices, batch, delay, rate, power, cost, curve.basis)


def plan_serving(
    curves: Iterable[ServiceCurve],
    qps: float,
    p99_bound: float,
    prices: Mapping[str, float] | None = None,
) -> list[DevicePlan]:
    """One plan per device kind, cheapest (then fewest devices) first; unmeetable ones last."""
    prices = prices or {}
    plans = [plan_device(c, qps, p99_bound, prices.get(c.device.name)) for c in curves]
    return sorted(plans, key=lambda p: cheapest_first(p.devices, p.cost_per_million))


def cheapest_first(devices: int | None, cost: float | None) -> tuple[bool, float, float]:
    """A plan's sort key: cheapest (then fewest devices) first; the devices that cannot, last."""
    return (devices is None, cost or math.inf, devices or math.inf)
