"""A tensor's JSON data read into an array: numbers checked against the datatype's kind and
range, strings as BYTES elements, nesting bounded before anything is walked.

`tensors.py`'s `read_tensor` calls `from_json` for a tensor whose message carries JSON `data`
(REST's JSON body, the OpenAI and TF Serving routes' values).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from dlscale.errors import InvalidInput
from dlscale.types import Datatype
from dlscale.wire.bounds import MAX_DIMS

_INTEGER = "iu"
#: JSON data nested deeper than a shape can be is refused (MAX_DIMS levels and the outer list).
_MAX_NESTING = MAX_DIMS + 1
_END = object()


class Described(Protocol):
    """What is read of a tensor here (tensors.py's `WireTensor`)."""

    @property
    def role(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def datatype(self) -> Datatype: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def count(self) -> int: ...


def from_json(tensor: Described, data: Any) -> np.ndarray:
    """A tensor's array from its JSON `data`; InvalidInput saying what does not fit (its shape
    is already checked against the bounds)."""
    role, name, datatype = tensor.role, tensor.name, tensor.datatype
    if not datatype.json_safe:
        raise InvalidInput(
            f"{role} {name!r} is {datatype.value}, which JSON cannot carry: send it as binary data "
            "(parameter binary_data_size and Inference-Header-Content-Length)"
        )
    if data is None:
        raise InvalidInput(f"{role} {name!r} has neither data nor binary_data_size")
    flat = data if isinstance(data, list) else [data]
    if _depth(flat) > _MAX_NESTING:
        raise InvalidInput(
            f"data of {role} {name!r} is nested deeper than the {MAX_DIMS} dimensions a tensor "
            "may have"
        )
    array = _strings(tensor, flat) if datatype is Datatype.BYTES else _numbers(tensor, flat)
    count = tensor.count
    if array.size != count:
        raise InvalidInput(
            f"{role} {name!r} has shape {list(tensor.shape)} ({count} elements), but its data "
            f"holds {array.size}"
        )
    return array.reshape(tensor.shape)


def _numbers(tensor: Described, data: list[Any]) -> np.ndarray:
    where = f"data of {tensor.role} {tensor.name!r}"
    try:
        array = np.array(data)
    except (ValueError, OverflowError):
        raise InvalidInput(f"{where} is ragged: nested lists must have equal lengths") from None
    kind = array.dtype.kind
    datatype = tensor.datatype
    target = datatype.numpy
    if array.size == 0:
        return array.astype(target)
    if datatype is Datatype.BOOL:
        ok = kind == "b"
    elif target.kind in _INTEGER:
        ok = kind in _INTEGER
    else:
        ok = kind in "iuf"
    if not ok:
        want = {"b": "true/false", "i": "integers", "u": "integers"}.get(target.kind, "numbers")
        raise InvalidInput(
            f"{where} must hold {want} for datatype {datatype.value}; got {_describe(array)}"
        )
    if target.kind in _INTEGER:
        info = np.iinfo(target)
        low, high = int(array.min()), int(array.max())
        if low < info.min or high > info.max:
            raise InvalidInput(
                f"{where} has values in [{low}, {high}], outside the range of {datatype.value} "
                f"[{info.min}, {info.max}]"
            )
    elif target.kind == "f" and target.itemsize < array.dtype.itemsize:
        largest = float(np.abs(array).max())
        limit = float(np.finfo(target).max)
        if largest > limit:
            raise InvalidInput(
                f"{where} has a value of magnitude {largest:.4g}, beyond the range of "
                f"{datatype.value} (±{limit:.4g})"
            )
    return array.astype(target, copy=False)


def _describe(array: np.ndarray) -> str:
    return {
        "b": "booleans",
        "f": "non-integer numbers",
        "U": "strings",
        "O": "mixed or non-numeric values",
    }.get(array.dtype.kind, str(array.dtype))


def _strings(tensor: Described, data: list[Any]) -> np.ndarray:
    flat: list[Any] = []
    _flatten(tensor, data, flat)
    if not all(isinstance(s, str) for s in flat):
        raise InvalidInput(f"data of BYTES {tensor.role} {tensor.name!r} must hold strings only")
    out = np.empty(len(flat), dtype=object)
    out[:] = [s.encode() for s in flat]
    return out


def _flatten(tensor: Described, data: list[Any], out: list[Any]) -> None:
    # A stack, not recursion: a client's nesting must not reach the interpreter's limit.
    stack = [iter(data)]
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, list):
            if len(stack) >= _MAX_NESTING:
                raise InvalidInput(
                    f"data of {tensor.role} {tensor.name!r} is nested deeper than the "
                    f"{MAX_DIMS} dimensions a tensor may have"
                )
            stack.append(iter(item))
        else:
            out.append(item)


def _depth(data: Any) -> int:
    """How deeply lists nest along the first elements (a tensor's data nests evenly)."""
    depth = 0
    while isinstance(data, list):
        depth += 1
        if not data:
            break
        data = data[0]
    return depth
