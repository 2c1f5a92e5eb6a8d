"""Inputs for a model: its own validation data, the zoo's generator, or random data by spec."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dlscale.types import Datatype, TensorSpec


def random_inputs(
    specs: list[TensorSpec], batch: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Random inputs that fit the specs (variable non-batch dims take 1)."""
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = [batch if i == 0 and d == -1 else max(d, 1) for i, d in enumerate(spec.shape)]
        dt = spec.datatype
        if dt is Datatype.BYTES:
            out[spec.name] = np.array([b"x"] * int(np.prod(shape)), dtype=object).reshape(shape)
        elif dt is Datatype.BOOL:
            out[spec.name] = rng.random(shape) < 0.5
        elif dt.numpy.kind in "iu":
            out[spec.name] = rng.integers(0, 100, size=shape).astype(dt.numpy)
        else:
            out[spec.name] = rng.standard_normal(shape).astype(dt.numpy)
    return out


def stored_inputs(version_dir: Path, kind: str = "validation") -> dict[str, np.ndarray] | None:
    """The model's stored data set (`validation.npz` or `calibration.npz`), if it has one."""
    path = version_dir / f"{kind}.npz"
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def inputs_for(
    name: str,
    version_dir: Path,
    specs: list[TensorSpec],
    batch: int,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """A batch of realistic inputs: stored validation rows, else the zoo's, else random."""
    stored = stored_inputs(version_dir)
    wanted = {s.name for s in specs}
    if stored is not None and wanted <= set(stored):
        rows = len(stored[next(iter(wanted))])
        index = rng.integers(0, rows, size=batch)
        return {n: stored[n][index] for n in wanted}
    from dlscale.models.zoo import ZOO

    if name in ZOO:
        return ZOO[name].sample(batch, rng)
    return random_inputs(specs, batch, rng)
