"""The warm-up requests a model answers before it is ready (Triton's model_warmup).

Each entry of the config's `warmup` is `count` batches of `batch_size` rows, every input zeros,
random values or one row read from the model's warmup/ folder and repeated; without entries, one
batch of one row of zeros proves the model runs without paying for its largest batch (bert-base
took 32 s at 64 rows). A runtime with compiled buckets or CUDA graphs captures them at load.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlscale.errors import ConfigError
from dlscale.models.config import ModelConfig, WarmupConfig
from dlscale.models.confined import read_confined
from dlscale.models.samples import concrete_shape, random_tensor, zero_inputs
from dlscale.serving.instance import Instance
from dlscale.types import Datatype, TensorSpec

#: Triton's folder for warm-up files, beside the version folders.
WARMUP_FOLDER = "warmup"
#: The most a warm-up file may hold (one row of an input).
MAX_WARMUP_FILE = 256 * 2**20
#: The share of the host's memory one warm-up batch may take.
WARM_UP_MEMORY_SHARE = 0.25


@dataclass(frozen=True)
class WarmupBatch:
    """One warm-up batch: what it is called in errors, its rows, how often, and its inputs."""

    label: str
    rows: int
    count: int
    feed: dict[str, np.ndarray]


def warmup_batches(
    config: ModelConfig, inputs: Sequence[TensorSpec], folder: Path
) -> list[WarmupBatch]:
    """The batches a model warms up with, checked against the host's memory."""
    entries = config.warmup if config.warmup is not None else [WarmupConfig(name="default")]
    out = []
    for i, entry in enumerate(entries):
        rows = entry.batch_size if config.batched else 0
        for spec in inputs:  # a ConfigError (400), not a MemoryError (500), when too large
            check_warm_up(config.name, spec, rows)
        unknown = sorted(set(entry.inputs) - {s.name for s in inputs})
        if unknown:
            raise ConfigError(f"model {config.name!r}: warmup {i}: no inputs named {unknown}")
        feed = zero_inputs(inputs, rows)
        rng = np.random.default_rng(i)
        for spec in inputs:
            kind = entry.inputs.get(spec.name, "zero")
            if kind == "random":
                feed[spec.name] = random_tensor(spec.datatype, feed[spec.name].shape, rng)
            elif kind.startswith("file:"):
                row = _row(config.name, spec, config.batched, folder / WARMUP_FOLDER, kind[5:])
                feed[spec.name] = np.broadcast_to(row, feed[spec.name].shape).copy()
        out.append(WarmupBatch(entry.name or f"warmup {i}", rows, entry.count, feed))
    return out


def _row(model: str, spec: TensorSpec, batched: bool, folder: Path, name: str) -> np.ndarray:
    """One row of an input from a raw file (the whole tensor for a model that does not batch)."""
    if spec.datatype is Datatype.BYTES:
        raise ConfigError(f"model {model!r}: warm-up files are not read for BYTES inputs")
    full = concrete_shape(spec.shape, 1)
    shape = full[1:] if batched else full
    data = read_confined(folder, name, MAX_WARMUP_FILE, "warm-up file")
    dtype = spec.datatype.numpy
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(data) != expected:
        raise ConfigError(
            f"model {model!r}: warm-up file {name!r} for input {spec.name!r} holds {len(data)} "
            f"bytes; one row of {list(shape)} {spec.datatype.value} is {expected}"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def host_memory() -> int:
    """Bytes of physical memory on the host."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not POSIX: assume a small host
        return 4 * 2**30


def check_warm_up(model: str, spec: TensorSpec, batch: int) -> None:
    """ConfigError when a warm-up feed of `batch` rows of `spec` would not fit in memory."""
    item = 8 if spec.datatype is Datatype.BYTES else spec.datatype.numpy.itemsize
    size = math.prod(concrete_shape(spec.shape, batch)) * item
    budget = int(host_memory() * WARM_UP_MEMORY_SHARE)
    if size > budget:
        raise ConfigError(
            f"model {model!r}: a warm-up batch of {batch} for input {spec.name!r} takes "
            f"{size} bytes, above {budget} ({WARM_UP_MEMORY_SHARE:.0%} of the host's memory)"
        )


async def warm(
    instance: Instance,
    batches: list[WarmupBatch],
    model: str,
    clock: Callable[[], float],
    observe: Callable[[str, int, float], None] | None = None,
) -> None:
    """Run the warm-up batches on one instance; `observe(instance, rows, seconds)` hands each
    batch's time to the device schedulers as their first service times (they relearn)."""
    for batch in batches:
        for _ in range(batch.count):
            try:
                start = clock()
                await instance.infer(batch.feed)
            except Exception as exc:
                raise ConfigError(
                    f"model {model!r} failed its warm-up ({batch.label}, batch size "
                    f"{batch.rows}): {exc}"
                ) from exc
            if observe is not None:
                observe(instance.name, max(batch.rows, 1), clock() - start)
