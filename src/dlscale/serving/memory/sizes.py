"""Byte sizes and per-device budgets as an operator writes them: `cpu=8GiB,gpu0=60GiB`."""

from __future__ import annotations

import re
from collections.abc import Mapping

from dlscale.errors import ConfigError
from dlscale.types import cuda_index

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")
_DEVICE = re.compile(r"cpu|gpu[0-9]+")

#: Bytes each device may hold, by device key (`cpu`, `gpu0`, ...).
Budget = dict[str, int]
#: Bytes a loaded model holds, by device key.
Footprint = dict[str, int]


def parse_size(text: str | int) -> int:
    """`8GiB`, `512MB`, `1048576` as bytes; a ConfigError names what is wrong."""
    if isinstance(text, int):
        if text < 0:
            raise ConfigError(f"memory size {text}: 0 or more bytes")
        return text
    match = _SIZE.fullmatch(text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS:
        raise ConfigError(
            f"memory size {text!r}: expected a number and a unit (B, KB, MB, GB, KiB, MiB, GiB)"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def parse_budget(text: str) -> Budget:
    """`cpu=8GiB,gpu0=60GiB` as {device key: bytes}; an empty text is no budget."""
    budget: Budget = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, size = part.partition("=")
        key = device_key(key.strip()) if sep else ""
        if not sep or not _DEVICE.fullmatch(key):
            raise ConfigError(
                f"memory budget {part!r}: expected DEVICE=SIZE with DEVICE cpu or gpuN "
                "(e.g. cpu=8GiB,gpu0=60GiB)"
            )
        if key in budget:
            raise ConfigError(f"memory budget: device {key!r} is named twice")
        budget[key] = parse_size(size)
    return budget


def parse_limit(model: str, limit: Mapping[str, str | int]) -> Footprint:
    """A model's `[memory] limit` as {device key: bytes}; a ConfigError names the model."""
    out: Footprint = {}
    for key, size in limit.items():
        device = device_key(key)
        if not _DEVICE.fullmatch(device):
            raise ConfigError(
                f"model {model!r}: [memory] limit names device {key!r}: expected cpu or gpuN"
            )
        try:
            out[device] = parse_size(size)
        except ConfigError as exc:
            raise ConfigError(f"model {model!r}: [memory] limit: {exc}") from None
    return out


def device_key(device: str) -> str:
    """The budget's name of an instance's device: cpu, cuda:N -> gpuN (cuda -> gpu0); a MIG
    instance counts on its own key (its UUID)."""
    index = cuda_index(device)
    return device if index is None else f"gpu{index}"


def show(size: int) -> str:
    """A size as a person reads it: 1.5 GiB, 12.0 MiB, 300 B."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def show_all(sizes: Mapping[str, int]) -> str:
    """{device: bytes} as `cpu 12.0 MiB, gpu0 1.5 GiB`."""
    return ", ".join(f"{k} {show(v)}" for k, v in sorted(sizes.items())) or "nothing"
