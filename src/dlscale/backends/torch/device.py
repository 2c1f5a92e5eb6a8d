"""Where a torch model runs: cpu, cuda:N, or a MIG instance made the process's only device."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

import torch

from dlscale.errors import ConfigError
from dlscale.types import DEVICE_EXPECTED, cuda_index, is_mig

VISIBLE = "CUDA_VISIBLE_DEVICES"


def resolve_device(
    device: str, environ: MutableMapping[str, str], cuda_initialized: bool
) -> tuple[str, str | None]:
    """(torch device name, CUDA_VISIBLE_DEVICES value to set before CUDA starts, or None).

    CUDA enumerates one MIG instance per process, chosen by CUDA_VISIBLE_DEVICES when CUDA
    initializes; it is then device 0. Once CUDA has started with another visible set, a MIG
    instance can no longer be reached from this process.
    """
    if device == "cpu":
        return "cpu", None
    index = cuda_index(device)
    if index is not None:
        return f"cuda:{index}", None
    if is_mig(device):
        visible = environ.get(VISIBLE)
        if visible == device:
            return "cuda:0", None
        if not cuda_initialized:
            return "cuda:0", device
        raise ConfigError(
            f"device {device!r}: CUDA is already initialized in this process with "
            f"{VISIBLE}={visible!r}, and a MIG instance must be the only visible device of the "
            "process that owns it; run one server process per MIG instance, started with "
            f"{VISIBLE}={device}"
        )
    raise ConfigError(f"device {device!r}: {DEVICE_EXPECTED}")


def place(device: str) -> torch.device:
    """The torch device for a config's device string, MIG visibility set first; checked."""
    name, visible = resolve_device(device, os.environ, torch.cuda.is_initialized())  # type: ignore[no-untyped-call]
    if visible is not None:
        os.environ[VISIBLE] = visible
    placed = torch.device(name)
    if placed.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {device!r}: this PyTorch ({torch.__version__}) sees no CUDA device; "
                "install a CUDA build of torch on a GPU machine, or use device 'cpu'"
            )
        count = torch.cuda.device_count()
        if (placed.index or 0) >= count:
            raise ConfigError(f"device {device!r}: this machine has {count} CUDA device(s)")
    return placed
