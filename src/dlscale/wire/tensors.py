"""Tensors on the wire: raw little-endian bytes, BYTES elements, JSON data and typed values.

Every Open Inference Protocol encoding of a tensor is read by `read_tensor` and written by
`write_tensor`, for the REST and gRPC codecs alike and in both directions. A tensor whose
parameters name a shared-memory region (Triton's extension) carries no data: `regions.py` reads
and writes those parameters, and the bytes found in the region are read by `read_tensor` like
any raw data (REGION_WORDS says what does not fit).
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlscale.errors import InvalidInput
from dlscale.types import Datatype, Parameters
from dlscale.wire.bounds import MAX_ELEMENTS, check_shape
from dlscale.wire.json_tensors import from_json

Buffer = bytes | bytearray | memoryview

_LENGTH = struct.Struct("<I")
_DATATYPES = {d.value: d for d in Datatype}  # a dict lookup is cheaper than the enum's call
#: Members read per tensor, bound once: on Python 3.11 `Datatype.BYTES` goes through the enum
#: class's Python-level `__getattr__` at every read (about 0.4 us each).
_BYTES = Datatype.BYTES


# The records below are made for every tensor of every request: slots and no frozen __setattr__
# keep them at a fraction of a microsecond each. Nothing changes them after they are made.


@dataclass(slots=True)
class WireTensor:
    """What a message says of a tensor besides its data; `role` is "input" or "output"."""

    role: str
    name: str
    datatype: Datatype
    shape: tuple[int, ...]
    parameters: Parameters = field(default_factory=dict)

    @property
    def count(self) -> int:
        """Elements in the shape."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class Wording:
    """How a protocol words raw data that does not fit; each keeps what its clients were told.

    The templates may use: role, name, datatype, shape, got (bytes sent), want (bytes needed),
    index (a BYTES element), size (its declared length), left (bytes left for it), count
    (elements in the shape), found (elements read) and extra (bytes after the last element).
    """

    size: str
    overrun: str
    short: str
    trailing: str


@dataclass(slots=True)
class RawData:
    """Little-endian, row-major bytes: REST binary data or gRPC raw contents."""

    data: Buffer
    wording: Wording


@dataclass(slots=True)
class JsonData:
    """REST JSON `data`, nested or flat; None when the tensor gave none."""

    data: Any


@dataclass(slots=True)
class TypedValues:
    """gRPC typed contents: the values of one field, and the numpy type protobuf holds them in."""

    field: str
    values: Sequence[Any]
    wire: np.dtype[Any]


Source = RawData | JsonData | TypedValues


class Form(enum.Enum):
    """The form an encoded tensor's data takes in its message."""

    RAW = "raw"  # little-endian bytes: REST binary data, gRPC raw contents
    JSON = "json"  # REST JSON data
    TYPED = "typed"  # gRPC typed contents (the codec picks the field)


_RAW, _JSON = Form.RAW, Form.JSON  # bound once, as _BYTES


@dataclass(slots=True)
class Written:
    """A tensor's data as `write_tensor` made it: raw bytes, or values (JSON data or typed)."""

    raw: Buffer | None = None
    values: Any = None


# -- datatypes and BYTES elements ------------------------------------------------------------------


def parse_datatype(role: str, name: str, text: str) -> Datatype:
    """The datatype a message names for a tensor; InvalidInput listing the known ones."""
    datatype = _DATATYPES.get(text)
    if datatype is None:
        known = ", ".join(_DATATYPES)
        raise InvalidInput(f"{role} {name!r} has unknown datatype {text!r} (known: {known})")
    return datatype


