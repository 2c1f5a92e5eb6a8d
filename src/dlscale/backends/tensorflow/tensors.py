"""numpy ↔ TensorFlow at the backend's boundary: datatypes, shapes, and BYTES as tf.string."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from dlscale.errors import ConfigError
from dlscale.types import Datatype, TensorSpec

#: Each datatype's TensorFlow dtype, named as its numpy dtype is (bool, uint8, ..., float64);
#: tf.string elements are byte strings, as the protocol's BYTES elements are: no re-encoding.
TF_DTYPES: dict[Datatype, Any] = {
    d: tf.string if d is Datatype.BYTES else getattr(tf, d.numpy.name) for d in Datatype
}
_DATATYPES = {v: k for k, v in TF_DTYPES.items()}


def spec_of(name: str, tensor: Any, source: str) -> TensorSpec:
    """A signature's tf.TensorSpec (or a KerasTensor) as dlscale's, unknown dims as -1."""
    dtype = tf.as_dtype(tensor.dtype)
    datatype = _DATATYPES.get(dtype)
    if datatype is None:
        raise ConfigError(
            f"{source}: tensor {name!r} has type {dtype.name}, which dlscale cannot serve "
            f"(it serves {sorted(d.value for d in TF_DTYPES)})"
        )
    shape = tf.TensorShape(tensor.shape)
    if shape.rank is None:
        raise ConfigError(
            f"{source}: tensor {name!r} has no known rank; export the model with a signature "
            "that gives every input's rank (tf.TensorSpec([None, ...]))"
        )
    dims = tuple(-1 if d is None else int(d) for d in shape.as_list())
    return TensorSpec(name, datatype, dims)


def to_tf(specs: Mapping[str, TensorSpec], inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Validated arrays as tensors of the signature's dtypes (object arrays as tf.string)."""
    return {
        name: tf.constant(array, dtype=TF_DTYPES[specs[name].datatype])
        for name, array in inputs.items()
    }


def to_numpy(tensor: Any) -> np.ndarray:
    """A result as numpy; tf.string outputs come back as object arrays of bytes."""
    array: np.ndarray = tensor.numpy()
    return array if array.dtype != object else array.astype(object)
