"""The host CPU as a catalog entry, its peaks computed from cores, clock and vector units.

FP32 peak = cores x GHz x FMA units x FP32 lanes x 2 (an FMA is two FLOPs); docs/hardware.md gives
the rest of the formula and its assumptions.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from dlscale.hardware.spec import DeviceSpec

#: AMX tile unit rates per core per cycle (Intel Architectures Optimization Reference Manual, AMX).
_AMX_BF16_FLOP_PER_CYCLE = 1024
_AMX_INT8_OP_PER_CYCLE = 2048


@dataclass(frozen=True)
class CpuInfo:
    """What the host reports about its CPU."""

    model: str
    arch: str
    vendor: str
    family: int | None
    physical_cores: int
    logical_cores: int
    ghz: float | None
    ghz_from: str
    flags: frozenset[str]
    memory_bytes: int

    @property
    def vector(self) -> str:
        """The widest vector extension: avx512, avx2, sse, neon, or scalar."""
        if "avx512f" in self.flags:
            return "avx512"
        if "avx2" in self.flags:
            return "avx2"
        if "sse2" in self.flags:
            return "sse"
        if "asimd" in self.flags or "neon" in self.flags:
            return "neon"
        return "scalar"

    @property
    def fp32_lanes(self) -> int:
        """FP32 elements in one vector register of the widest extension."""
        return {"avx512": 16, "avx2": 8, "sse": 4, "neon": 4}.get(self.vector, 1)

    @property
    def fma_units(self) -> int:
        """Full-width FMA issues per cycle: 2 on most server cores since Haswell (an assumption)."""
        if self.vector == "scalar":
            return 1
        # Zen 3/4 (family 0x19) runs 512-bit ops on two 256-bit pipes: one 512-bit FMA per cycle.
        if self.vendor == "AuthenticAMD" and self.family == 0x19 and self.vector == "avx512":
            return 1
        return 2

    @property
    def amx(self) -> bool:
        """Whether Intel AMX tiles are present (amx_tile with amx_bf16 or amx_int8)."""
        return "amx_tile" in self.flags

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "model": self.model,
            "arch": self.arch,
            "vendor": self.vendor,
            "physical_cores": self.physical_cores,
            "logical_cores": self.logical_cores,
            "ghz": self.ghz,
            "ghz_from": self.ghz_from,
            "vector": self.vector,
            "fp32_lanes": self.fp32_lanes,
            "fma_units": self.fma_units,
            "amx": self.amx,
            "vnni": bool({"avx512_vnni", "avx_vnni"} & self.flags),
            "memory_bytes": self.memory_bytes,
        }


def read_cpu(cpuinfo: str | None = None) -> CpuInfo:
    """The host's CPU from /proc/cpuinfo and psutil; `cpuinfo` text may be given instead."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    fields = _first_block(cpuinfo)
    flags = frozenset((fields.get("flags") or fields.get("features") or "").split())
    model = fields.get("model name") or fields.get("hardware") or platform.processor() or "unknown"
    family = fields.get("cpu family")
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    ghz, ghz_from = _clock(fields, model)
    return CpuInfo(
        model=model,
        arch=platform.machine(),
        vendor=fields.get("vendor_id", ""),
        family=int(family) if family and family.isdigit() else None,
        physical_cores=physical,
        logical_cores=logical,
        ghz=ghz,
        ghz_from=ghz_from,
        flags=flags,
        memory_bytes=psutil.virtual_memory().total,
    )


def cpu_spec(info: CpuInfo | None = None) -> DeviceSpec:
    """The catalog entry for a CPU: peaks from the formula, memory from the host."""
    info = info or read_cpu()
    how = (
        f"computed at run time: {info.physical_cores} cores x {info.ghz} GHz ({info.ghz_from})"
        f" x {info.fma_units} FMA x {info.fp32_lanes} FP32 lanes ({info.vector}) x 2;"
        " formula in docs/hardware.md"
    )
    dense: dict[str, float] = {}
    sources: dict[str, str] = {"memory": "psutil.virtual_memory().total"}
    if info.ghz:
        cycles = info.physical_cores * info.ghz * 1e9
        fp32 = cycles * info.fma_units * info.fp32_lanes * 2
        dense["fp32"] = fp32
        dense["fp64"] = fp32 / 2
        if "avx512_bf16" in info.flags:
            dense["bf16"] = fp32 * 2
            sources["bf16"] = f"{how}; bf16 = 2 x fp32 (avx512_bf16 dot products)"
        if "avx512_fp16" in info.flags:
            dense["fp16"] = fp32 * 2
            sources["fp16"] = f"{how}; fp16 = 2 x fp32 (avx512_fp16)"
        if {"avx512_vnni", "avx_vnni"} & info.flags:
            dense["int8"] = fp32 * 4
            sources["int8"] = f"{how}; int8 = 4 x fp32 (VNNI: 4 int8 products per 32-bit lane)"
        if info.amx and "amx_bf16" in info.flags:
            dense["bf16"] = cycles * _AMX_BF16_FLOP_PER_CYCLE
            sources["bf16"] = f"{how}; bf16 = cores x GHz x 1024 (AMX-BF16)"
        if info.amx and "amx_int8" in info.flags:
            dense["int8"] = cycles * _AMX_INT8_OP_PER_CYCLE
            sources["int8"] = f"{how}; int8 = cores x GHz x 2048 (AMX-INT8)"
    return DeviceSpec(
        name="CPU",
        vendor=info.vendor or "host",
        kind="cpu",
        architecture=info.arch,
        form_factor=info.model,
        dense=dense,
        memory_bytes=float(info.memory_bytes),
        aliases=("cpu", "host"),
        notes="Memory bandwidth and TDP are not reported by the host; give --bytes 0 or a GPU.",
        default_source=how,
        sources=sources,
    )


def _first_block(text: str) -> dict[str, str]:
    """The `key: value` lines of the first processor block, keys lower-cased."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break
            continue
        key, _, value = line.partition(":")
        out.setdefault(key.strip().lower(), value.strip())
    return out


def _clock(fields: dict[str, str], model: str) -> tuple[float | None, str]:
    """The clock to use: psutil's maximum, the GHz in the model name, or the current clock."""
    freq = psutil.cpu_freq()
    if freq is not None and freq.max > 0:
        return round(freq.max / 1000, 3), "maximum clock (psutil)"
    named = re.search(r"@\s*([\d.]+)\s*GHz", model)
    if named:
        return float(named.group(1)), "clock in the model name"
    mhz = fields.get("cpu mhz")
    if mhz:
        return round(float(mhz) / 1000, 3), "current clock (/proc/cpuinfo)"
    if freq is not None and freq.current > 0:
        return round(freq.current / 1000, 3), "current clock (psutil)"
    return None, "not reported"
