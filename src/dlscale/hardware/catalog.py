"""The accelerator catalog: catalog.toml read into DeviceSpecs, lookup by name, NVML matching."""

from __future__ import annotations

import difflib
import functools
import re
import tomllib
from collections.abc import Iterator, Mapping
from importlib import resources
from typing import Any

from dlscale.errors import ConfigError, NotFound
from dlscale.hardware.cpu import cpu_spec
from dlscale.hardware.spec import PRECISIONS, DeviceSpec, Interconnect, MigProfile

_TERA = 1e12
_GIGA = 1e9


class Catalog:
    """Devices by name; lookups ignore case and accept aliases (`h100` is `H100-SXM`)."""

    def __init__(self, devices: Mapping[str, DeviceSpec]) -> None:
        self._devices = dict(devices)
        self._index: dict[str, str] = {}
        for spec in self._devices.values():
            for key in (spec.name, *spec.aliases):
                self._index.setdefault(_key(key), spec.name)

    def get(self, name: str) -> DeviceSpec:
        """The entry called `name` (or an alias); NotFound lists close names."""
        found = self._index.get(_key(name))
        if found is None:
            close = difflib.get_close_matches(_key(name), list(self._index), n=4, cutoff=0.5)
            if close:
                hint = "did you mean: " + ", ".join(sorted({self._index[c] for c in close}))
            else:
                hint = "known: " + ", ".join(self._devices)
            raise NotFound(f"no device {name!r} in the catalog; {hint}")
        return self._devices[found]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _key(name) in self._index

    def __iter__(self) -> Iterator[DeviceSpec]:
        return iter(self._devices.values())


@functools.cache
def load_catalog() -> Catalog:
    """The shipped catalog plus an entry for this host's CPU (read once, then cached)."""
    text = resources.files("dlscale.hardware").joinpath("catalog.toml").read_text()
    devices = parse_catalog(tomllib.loads(text))
    cpu = cpu_spec()
    devices[cpu.name] = cpu
    return Catalog(devices)


def match(gpu_name: str, memory_bytes: float | None = None) -> DeviceSpec | None:
    """The catalog entry for a name as NVML reports it; memory settles variants (A100 40/80GB)."""
    name = gpu_name.lower()
    candidates = [
        spec
        for spec in load_catalog()
        if any(re.search(pattern, name) for pattern in spec.nvml_patterns)
    ]
    if len(candidates) > 1 and memory_bytes:
        return min(candidates, key=lambda s: abs((s.memory_bytes or 0) - memory_bytes))
    return candidates[0] if candidates else None


def parse_catalog(data: Mapping[str, Any]) -> dict[str, DeviceSpec]:
    """DeviceSpecs from the parsed TOML; ConfigError names the entry and field at fault."""
    migs = data.get("mig", {})
    devices: dict[str, DeviceSpec] = {}
    for name, entry in data.get("devices", {}).items():
        try:
            devices[name] = _device(name, entry, migs, devices)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"catalog entry {name!r}: {exc}") from exc
    return devices


def _device(
    name: str,
    entry: Mapping[str, Any],
    migs: Mapping[str, Mapping[str, Any]],
    known: Mapping[str, DeviceSpec],
) -> DeviceSpec:
    sources = dict(entry.get("sources", {}))
    dense = _rates(entry.get("dense", {}))
    member: DeviceSpec | None = None
    count = int(entry.get("count", 1))
    if "member" in entry:
        member = known[entry["member"]]
        for precision, rate in member.dense.items():
            if precision not in dense:
                dense[precision] = rate * count
                sources.setdefault(precision, f"derived: {count} x {member.name} ({precision})")
    memory = None
    if "memory_gb" in entry:
        memory = float(entry["memory_gb"]) * _GIGA
    elif "memory_gib" in entry:
        memory = float(entry["memory_gib"]) * 2**30
    bandwidth = scaled(entry.get("bandwidth_gbs"), _GIGA)
    if bandwidth is None and member is not None and member.memory_bandwidth:
        bandwidth = member.memory_bandwidth * count
        sources.setdefault("bandwidth", f"derived: {count} x {member.name} bandwidth")
    mig: tuple[MigProfile, ...] = ()
    if "mig" in entry:
        mig = _mig_set(migs[entry["mig"]])
        sources.setdefault("mig", migs[entry["mig"]]["source"])
    return DeviceSpec(
        name=name,
        vendor=entry["vendor"],
        kind=entry["kind"],
        architecture=entry.get("architecture", ""),
        form_factor=entry.get("form_factor", ""),
        dense=dense,
        sparse=_rates(entry.get("sparse", {})),
        memory_bytes=memory,
        memory_bandwidth=bandwidth,
        tdp_watts=scaled(entry.get("tdp_w"), 1.0),
        interconnect=_link(entry.get("interconnect")),
        host_link=_link(entry.get("host_link")),
        mig_profiles=mig,
        aliases=tuple(entry.get("aliases", ())),
        nvml_patterns=tuple(entry.get("nvml", ())),
        member=member.name if member else None,
        count=count,
        notes=entry.get("notes", ""),
        default_source=entry["source"],
        sources=sources,
    )


def _rates(table: Mapping[str, Any]) -> dict[str, float]:
    unknown = set(table) - set(PRECISIONS)
    if unknown:
        raise ValueError(f"unknown precision(s) {sorted(unknown)}")
    return {precision: float(value) * _TERA for precision, value in table.items()}


def _link(table: Mapping[str, Any] | None) -> Interconnect | None:
    if table is None:
        return None
    gen = table.get("generation")
    return Interconnect(
        table["kind"], str(gen) if gen is not None else None, scaled(table.get("gbs"), _GIGA)
    )


def _mig_set(table: Mapping[str, Any]) -> tuple[MigProfile, ...]:
    total = int(table["slices"])
    return tuple(
        MigProfile(p["name"], int(p["slices"]), total, float(p["memory_gb"]) * _GIGA, int(p["max"]))
        for p in table["profiles"]
    )


def scaled(value: Any, scale: float) -> float | None:
    """`value` times `scale` as a float; None where there is no value (a figure not given)."""
    return None if value is None else float(value) * scale


def _key(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())