def as_bytes(item: object) -> bytes:
    """One BYTES element as bytes; text is UTF-8 encoded (ONNX Runtime hands strings back)."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, bytearray | memoryview):
        return bytes(item)
    return str(item).encode()


def as_text(item: object) -> str:
    """One BYTES element as text; raises UnicodeDecodeError when its bytes are not UTF-8."""
    return item.decode() if isinstance(item, bytes) else str(item)


def serialize_bytes(items: Iterable[object]) -> bytes:
    """BYTES elements on the wire: each as a 4-byte little-endian length, then its bytes."""
    parts: list[bytes] = []
    for item in items:
        raw = as_bytes(item)
        parts += (_LENGTH.pack(len(raw)), raw)
    return b"".join(parts)


# -- reading ---------------------------------------------------------------------------------------


def read_tensor(tensor: WireTensor, source: Source, max_elements: int = MAX_ELEMENTS) -> np.ndarray:
    """A tensor's array from the source its message gave; InvalidInput saying what does not fit.

    The shape is checked first (dimensions, elements against `max_elements`), and what it
    declares against what the message carries, so that nothing is allocated for a lie.
    Raw numbers are a view of the message's bytes (no copy; read-only when the bytes are).
    """
    if isinstance(source, RawData):
        return read_raw(tensor, source.data, source.wording, max_elements)
    check_shape(tensor.role, tensor.name, tensor.shape, max_elements)
    if isinstance(source, JsonData):
        return from_json(tensor, source.data)
    return _from_typed(tensor, source)


def _say(template: str, tensor: WireTensor, **facts: int) -> str:
    return template.format(
        role=tensor.role,
        name=tensor.name,
        datatype=tensor.datatype.value,
        shape=list(tensor.shape),
        **facts,
    )


def read_raw(
    tensor: WireTensor, data: Buffer, wording: Wording, max_elements: int = MAX_ELEMENTS
) -> np.ndarray:
    """`read_tensor` of raw bytes, without a `RawData` to make first (once per tensor of every
    binary request): the same checks, a view of the bytes."""
    count = check_shape(tensor.role, tensor.name, tensor.shape, max_elements)
    return read_raw_checked(tensor, data, wording, count)


def read_raw_checked(
    tensor: WireTensor, data: Buffer, wording: Wording, count: int = -1
) -> np.ndarray:
    """`read_raw` of a tensor whose shape its caller has checked already (`check_shape`, which
    gives `count`, the elements of the shape)."""
    datatype = tensor.datatype
    if datatype is _BYTES:
        return _parse_bytes(tensor, memoryview(data), wording).reshape(tensor.shape)
    # The wire is little-endian, as are the hosts dlscale runs on; no byte swapping needed.
    # `data` holds bytes (a memoryview of a body or a message, in bytes): its length is theirs.
    dtype = datatype.numpy
    if count < 0:
        count = math.prod(tensor.shape)
    if len(data) != count * dtype.itemsize:
        check_raw_size(tensor, len(data), wording)  # says what does not fit
    # One array over the bytes, shaped as made (frombuffer and reshape make two); positional.
    return np.ndarray(tensor.shape, dtype, data)


def check_raw_size(tensor: WireTensor, size: int, wording: Wording) -> None:
    """Raw bytes of a fixed-size datatype must be exactly what the shape holds."""
    want = tensor.count * tensor.datatype.itemsize
    if size != want:
        raise InvalidInput(_say(wording.size, tensor, got=size, want=want))


def _parse_bytes(tensor: WireTensor, view: memoryview, wording: Wording) -> np.ndarray:
    count, end, pos = tensor.count, len(view), 0
    # A list that grows with what is read, not an array the size of what the shape claims:
    # each element takes at least its 4-byte length, so the bytes end a lie's loop early.
    items = []
    for i in range(count):
        if pos + 4 > end:
            raise InvalidInput(_say(wording.short, tensor, got=end, count=count, found=i))
        (size,) = _LENGTH.unpack_from(view, pos)
        pos += 4
        if pos + size > end:
            raise InvalidInput(_say(wording.overrun, tensor, index=i, size=size, left=end - pos))
        items.append(bytes(view[pos : pos + size]))
        pos += size
    if pos != end:
        raise InvalidInput(_say(wording.trailing, tensor, got=end, count=count, extra=end - pos))
    out = np.empty(count, dtype=object)
    out[:] = items
    return out


def _from_typed(tensor: WireTensor, source: TypedValues) -> np.ndarray:
    values, count = source.values, tensor.count
    if len(values) != count:
        raise InvalidInput(
            f"{tensor.role} {tensor.name!r}: {len(values)} values in {source.field}, but shape "
            f"{list(tensor.shape)} holds {count}"
        )
    if tensor.datatype is _BYTES:
        array = np.empty(count, dtype=object)
        array[:] = [as_bytes(v) for v in values]
        return array.reshape(tensor.shape)
    array = np.array(values, dtype=source.wire)
    target = tensor.datatype.numpy
    if target != source.wire:
        narrowed = array.astype(target)
        if not np.array_equal(narrowed, array):
            raise InvalidInput(
                f"{tensor.role} {tensor.name!r}: values out of range for {tensor.datatype.value}"
            )
        array = narrowed
    return array.reshape(tensor.shape)


# -- writing ---------------------------------------------------------------------------------------


def write_tensor(
    role: str, name: str, array: np.ndarray, datatype: Datatype, form: Form
) -> Written:
    """A tensor's data in the form its message sends it in.

    RAW is a view of the array's bytes when it is contiguous (BYTES elements are serialized);
    JSON is a flat array or a list of text ready for orjson; TYPED is a list of values.
    """
    if form is _RAW:
        return Written(write_raw(array, datatype))
    if form is _JSON:
        return Written(values=_to_json(role, name, array, datatype))
    if datatype is _BYTES:
        return Written(values=[as_bytes(v) for v in array.flat])
    return Written(values=array.ravel().tolist())


#: Raw outputs of at most this many bytes are copied rather than viewed (`write_raw`).
COPY_UP_TO = 1024


def write_raw(array: np.ndarray, datatype: Datatype) -> Buffer:
    """`write_tensor` in the RAW form, its bytes without a `Written` around them (once per
    output of every binary answer): a view of the array's memory when it is contiguous, a
    copy when small (a few hundred bytes copy in less time than numpy takes to make a view)."""
    if datatype is _BYTES:
        return serialize_bytes(array.flat)
    if array.nbytes <= COPY_UP_TO:
        return array.tobytes()  # in C order, as the view below
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    flat: Any = array.reshape(-1).view(np.uint8)  # numpy lacks Buffer hints
    return memoryview(flat)


def _to_json(role: str, name: str, array: np.ndarray, datatype: Datatype) -> Any:
    if datatype is not _BYTES:
        return np.ascontiguousarray(array).reshape(-1)
    try:
        return [as_text(x) for x in array.flat]
    except UnicodeDecodeError:
        advice = (
            "ask for it with the parameter binary_data: true"
            if role == "output"
            else "send it as binary data"
        )
        raise InvalidInput(
            f"{role} {name!r} holds bytes that are not UTF-8, which JSON cannot carry; {advice}"
        ) from None


# -- shared-memory regions -------------------------------------------------------------------------

#: How the bytes a region holds for a tensor are worded when they do not fit it.
REGION_WORDS = Wording(
    size=(
        "{role} {name!r} of shape {shape} and datatype {datatype} takes {want} bytes, but its "
        "shared_memory_byte_size is {got}"
    ),
    overrun=(
        "BYTES {role} {name!r}: element {index} in its shared-memory region claims {size} "
        "bytes, but only {left} remain"
    ),
    short=(
        "BYTES {role} {name!r}: its shape holds {count} elements, but its shared-memory bytes "
        "({got}) hold {found}"
    ),
    trailing=(
        "BYTES {role} {name!r}: its shape holds {count} elements, and its shared-memory bytes "
        "({got}) hold {extra} bytes more"
    ),
)
