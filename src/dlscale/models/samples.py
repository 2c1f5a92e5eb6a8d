"""Inputs made from tensor specs: stored data sets, the zoo's generator, random or zero data.

The one place that turns a model's input specs into arrays; the bench, the optimizer, the
manager's warm-up and `dlscale run` call it with their own sizes and seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dlscale.types import Datatype, TensorSpec

Arrays = dict[str, np.ndarray]


def concrete_shape(shape: Sequence[int], batch: int, variable_dim: int = 1) -> list[int]:
    """A shape to make data of: a leading -1 takes `batch`, other variable dims `variable_dim`."""
    return [
        batch if i == 0 and d == -1 else (d if d > 0 else variable_dim) for i, d in enumerate(shape)
    ]


def random_tensor(datatype: Datatype, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Random values of one datatype: normal floats, integers in [0, 100), fair booleans.

    BYTES elements are distinct strings ("sample-0", "sample-1", ...) and draw nothing from `rng`.
    """
    if datatype is Datatype.BYTES:
        count = int(np.prod(shape))
        return np.array([f"sample-{i}".encode() for i in range(count)], object).reshape(shape)
    if datatype is Datatype.BOOL:
        return rng.random(shape) < 0.5
    if datatype.numpy.kind in "iu":
        return rng.integers(0, 100, size=shape).astype(datatype.numpy)
    return rng.standard_normal(shape).astype(datatype.numpy)


def random_inputs(
    specs: Sequence[TensorSpec], batch: int, rng: np.random.Generator, *, variable_dim: int = 1
) -> Arrays:
    """Random inputs that fit the specs (shapes as `concrete_shape` makes them)."""
    return {
        s.name: random_tensor(s.datatype, concrete_shape(s.shape, batch, variable_dim), rng)
        for s in specs
    }


def zero_inputs(specs: Sequence[TensorSpec], batch: int) -> Arrays:
    """Zeros (empty strings for BYTES) that fit the specs: the cheapest valid warm-up feed."""
    out: Arrays = {}
    for spec in specs:
        shape = concrete_shape(spec.shape, batch)
        if spec.datatype is Datatype.BYTES:
            out[spec.name] = np.full(shape, b"", dtype=object)
        else:
            out[spec.name] = np.zeros(shape, dtype=spec.datatype.numpy)
    return out


def zoo_inputs(
    name: str,
    specs: Sequence[TensorSpec],
    batch: int,
    rng: np.random.Generator,
    *,
    seq_len: int = 128,
) -> Arrays | None:
    """`batch` realistic rows from the zoo's generator, or None when `name` is not a zoo model
    whose inputs fit `specs` (a model that only shares a zoo name gets its data elsewhere).

    `specs` describe whole batches: their first dimension is the one `batch` fills.
    """
    from dlscale.models.zoo import ZOO  # the zoo imports the model builders: only when asked

    if name not in ZOO:
        return None
    made = ZOO[name].sample(batch, rng, seq_len=seq_len)
    if set(made) != {s.name for s in specs} or not all(
        s.matches(made[s.name].shape) for s in specs
    ):
        return None
    return {k: np.asarray(v) for k, v in made.items()}


def load_arrays(path: Path) -> np.ndarray | Arrays:
    """An .npy file's array, or an .npz file's arrays by name (never unpickling)."""
    loaded = np.load(path, allow_pickle=False)
    if isinstance(loaded, np.ndarray):
        return loaded
    with loaded:
        return {k: loaded[k] for k in loaded.files}


def stored_inputs(version_dir: Path, kind: str = "validation") -> Arrays | None:
    """The model's stored data set (`validation.npz` or `calibration.npz`), if it has one."""
    path = version_dir / f"{kind}.npz"
    if not path.is_file():
        return None
    arrays = load_arrays(path)
    return arrays if isinstance(arrays, dict) else None


def inputs_for(
    name: str,
    version_dir: Path,
    specs: list[TensorSpec],
    batch: int,
    rng: np.random.Generator,
) -> Arrays:
    """A batch of realistic inputs: stored validation rows, else the zoo's, else random."""
    stored = stored_inputs(version_dir)
    wanted = {s.name for s in specs}
    if stored is not None and wanted <= set(stored):
        rows = len(stored[next(iter(wanted))])
        index = rng.integers(0, rows, size=batch)
        return {n: stored[n][index] for n in wanted}
    zoo = zoo_inputs(name, specs, batch, rng)
    return zoo if zoo is not None else random_inputs(specs, batch, rng)
