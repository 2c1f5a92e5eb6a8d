"""The samples a benchmark sends (LoadGen's query sample library holds their indices)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlscale.bench import byte_samples
from dlscale.bench.targets import ModelInfo
from dlscale.errors import BenchError
from dlscale.models.samples import concrete_shape, load_arrays, random_inputs, zoo_inputs
from dlscale.types import Datatype, TensorSpec

#: Keys of an .npz file that hold ground-truth labels rather than an input.
LABEL_KEYS = ("labels", "label", "y", "targets")
#: Samples kept in memory at most (LoadGen's performance sample set).
MEMORY_BUDGET_BYTES = 256 << 20
#: Length given to variable dimensions when samples are made up from the signature.
VARIABLE_DIM = 8


@dataclass
class SampleSet:
    """Inputs stacked along a leading sample axis, optional labels, and where they came from."""

    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None
    source: str

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))

    def request(self, batched: bool, indices: Sequence[int]) -> dict[str, np.ndarray]:
        """One request's inputs: the samples at `indices` stacked as one batch, or the first one
        alone, without a batch dimension, for a model that takes none."""
        index = np.asarray(indices, dtype=np.int64) if batched else indices[0]
        return {name: arr[index] for name, arr in self.inputs.items()}


def load_samples(info: ModelInfo, data: Path | None, count: int, seed: int = 0) -> SampleSet:
    """Samples for the model: the user's file, validation.npz, the zoo's generator, or random."""
    specs = info.sample_specs()
    if data is not None and data.is_dir():
        arrays, source = byte_samples.from_folder(data, specs, count, MEMORY_BUDGET_BYTES)
        return _check(SampleSet(arrays, None, source), specs)
    if data is not None:
        return _check(_from_file(data, specs), specs)
    if info.model_file is not None:
        validation = info.model_file.parent / "validation.npz"
        if validation.is_file():
            return _check(_from_file(validation, specs), specs)
    # Samples are stacked along a leading axis: made as batches of `count` rows.
    stacked = [s.with_batch() for s in specs]
    count = _fit(count, stacked)
    rng = np.random.default_rng(seed)
    encoded = byte_samples.from_zoo(info.name, specs, count, seed)
    if encoded is not None:  # images or texts: random strings would not decode
        return _check(SampleSet(encoded[0], None, encoded[1]), specs)
    zoo = zoo_inputs(info.name, stacked, count, rng)
    if zoo is not None:
        return _check(SampleSet(zoo, None, f"zoo:{info.name}"), specs)
    made = random_inputs(stacked, count, rng, variable_dim=VARIABLE_DIM)
    return SampleSet(made, None, "random")


def _fit(count: int, stacked: Sequence[TensorSpec]) -> int:
    """`count`, or fewer when that many samples would not fit the memory budget."""
    per_sample = sum(
        max(s.datatype.itemsize, 1) * int(np.prod(concrete_shape(s.shape, 1, VARIABLE_DIM)))
        for s in stacked
    )
    return max(1, min(count, MEMORY_BUDGET_BYTES // max(per_sample, 1)))


def _from_file(path: Path, specs: Sequence[TensorSpec]) -> SampleSet:
    if not path.is_file():
        raise BenchError(f"data file {path} does not exist")
    try:
        arrays = load_arrays(path)
    except (OSError, ValueError) as exc:
        raise BenchError(f"data file {path} is not a .npy or .npz file: {exc}") from None
    names = [s.name for s in specs]
    if isinstance(arrays, np.ndarray):
        if len(specs) != 1:
            raise BenchError(f"{path}: a .npy holds one input; the model takes {names} (use .npz)")
        return SampleSet({specs[0].name: arrays}, None, str(path))
    labels = next((arrays.pop(k) for k in LABEL_KEYS if k in arrays), None)
    if len(specs) == 1 and names[0] not in arrays and len(arrays) == 1:
        arrays = {names[0]: next(iter(arrays.values()))}
    missing = [n for n in names if n not in arrays]
    if missing:
        raise BenchError(f"{path}: no arrays for inputs {missing} (it has {sorted(arrays)})")
    return SampleSet({n: arrays[n] for n in names}, labels, str(path))


def _check(samples: SampleSet, specs: Sequence[TensorSpec]) -> SampleSet:
    source = samples.source
    sizes = {len(a) for a in samples.inputs.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise BenchError(f"{source}: inputs must hold the same number (>0) of samples: {sizes}")
    fixed = {}
    for spec in specs:
        arr = samples.inputs[spec.name]
        if not spec.matches(arr.shape[1:]):
            raise BenchError(
                f"{source}: input {spec.name!r} has samples of shape {list(arr.shape[1:])}; the "
                f"model takes {list(spec.shape)}"
            )
        if spec.datatype is not Datatype.BYTES and arr.dtype != spec.datatype.numpy:
            if not np.can_cast(arr.dtype, spec.datatype.numpy, casting="same_kind"):
                raise BenchError(
                    f"{source}: input {spec.name!r} is {arr.dtype}; the model takes "
                    f"{spec.datatype.value}"
                )
            arr = arr.astype(spec.datatype.numpy)
        fixed[spec.name] = np.ascontiguousarray(arr)
    return SampleSet(fixed, samples.labels, samples.source)
