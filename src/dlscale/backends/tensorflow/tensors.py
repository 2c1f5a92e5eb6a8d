"""numpy ↔ TensorFlow at the backend's boundary: datatypes, shapes, and BYTES as tf.string."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from dlscale.errors import ConfigError
from dlscale.types import Datatype, TensorSpec

TF_DTYPES: dict[Datatype, Any] = {
    Datatype.BOOL: tf.bool,
    Datatype.UINT8: tf.uint8,
    Datatype.UINT16: tf.uint16,
    Datatype.UINT32: tf.uint32,
    Datatype.UINT64: tf.uint64,
    Datatype.INT8: tf.int8,
    Datatype.INT16: tf.int16,
    Datatype.INT32: tf.int32,
    Datatype.INT64: tf.int64,
    Datatype.FP16: tf.float16,
    Datatype.BF16: tf.bfloat16,
    Datatype.FP32: tf.float32,
    Datatype.FP64: tf.float64,
    # tf.string elements are byte strings, as the protocol's BYTES elements are: no re-encoding.
    Datatype.BYTES: tf.string,
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
