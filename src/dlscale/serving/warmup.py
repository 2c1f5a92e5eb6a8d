"""The warm-up requests a model answers before it is ready (Triton's model_warmup).

Each entry of the config's `warmup` is `count` batches of `batch_size` rows, every input zeros,
random values or one row read from the model's warmup/ folder and repeated; without entries, one
batch of one row of zeros proves the model runs without paying for its largest batch (bert-base
took 32 s at 64 rows). A runtime with compiled buckets or CUDA graphs captures them at load.
The warm-up runs in the instance's thread right after its load, in the same trip (`Warmup`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlscale.backends import Backend
from dlscale.backends.confined import read_confined
from dlscale.errors import ConfigError
from dlscale.models.config import ModelConfig, WarmupConfig
from dlscale.models.repository import ModelVersion
from dlscale.models.samples import concrete_shape, random_tensor, zero_inputs
from dlscale.models.signature import reconcile
from dlscale.types import Datatype, TensorSpec

#: Triton's folder for warm-up files, beside the version folders.
WARMUP_FOLDER = "warmup"
#: The most a warm-up file may hold (one row of an input).
MAX_WARMUP_FILE = 256 * 2**20
#: The share of the host's memory one warm-up batch may take.
WARM_UP_MEMORY_SHARE = 0.25


#: Without entries: one batch of one row of zeros (made once: a config model is not free).
_DEFAULT = WarmupConfig(name="default")


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
    entries = config.warmup if config.warmup is not None else [_DEFAULT]
    out = []
    for i, entry in enumerate(entries):
        rows = entry.batch_size if config.batched else 0
        for spec in inputs:  # a ConfigError (400), not a MemoryError (500), when too large
            check_warm_up(config.name, spec, rows)
        unknown = sorted(set(entry.inputs) - {s.name for s in inputs})
        if unknown:
            raise ConfigError(f"model {config.name!r}: warmup {i}: no inputs named {unknown}")
        feed = zero_inputs(inputs, rows)
        rng = None  # made for random inputs only: a generator costs more than a row of zeros
        for spec in inputs:
            kind = entry.inputs.get(spec.name, "zero")
            if kind == "random":
                rng = rng or np.random.default_rng(i)
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


@dataclass(frozen=True)
class Warmed:
    """What an instance's load and warm-up found: the signature reconciled with the config, and
    each warm-up batch's rows and seconds (the device schedulers' first service times)."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    times: list[tuple[int, float]]


@dataclass(frozen=True)
class Warmup:
    """Run in an instance's thread right after its backend loaded (`Instance.load`): the
    signature checked against the config, then the warm-up batches (none for a backend that
    batches itself or calls models: those it calls may load after it, as Triton does)."""

    mv: ModelVersion
    clock: Callable[[], float]

    def __call__(self, backend: Backend) -> Warmed:
        config = self.mv.config
        inputs, outputs = reconcile(config, backend.inputs, backend.outputs, self.mv.source)
        capabilities = backend.capabilities
        if capabilities.streams_answers or capabilities.calls_models:
            return Warmed(inputs, outputs, [])
        times = []
        for batch in warmup_batches(config, inputs, self.mv.folder):
            for _ in range(batch.count):
                start = self.clock()
                try:
                    backend.infer(batch.feed)
                except Exception as exc:
                    raise ConfigError(
                        f"model {config.name!r} failed its warm-up ({batch.label}, batch size "
                        f"{batch.rows}): {exc}"
                    ) from exc
                times.append((max(batch.rows, 1), self.clock() - start))
        return Warmed(inputs, outputs, times)
