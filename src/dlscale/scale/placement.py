"""Where a model's replica runs on a Ray cluster: the resources its instances ask for.

A replica holds every instance of the model's config.toml, so it asks Ray for what they use:
one CPU per CPU instance (times its intra-op threads when set), the GPUs its `cuda:N` instances
name, or the MIG instance its `MIG-<uuid>` instances name, as a custom resource of the node
that has it (--cpus/--gpus-per-replica override the figures, scale/commands.py). Ray shows a
replica its GPUs as cuda:0.., and the configs load as written (docs/scale.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.errors import ConfigError, DlscaleError
from dlscale.models.config import ModelConfig
from dlscale.models.repository import ModelRepository
from dlscale.types import cuda_index, is_mig


@dataclass(frozen=True)
class Placement:
    """A replica's resource request (Ray's `ray_actor_options`) and its MIG visibility."""

    num_cpus: float
    num_gpus: float = 0.0
    #: Custom resources: a MIG instance's UUID, which the node that has it advertises.
    resources: dict[str, float] = field(default_factory=dict)
    #: Environment of the replica's process (CUDA_VISIBLE_DEVICES for a MIG instance).
    env: dict[str, str] = field(default_factory=dict)

    def actor_options(self) -> dict[str, Any]:
        """The options Ray Serve takes as `ray_actor_options`."""
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.resources:
            options["resources"] = dict(self.resources)
        if self.env:
            options["runtime_env"] = {"env_vars": dict(self.env)}
        return options


def readable_configs(repository: Path, names: Iterable[str]) -> dict[str, ModelConfig]:
    """Each named model's config, where it can be read (one that fails is left to its replica's
    server to report)."""
    found = {}
    for name in names:
        try:
            found[name] = ModelRepository(repository).source(name).config
        except DlscaleError:
            continue
    return found


def placement_of(config: ModelConfig) -> Placement:
    """What one replica of the model asks Ray for."""
    gpus = sorted({i for g in config.instances if (i := cuda_index(g.device)) is not None})
    migs = sorted({g.device for g in config.instances if is_mig(g.device)})
    if len(migs) > 1 or (migs and gpus):
        raise ConfigError(
            f"model {config.name!r}: a replica is one process, and CUDA shows a process one MIG "
            f"instance and nothing else; its instances name {migs + [f'cuda:{i}' for i in gpus]}"
        )
    cpu_instances = sum(g.count for g in config.instances if g.device == "cpu")
    threads = max(1, config.backend_options.intra_op_threads)
    num_cpus = float(cpu_instances * threads)
    if migs:
        return Placement(num_cpus, 0.0, {migs[0]: 1.0}, {"CUDA_VISIBLE_DEVICES": migs[0]})
    return Placement(num_cpus, float(len(gpus)))


def fit_cpus(
    asks: Mapping[str, float], replicas: int, cluster_cpus: float, fixed: bool
) -> tuple[float, str]:
    """The share of its CPU ask each replica gets so that every model's replicas fit the
    cluster (1.0 when they fit already), and the arithmetic in words.

    Ray schedules a replica only where its CPUs are free: five models asking one CPU each on a
    two-CPU host left three waiting for ever. A request the user fixed (--cpus-per-replica) is
    not shrunk: it is refused at once with the figures and what to change.
    """
    total = replicas * sum(asks.values())
    if total <= cluster_cpus or total == 0:
        return 1.0, f"{total:g} CPUs asked, {cluster_cpus:g} in the cluster"
    each = " + ".join(f"{name} {cpus:g}" for name, cpus in sorted(asks.items()))
    arithmetic = (
        f"{replicas} replica(s) x ({each}) = {total:g} CPUs asked, {cluster_cpus:g} in the cluster"
    )
    if fixed:
        fits = cluster_cpus / (replicas * len(asks))
        raise ConfigError(
            f"the models do not fit the cluster: {arithmetic}. Lower --cpus-per-replica (at "
            f"most {fits:.3g} fits), lower --replicas, or add nodes"
        )
    return cluster_cpus / total, arithmetic
