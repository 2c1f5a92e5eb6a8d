"""Tensors to and from the protocol's raw little-endian bytes (shared by both wire clients)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from dlscale.errors import BenchError
from dlscale.types import Datatype


def to_raw(array: np.ndarray) -> bytes:
    """A tensor's bytes on the wire: row-major, little-endian, BYTES elements length-prefixed."""
    if array.dtype.kind in ("O", "S", "U"):
        parts = []
        for item in array.reshape(-1):
            data = item.encode() if isinstance(item, str) else bytes(item)
            parts.append(struct.pack("<I", len(data)) + data)
        return b"".join(parts)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def from_raw(data: bytes | memoryview, datatype: str, shape: Sequence[int]) -> np.ndarray:
    """A tensor from its raw bytes; BenchError when the size does not fit the shape."""
    dtype = _datatype(datatype)
    shape = tuple(int(d) for d in shape)
    if dtype is Datatype.BYTES:
        items, offset, buf = [], 0, bytes(data)
        while offset < len(buf):
            (n,) = struct.unpack_from("<I", buf, offset)
            items.append(buf[offset + 4 : offset + 4 + n])
            offset += 4 + n
        return np.array(items, dtype=object).reshape(shape)
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise BenchError(
            f"a {datatype} tensor of shape {list(shape)} needs {expected} bytes; got {len(data)}"
        )
    return np.frombuffer(data, dtype=dtype.numpy.newbyteorder("<")).reshape(shape)


def from_list(values: Sequence[Any], datatype: str, shape: Sequence[int]) -> np.ndarray:
    """A tensor from JSON (nested or flat) data."""
    dtype = _datatype(datatype)
    if dtype is Datatype.BYTES:
        flat = [v.encode() if isinstance(v, str) else bytes(v) for v in np.ravel(values)]
        return np.array(flat, dtype=object).reshape(tuple(shape))
    return np.asarray(values, dtype=dtype.numpy).reshape(tuple(shape))


def to_list(array: np.ndarray) -> list[Any]:
    """A tensor as flat JSON data (BYTES as text)."""
    if array.dtype.kind in ("O", "S", "U"):
        return [v.decode() if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
    flat: list[Any] = array.reshape(-1).tolist()
    return flat


def datatype_of(array: np.ndarray) -> str:
    """The protocol's datatype name for a numpy array."""
    try:
        return Datatype.from_numpy(array.dtype).value
    except ValueError as exc:
        raise BenchError(str(exc)) from None


def _datatype(name: str) -> Datatype:
    try:
        return Datatype(name)
    except ValueError:
        raise BenchError(f"the server sent an unknown datatype {name!r}") from None
