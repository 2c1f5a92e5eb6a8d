"""The protobuf wire format where the codec steps around protobuf: one repeated bytes field.

Protobuf's Python runtime copies a bytes field three times on its way in (into its arena, then
into a new `bytes` on each access) and three times on its way out. A tensor's raw contents are
the whole of a large message, so the gRPC codec keeps them out of protobuf: on receipt
`split_field` reads the field's values as views of the received bytes and hands protobuf only
the rest of the message (a few hundred bytes); on sending `field_parts` frames the values so
that the caller joins header and data once. Both follow the encoding spec
(protobuf.dev/programming-guides/encoding): a field is a varint key (number << 3 | wire type)
then its value, a length-delimited value is a varint length then its bytes, and a parser takes
the fields of a message in any order, so the rest of a message parses the same without them.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError

from dlscale.wire.tensors import Buffer

_VARINT, _FIXED64, _DELIMITED, _FIXED32 = 0, 1, 2, 5


def nbytes(buffer: Buffer) -> int:
    """Bytes in a buffer (a memoryview's items may be wider than a byte)."""
    return buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)


#: Varints of one byte, made once: most lengths and every key the codec writes are below 128.
_ONE_BYTE = [bytes((value,)) for value in range(0x80)]


def varint(value: int) -> bytes:
    """`value` (non-negative) as a base-128 varint."""
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def delimited_key(number: int) -> bytes:
    """The key of length-delimited field `number`."""
    return varint(number << 3 | _DELIMITED)


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    end = len(view)
    while True:
        if pos >= end or shift > 63:
            raise DecodeError("truncated or overlong varint")
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def split_field(data: Buffer, number: int) -> tuple[bytes, list[memoryview]]:
    """The message without field `number` (as bytes to parse), and that field's values as views.

    The values are views of `data`, in the order they appear; DecodeError when `data` is not a
    well-formed message.
    """
    view = memoryview(data).cast("B")
    end = len(view)
    rest: list[memoryview] = []
    values: list[memoryview] = []
    kept_from = pos = 0
    while pos < end:
        start = pos
        key, pos = _read_varint(view, pos)
        wire = key & 7
        if wire == _VARINT:
            _, pos = _read_varint(view, pos)
        elif wire == _FIXED64:
            pos += 8
        elif wire == _FIXED32:
            pos += 4
        elif wire == _DELIMITED:
            length, pos = _read_varint(view, pos)
            if key >> 3 == number and pos + length <= end:
                rest.append(view[kept_from:start])
                values.append(view[pos : pos + length])
                kept_from = pos = pos + length
                continue
            pos += length
        else:
            raise DecodeError(f"unexpected wire type {wire} in field {key >> 3}")
        if pos > end:
            raise DecodeError("a field runs past the end of the message")
    rest.append(view[kept_from:end])
    return b"".join(rest), values


def field_parts(number: int, values: Sequence[Buffer]) -> list[Buffer]:
    """Repeated bytes field `number` holding `values`, as parts to join after a message's bytes."""
    key = delimited_key(number)
    parts: list[Buffer] = []
    for value in values:
        parts += (key + varint(nbytes(value)), value)
    return parts


def embedded(number: int, parts: Sequence[Buffer]) -> list[Buffer]:
    """The message made of `parts` as field `number` of an enclosing message (no copy yet)."""
    size = sum(nbytes(p) for p in parts)
    return [delimited_key(number) + varint(size), *parts]
