"""Where a model's replica runs on a Ray cluster: the resources its instances ask for.

A replica holds every instance of the model's config.toml, so it asks Ray for what they use:
one CPU per CPU instance (times its intra-op threads when set), the GPUs its `cuda:N` instances
name (or a fraction of one, to share a GPU between replicas), or the MIG instance its
`MIG-<uuid>` instances name, as a custom resource of the node that has it. Ray renumbers the
GPUs it gives a replica from 0 (CUDA_VISIBLE_DEVICES), so `cuda:N` devices are moved to the
replica's own numbering before the model loads (`placed_config`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dlscale.errors import ConfigError
from dlscale.models.config import InstanceConfig, ModelConfig

_CUDA = re.compile(r"^cuda(?::(\d+))?$")


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


def gpu_indices(config: ModelConfig) -> list[int]:
    """The distinct GPU indices the config's `cuda[:N]` instances name, ascending."""
    found = {_gpu_index(g.device) for g in config.instances if _CUDA.match(g.device)}
    return sorted(found)


def _gpu_index(device: str) -> int:
    match = _CUDA.match(device)
    assert match is not None
    return int(match.group(1) or 0)


def placement_of(
    config: ModelConfig,
    cpus_per_replica: float | None = None,
    gpus_per_replica: float | None = None,
) -> Placement:
    """What one replica of the model asks Ray for; the `*_per_replica` values override."""
    gpus = gpu_indices(config)
    migs = sorted({g.device for g in config.instances if g.device.startswith("MIG-")})
    source = f"model {config.name!r}"
    if len(migs) > 1 or (migs and gpus):
        raise ConfigError(
            f"{source}: a replica is one process, and CUDA shows a process one MIG instance "
            f"and nothing else; its instances name {migs + [f'cuda:{i}' for i in gpus]}"
        )
    if cpus_per_replica is not None and cpus_per_replica < 0:
        raise ConfigError(f"CPUs per replica must be >= 0, got {cpus_per_replica}")
    cpu_instances = sum(g.count for g in config.instances if g.device == "cpu")
    threads = max(1, config.backend_options.intra_op_threads)
    num_cpus = float(cpu_instances * threads) if cpus_per_replica is None else cpus_per_replica
    if migs:
        if gpus_per_replica is not None:
            raise ConfigError(f"{source} runs on {migs[0]}, a whole MIG instance: no GPU share")
        return Placement(num_cpus, 0.0, {migs[0]: 1.0}, {"CUDA_VISIBLE_DEVICES": migs[0]})
    if gpus_per_replica is None:
        return Placement(num_cpus, float(len(gpus)))
    if not gpus:
        raise ConfigError(f"{source} has no cuda instances to give a GPU share to")
    if len(gpus) > 1 and gpus_per_replica != len(gpus):
        raise ConfigError(
            f"{source} uses {len(gpus)} GPUs (cuda:{gpus}); replicas cannot share them: give "
            f"{len(gpus)} GPUs per replica"
        )
    if len(gpus) == 1 and not 0 < gpus_per_replica <= 1:
        raise ConfigError(f"GPUs per replica must be in (0, 1], got {gpus_per_replica}")
    return Placement(num_cpus, gpus_per_replica)


def placed_config(config: ModelConfig) -> ModelConfig:
    """The config with its `cuda:N` instances renumbered as Ray shows the replica its GPUs.

    Ray gives a replica k GPUs and makes them visible as cuda:0 .. cuda:k-1; the config's
    distinct GPU indices map onto those in ascending order.
    """
    gpus = gpu_indices(config)
    if not gpus:
        return config
    number = {index: i for i, index in enumerate(gpus)}
    instances = [
        InstanceConfig(count=g.count, device=f"cuda:{number[_gpu_index(g.device)]}")
        if _CUDA.match(g.device)
        else g
        for g in config.instances
    ]
    return config.model_copy(update={"instances": instances})


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
