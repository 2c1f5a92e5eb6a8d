"""One accelerator: peak rates per precision, memory, power, links, MIG profiles, sources."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dlscale.errors import InvalidInput

#: Precisions a peak can be given for, widest first.
PRECISIONS: tuple[str, ...] = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4")


@dataclass(frozen=True)
class Interconnect:
    """A link: kind (nvlink, pcie, ici ...), generation, and bandwidth in bytes/s as quoted."""

    kind: str
    generation: str | None = None
    bandwidth: float | None = None

    def __str__(self) -> str:
        gen = f" {self.generation}" if self.generation else ""
        bw = f", {self.bandwidth / 1e9:g} GB/s" if self.bandwidth else ""
        return f"{self.kind}{gen}{bw}"


@dataclass(frozen=True)
class MigProfile:
    """A Multi-Instance GPU profile: name (1g.10gb), compute slices, memory, instance limit."""

    name: str
    slices: int
    total_slices: int
    memory_bytes: float
    max_instances: int

    @property
    def compute_fraction(self) -> float:
        """Share of the GPU's compute engines this profile gets."""
        return self.slices / self.total_slices


@dataclass(frozen=True)
class DeviceSpec:
    """One catalog entry; a figure is None when the vendor publishes none."""

    name: str
    vendor: str
    kind: str  # gpu | tpu | soc | system | cpu
    architecture: str = ""
    form_factor: str = ""
    dense: Mapping[str, float] = field(default_factory=dict)  # FLOP/s (OP/s for ints)
    sparse: Mapping[str, float] = field(default_factory=dict)
    memory_bytes: float | None = None
    memory_bandwidth: float | None = None  # bytes/s
    tdp_watts: float | None = None
    interconnect: Interconnect | None = None
    host_link: Interconnect | None = None
    mig_profiles: tuple[MigProfile, ...] = ()
    aliases: tuple[str, ...] = ()
    nvml_patterns: tuple[str, ...] = ()
    member: str | None = None
    count: int = 1
    notes: str = ""
    default_source: str = ""
    sources: Mapping[str, str] = field(default_factory=dict)

    def peak_flops(self, precision: str, *, sparse: bool = False) -> float | None:
        """Peak FLOP/s (OP/s for int8 and int4) at a precision; dense unless asked for sparse."""
        key = precision.lower()
        if key not in PRECISIONS:
            raise InvalidInput(f"unknown precision {precision!r}; one of {', '.join(PRECISIONS)}")
        return (self.sparse if sparse else self.dense).get(key)

    def source(self, field: str) -> str:
        """Where a figure came from: `fp32`, `sparse.int8`, `memory`, `bandwidth`, `tdp` ..."""
        return self.sources.get(field, self.default_source)

    def figures(self) -> list[str]:
        """The source field name of every published figure (what the sources describe)."""
        named = {
            "memory": self.memory_bytes,
            "bandwidth": self.memory_bandwidth,
            "tdp": self.tdp_watts,
            "interconnect": self.interconnect,
            "host_link": self.host_link,
            "mig": self.mig_profiles or None,
        }
        sparse = [f"sparse.{k}" for k in self.sparse]
        return [*self.dense, *sparse, *(name for name, v in named.items() if v is not None)]

    def mig(self, profile: str) -> DeviceSpec:
        """This GPU cut to one MIG profile: compute by its slices, bandwidth by its memory share."""
        found = {p.name: p for p in self.mig_profiles}.get(profile)
        if found is None:
            known = ", ".join(p.name for p in self.mig_profiles) or "none"
            raise ValueError(f"{self.name} has no MIG profile {profile!r} (profiles: {known})")
        share = found.compute_fraction
        mem_share = found.memory_bytes / self.memory_bytes if self.memory_bytes else share
        how = (
            f"{self.name} scaled to MIG {found.name}: "
            f"compute x{share:.3f}, bandwidth x{mem_share:.3f}"
        )
        return replace(
            self,
            name=f"{self.name}/{found.name}",
            dense={k: v * share for k, v in self.dense.items()},
            sparse={k: v * share for k, v in self.sparse.items()},
            memory_bytes=found.memory_bytes,
            memory_bandwidth=self.memory_bandwidth * mem_share if self.memory_bandwidth else None,
            tdp_watts=None,
            mig_profiles=(),
            default_source=how,
            sources={},
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view, figures in SI units with their sources."""
        return {
            "name": self.name,
            "vendor": self.vendor,
            "kind": self.kind,
            "architecture": self.architecture,
            "form_factor": self.form_factor,
            "aliases": list(self.aliases),
            "dense_flops": dict(self.dense),
            "sparse_flops": dict(self.sparse),
            "memory_bytes": self.memory_bytes,
            "memory_bandwidth_bytes_per_s": self.memory_bandwidth,
            "tdp_watts": self.tdp_watts,
            "interconnect": _link_dict(self.interconnect),
            "host_link": _link_dict(self.host_link),
            "mig_profiles": [
                {
                    "name": p.name,
                    "compute_slices": f"{p.slices}/{p.total_slices}",
                    "memory_bytes": p.memory_bytes,
                    "max_instances": p.max_instances,
                }
                for p in self.mig_profiles
            ],
            "member": self.member,
            "count": self.count,
            "notes": self.notes,
            "sources": {name: self.source(name) for name in self.figures()},
        }


def _link_dict(link: Interconnect | None) -> dict[str, Any] | None:
    if link is None:
        return None
    return {
        "kind": link.kind,
        "generation": link.generation,
        "bandwidth_bytes_per_s": link.bandwidth,
    }
