"""Where a run happened and what it was worth: host, device, packages, roofline, batch profile.

A figure that cannot be worked out (no catalog entry, a model the FLOP counter cannot read)
leaves its field empty with a note saying why, rather than failing the run.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import platform
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from dlscale.bench.targets import BatchTimes, ModelInfo
from dlscale.errors import DlscaleError
from dlscale.hardware.catalog import load_catalog
from dlscale.hardware.cpu import cpu_spec
from dlscale.hardware.detect import detect
from dlscale.hardware.roofline import best_roofline
from dlscale.models.flops import count_file

PACKAGES = (
    "dlscale",
    "numpy",
    "onnx",
    "onnxruntime",
    "mlcommons-loadgen",
    "aiohttp",
    "grpcio",
    "protobuf",
)


def host() -> dict[str, Any]:
    """The machine the bench ran on (and, with the hardware package, its CPU and GPUs)."""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "logical_cpus": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "hardware": detect().to_dict(),
    }


def packages() -> dict[str, str | None]:
    """Installed versions of the packages that shape the figures."""
    versions: dict[str, str | None] = dict.fromkeys(PACKAGES)
    for name in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return versions


def now() -> str:
    """The date and time, UTC, ISO 8601."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def device_name(infos: Iterable[ModelInfo | None]) -> str | None:
    """The catalog name of the device that computed: this host's first GPU when any of the
    models ran on a GPU (a device other than the CPU), else its CPU."""
    if any(d != "cpu" for info in infos if info for d in info.devices):
        gpus = detect().gpus
        return str(gpus[0].catalog) if gpus and gpus[0].catalog else None
    return cpu_spec().name


def roofline(
    model_file: Path | None, device: str | None, precision: str, measured_rate: float | None
) -> dict[str, Any]:
    """FLOPs per sample of the model and the share of the device's roofline the rate reached."""
    out: dict[str, Any] = {"flops_per_sample": None, "device": device, "precision": precision}
    if model_file is None:
        out["note"] = "the model file is not readable from here (give --repo or --reference)"
        return out
    try:
        cost = count_file(model_file)
    except Exception as exc:  # a gap in the report, not a failed run (parsers raise anything)
        out["note"] = f"FLOPs not counted: {type(exc).__name__}: {exc}"
        return out
    out["flops_per_sample"] = float(cost.flops)
    if device is None:
        out["note"] = "no catalog entry for the device: share of roofline not computed"
        return out
    try:
        spec = load_catalog().get(device)
        # The server batches as it likes: the share is of the ceiling at the best batch, the
        # highest any batch allows, so that it never passes 100%.
        roof = best_roofline(spec, precision, float(cost.flops), cost.traffic(precision))
        out.update(roof.to_dict(measured_rate))
    except DlscaleError as exc:  # e.g. the device publishes no peak at this precision
        out["note"] = f"roofline not computed: {exc}"
    return out


def profile(
    model: str,
    device: str | None,
    precision: str,
    before: BatchTimes | None,
    after: BatchTimes | None,
) -> dict[str, Any] | None:
    """Mean service time per batch size during the run (for the capacity planner)."""
    if after is None:
        return None
    before = before or {}
    latency: dict[str, float] = {}
    for size, (count, ns) in sorted(after.items()):
        count0, ns0 = before.get(size, (0, 0))
        if count > count0:
            latency[str(size)] = (ns - ns0) / (count - count0) / 1e9
    if not latency:
        return None
    return {"model": model, "device": device, "precision": precision, "batch_latency_s": latency}
