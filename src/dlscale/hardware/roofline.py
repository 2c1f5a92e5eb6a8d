"""The roofline: the highest sample rate a device allows a model, and which limit sets it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dlscale.errors import InvalidInput, Unsupported
from dlscale.hardware.spec import DeviceSpec
from dlscale.types import Traffic


@dataclass(frozen=True)
class Roofline:
    """A model on a device at a precision: the compute and memory ceilings, in samples/s."""

    device: str
    precision: str
    flops_per_sample: float
    bytes_per_sample: float
    peak_flops: float
    memory_bandwidth: float | None
    compute_bound_rate: float
    memory_bound_rate: float  # inf when the device publishes no bandwidth or nothing is moved
    #: The batch the bytes were counted for (weights are read once per batch).
    batch: int = 1

    @property
    def attainable_rate(self) -> float:
        """min(compute ceiling, memory ceiling), samples/s."""
        return min(self.compute_bound_rate, self.memory_bound_rate)

    @property
    def bound(self) -> str:
        """ "compute" or "memory": the ceiling that applies."""
        return "compute" if self.compute_bound_rate <= self.memory_bound_rate else "memory"

    @property
    def arithmetic_intensity(self) -> float:
        """The model's FLOPs per byte moved (inf when no bytes are counted)."""
        return self.flops_per_sample / self.bytes_per_sample if self.bytes_per_sample else math.inf

    @property
    def ridge_point(self) -> float | None:
        """The device's FLOPs per byte where the two ceilings meet (None without a bandwidth)."""
        return self.peak_flops / self.memory_bandwidth if self.memory_bandwidth else None

    def share(self, measured_rate: float) -> float:
        """A measured rate as a fraction of the attainable rate (0.38 means 38%)."""
        return measured_rate / self.attainable_rate

    def to_dict(self, measured_rate: float | None = None) -> dict[str, Any]:
        """A JSON-ready view (infinite ceilings become None), with the share when given a rate."""
        out: dict[str, Any] = {
            "device": self.device,
            "precision": self.precision,
            "flops_per_sample": self.flops_per_sample,
            "bytes_per_sample": self.bytes_per_sample,
            "peak_flops": self.peak_flops,
            "memory_bandwidth": self.memory_bandwidth,
            "compute_bound_rate": self.compute_bound_rate,
            "memory_bound_rate": _finite(self.memory_bound_rate),
            "attainable_rate": self.attainable_rate,
            "bound": self.bound,
            "arithmetic_intensity": _finite(self.arithmetic_intensity),
            "ridge_point": self.ridge_point,
            "batch": self.batch,
        }
        if measured_rate is not None:
            out["measured_rate"] = measured_rate
            out["share"] = self.share(measured_rate)
        return out


def roofline(
    device: DeviceSpec,
    precision: str,
    flops_per_sample: float,
    bytes_per_sample: float,
    batch: int = 1,
) -> Roofline:
    """The roofline of a model (FLOPs and bytes per sample) on a device at a precision.

    `bytes_per_sample` is what one sample moves at `batch`: its activations and I/O, and its
    share of the weights (read once per batch); `batch_traffic` splits it so.
    """
    if not flops_per_sample > 0:
        raise InvalidInput(f"FLOPs per sample must be positive, got {flops_per_sample}")
    if not bytes_per_sample >= 0:
        raise InvalidInput(f"bytes per sample must be zero or more, got {bytes_per_sample}")
    peak = device.peak_flops(precision)
    if peak is None:
        have = ", ".join(device.dense) or "none"
        raise Unsupported(f"{device.name} publishes no dense {precision} peak (it has: {have})")
    bandwidth = device.memory_bandwidth
    memory_rate = bandwidth / bytes_per_sample if bandwidth and bytes_per_sample else math.inf
    return Roofline(
        device=device.name,
        precision=precision.lower(),
        flops_per_sample=flops_per_sample,
        bytes_per_sample=bytes_per_sample,
        peak_flops=peak,
        memory_bandwidth=bandwidth,
        compute_bound_rate=peak / flops_per_sample,
        memory_bound_rate=memory_rate,
        batch=batch,
    )


def batch_roofline(
    device: DeviceSpec, precision: str, flops_per_sample: float, traffic: Traffic, batch: int
) -> Roofline:
    """The roofline at one batch size."""
    return roofline(device, precision, flops_per_sample, traffic.per_sample(batch), batch)


#: Where no batch is compute-bound, the best is the smallest within this share of the highest.
BEST_SHARE = 0.99


def best_roofline(
    device: DeviceSpec, precision: str, flops_per_sample: float, traffic: Traffic
) -> Roofline:
    """The roofline at the smallest batch whose ceiling is the highest allowed (within 1%).

    Larger batches read the weights fewer times per sample, so the memory ceiling rises with
    the batch towards bandwidth / per-sample bytes; the best batch is where it meets the compute
    ceiling, or (when it never does) where it comes within 1% of that limit.
    """
    top = batch_roofline(device, precision, flops_per_sample, traffic, 1)
    bandwidth = top.memory_bandwidth
    if not bandwidth or not traffic.weight_bytes:
        return top  # the batch changes nothing
    # Compute-bound at some batch: the first batch there. Else the memory ceiling only nears
    # bandwidth / per-sample bytes: the first batch within 1% of it.
    target = top.compute_bound_rate
    if traffic.sample_bytes and bandwidth / traffic.sample_bytes <= target:
        target = BEST_SHARE * bandwidth / traffic.sample_bytes
    # bandwidth * b / (W + b * S) >= target  <=>  b >= target * W / (bandwidth - target * S)
    batch = math.ceil(target * traffic.weight_bytes / (bandwidth - target * traffic.sample_bytes))
    return batch_roofline(device, precision, flops_per_sample, traffic, max(1, batch))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
