"""The data the optimizer checks and calibrates with: the model's own sets, else generated."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlscale.models.repository import ModelVersion
from dlscale.models.samples import random_inputs, stored_inputs, zoo_inputs
from dlscale.types import TensorSpec

Arrays = dict[str, np.ndarray]
#: Rows generated when a model has no stored set of its own.
GENERATED_ROWS = 64
VALIDATION_SEED, CALIBRATION_SEED = 2, 1


@dataclass(frozen=True)
class DataSets:
    """Validation inputs (with labels when known) and calibration inputs, and their origin."""

    validation: Arrays
    labels: np.ndarray | None
    calibration: Arrays | None
    #: Where each set came from, for the report ("validation.npz", "zoo sampler", "random").
    validation_source: str
    calibration_source: str

    @property
    def rows(self) -> int:
        return len(next(iter(self.validation.values())))


def load_datasets(version: ModelVersion, inputs: list[TensorSpec]) -> DataSets:
    """The version's validation.npz and calibration.npz; generated sets where they are missing.

    Generated sets come from the zoo's sampler for zoo models (realistic inputs) and from
    random data otherwise; the report says which, because random data proves less.
    """
    validation, v_source, labels = _data_set(version, inputs, "validation", VALIDATION_SEED)
    calibration, c_source, _ = _data_set(version, inputs, "calibration", CALIBRATION_SEED)
    return DataSets(validation, labels, calibration, v_source, c_source)


def _data_set(
    version: ModelVersion, inputs: list[TensorSpec], kind: str, seed: int
) -> tuple[Arrays, str, np.ndarray | None]:
    """The stored `kind`.npz (and its labels) when it holds every input, else a generated set."""
    names = {s.name for s in inputs}
    stored = stored_inputs(version.path, kind)
    if stored is not None and names <= set(stored):
        return {n: stored[n] for n in names}, f"{kind}.npz", stored.get("labels")
    rng = np.random.default_rng(seed)
    if version.config.metadata.get("zoo"):
        seq_len = int(version.config.metadata.get("seq_len", 128))
        made = zoo_inputs(version.name, inputs, GENERATED_ROWS, rng, seq_len=seq_len)
        if made is not None:
            return made, "zoo sampler", None
    return random_inputs(inputs, GENERATED_ROWS, rng), "random", None
