"""TensorFlow Serving's tensor values (nested lists, as JSON or tf.Example features carry them)
as arrays of the model's datatypes, and back.

A value has no declared shape: its nesting is its shape, which must be rectangular. Its size is
bounded by the message it came in (each element took at least a byte of it), and the shape is
checked against max_tensor_elements before the array of the model's datatype is made. BYTES
elements are text (UTF-8) or `{"b64": "..."}` objects, as TensorFlow Serving's REST API writes
binary strings; elements of tf.Example byte lists arrive as bytes.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from dlscale.errors import InvalidInput
from dlscale.types import Datatype, ModelMetadata, TensorSpec
from dlscale.wire.bounds import MAX_DIMS, check_shape
from dlscale.wire.rest_json import from_base64
from dlscale.wire.tensors import JsonData, WireTensor, read_tensor

B64 = "b64"
#: Outputs whose names end so are written as {"b64": ...}, as TensorFlow Serving does.
BINARY_SUFFIX = "_bytes"


def is_b64(value: Any) -> bool:
    """Whether a JSON value is one binary string, `{"b64": "..."}`."""
    return isinstance(value, dict) and len(value) == 1 and B64 in value


def shape_of(value: Any) -> tuple[int, ...]:
    """The shape a nested value claims along its first elements (checked when it is read)."""
    shape: list[int] = []
    while isinstance(value, list):
        if len(shape) >= MAX_DIMS:
            raise InvalidInput(f"a value is nested deeper than the {MAX_DIMS} dimensions allowed")
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return tuple(shape)


def to_array(value: Any, spec: TensorSpec, max_elements: int) -> np.ndarray:
    """A value of input `spec` as an array of its datatype; InvalidInput saying what is wrong."""
    shape = shape_of(value)
    check_shape("input", spec.name, shape, max_elements)
    if spec.datatype is Datatype.BYTES:
        return _strings(value, shape, spec.name)
    wide = spec.datatype in (Datatype.FP16, Datatype.BF16)
    datatype = Datatype.FP32 if wide else spec.datatype  # JSON numbers: read as FP32, narrowed
    array = read_tensor(WireTensor("input", spec.name, datatype, shape, {}), JsonData(value))
    return array.astype(spec.datatype.numpy) if wide else array


def _strings(value: Any, shape: tuple[int, ...], name: str) -> np.ndarray:
    flat: list[bytes] = []
    # A stack, not recursion: each list must have its dimension's length (rectangular).
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth < len(shape) or isinstance(item, list):
            if depth >= len(shape) or not isinstance(item, list) or len(item) != shape[depth]:
                raise InvalidInput(
                    f"the value of input {name!r} is ragged: it must nest as its first element "
                    f"does, shape {list(shape)}"
                )
            stack.extend((x, depth + 1) for x in reversed(item))
        else:
            flat.append(_element(item, name))
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(shape)


def _element(item: Any, name: str) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode()
    if is_b64(item) and isinstance(item[B64], str):
        return from_base64(item[B64], f"input {name!r}'s b64 value")
    raise InvalidInput(
        f"input {name!r} is a string (DT_STRING): each element must be text or "
        f'{{"b64": "..."}}, got {type(item).__name__}'
    )


def spec_of(meta: ModelMetadata, name: str) -> TensorSpec:
    """The input named `name`; InvalidInput listing the model's inputs when it has none so named."""
    for spec in meta.inputs:
        if spec.name == name:
            return spec
    known = ", ".join(repr(s.name) for s in meta.inputs)
    raise InvalidInput(f"model {meta.name!r} has no input {name[:200]!r}; its inputs: {known}")


def to_value(array: np.ndarray, name: str) -> Any:
    """An output as a JSON value: numbers as they are (orjson writes arrays), BYTES as text, or
    `{"b64": ...}` when the name ends in `_bytes` or the bytes are not UTF-8."""
    if array.dtype.kind != "O":
        if array.dtype == Datatype.BF16.numpy:
            return array.astype(np.float32)
        return np.ascontiguousarray(array)
    binary = name.endswith(BINARY_SUFFIX)
    flat = [_text(x, binary) for x in array.flat]
    return np.array(flat, dtype=object).reshape(array.shape).tolist() if array.ndim else flat[0]


def _text(item: Any, binary: bool) -> Any:
    raw = item if isinstance(item, bytes) else str(item).encode()
    if not binary:
        try:
            return raw.decode()
        except UnicodeDecodeError:
            pass
    return {B64: base64.b64encode(raw).decode()}
