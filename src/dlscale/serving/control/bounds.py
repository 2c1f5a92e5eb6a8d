"""What a load request's config may ask of the host: batch, instances, threads, memory.

A config sent with `POST /v2/repository/models/{m}/load` comes from a client, not from the
operator who wrote the repository: its sizes are bounded by the host (issue 28: a
`max_batch_size` of 2^31-1 sized a warm-up allocation and answered 500 MemoryError; instance
and thread counts had no bound). The repository's own configs are the operator's and only the
warm-up's memory bound (serving/warmup.py `check_warm_up`) applies to them.
"""

from __future__ import annotations

import os

from dlscale.errors import InvalidInput
from dlscale.models.config import ModelConfig
from dlscale.serving.regions.cuda import gpu_count
from dlscale.serving.warmup import check_warm_up

#: The longest model name a load request may carry: a folder name on common file systems.
MAX_NAME_CHARS = 255
#: The largest max_batch_size a load request may ask for (Triton's models stay far below).
MAX_BATCH_SIZE = 2**16
#: Model copies per core a load request may ask for, over all its instance groups.
INSTANCES_PER_CORE = 4


def check_name(name: str) -> None:
    """A load request's model name: at most MAX_NAME_CHARS characters (it names a folder)."""
    if len(name) > MAX_NAME_CHARS:
        raise InvalidInput(
            f"model name {name[:20]!r}... has {len(name)} characters: the limit is {MAX_NAME_CHARS}"
        )


def cores() -> int:
    """Cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_devices(config: ModelConfig, gpus: int | None) -> None:
    """InvalidInput when an instance group names a GPU index the host does not have."""
    for group in config.instances:
        kind, _, number = group.device.partition(":")
        if kind == "cuda" and gpus is not None and int(number or 0) >= gpus:
            raise InvalidInput(
                f"device {group.device!r}: this host has {gpus} GPU(s) (cuda:0 to cuda:{gpus - 1})"
                if gpus
                else f"device {group.device!r}: this host has no GPU"
            )


def check_override(config: ModelConfig) -> None:
    """InvalidInput when a load request's config asks more than the host can give."""
    check_devices(config, gpu_count())
    if config.max_batch_size > MAX_BATCH_SIZE:
        raise InvalidInput(
            f"max_batch_size {config.max_batch_size} is above the limit of {MAX_BATCH_SIZE} "
            "for a config sent in a load request"
        )
    limit = INSTANCES_PER_CORE * cores()
    count = sum(group.count for group in config.instances)
    if count > limit:
        raise InvalidInput(
            f"the config asks for {count} model instances; a load request may ask for at most "
            f"{limit} ({INSTANCES_PER_CORE} per core)"
        )
    for name in ("intra_op_threads", "inter_op_threads"):
        threads = getattr(config.backend_options, name)
        if threads > cores():
            raise InvalidInput(
                f"backend option {name} {threads} is above the host's {cores()} cores"
            )
    for spec in config.tensor_specs("inputs") or ():
        check_warm_up(config.name, spec, max(config.max_batch_size, 1))
