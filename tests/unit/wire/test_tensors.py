"""The rules every tensor encoding shares: raw bytes, BYTES elements, JSON data, typed values."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dlscale.errors import InvalidInput
from dlscale.types import Datatype
from dlscale.wire.grpc import GRPC_WORDS
from dlscale.wire.rest import REST_WORDS
from dlscale.wire.tensors import (
    COPY_UP_TO,
    Buffer,
    Form,
    JsonData,
    RawData,
    TypedValues,
    WireTensor,
    as_bytes,
    as_text,
    read_tensor,
    serialize_bytes,
    write_tensor,
)


def _raw(array: np.ndarray) -> bytes:
    datatype = Datatype.from_numpy(array.dtype)
    written = write_tensor("input", "x", array, datatype, Form.RAW)
    assert written.raw is not None
    return bytes(written.raw)


def _from_raw(data: Buffer, datatype: str, shape: list[int], role: str = "output") -> np.ndarray:
    tensor = WireTensor(role, "y", Datatype(datatype), tuple(shape))
    return read_tensor(tensor, RawData(data, GRPC_WORDS))


@pytest.mark.parametrize(
    "array",
    [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array([[1, -2]], dtype=np.int64),
        np.array([0.5, 1.5], dtype=np.float16),
        np.array([1.0, 2.0], dtype=ml_dtypes.bfloat16),
        np.array([True, False]),
    ],
)
def test_raw_round_trip(array: np.ndarray) -> None:
    datatype = Datatype.from_numpy(array.dtype).value
    back = _from_raw(_raw(array), datatype, list(array.shape))
    assert back.dtype == array.dtype and np.array_equal(back, array)


def test_raw_reads_are_views_and_writes_need_no_copy() -> None:
    buffer = bytearray(np.arange(4, dtype=np.int32).tobytes())
    array = _from_raw(buffer, "INT32", [2, 2])
    buffer[0] = 9
    assert array[0, 0] == 9
    source = np.arange(COPY_UP_TO // 4 + 1, dtype=np.float32)
    written = write_tensor("output", "y", source, Datatype.FP32, Form.RAW)
    assert isinstance(written.raw, memoryview)
    assert np.shares_memory(np.frombuffer(written.raw, np.float32), source)


def test_small_raw_writes_are_copies_of_the_same_bytes() -> None:
    # Below COPY_UP_TO a copy costs less than a view; the bytes are the same, in C order.
    source = np.arange(8, dtype=np.float32).reshape(2, 4).T  # not contiguous
    written = write_tensor("output", "y", source, Datatype.FP32, Form.RAW)
    assert isinstance(written.raw, bytes) and written.raw == np.ascontiguousarray(source).tobytes()


def test_bytes_tensors_are_length_prefixed() -> None:
    array = np.array([b"ab", b""], dtype=object)
    raw = _raw(array)
    assert raw == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"
    assert list(_from_raw(raw, "BYTES", [2])) == [b"ab", b""]
    assert serialize_bytes(["é", b"\xff", 3]) == (
        b"\x02\x00\x00\x00\xc3\xa9\x01\x00\x00\x00\xff\x01\x00\x00\x003"
    )


def test_a_short_buffer_is_an_error_naming_sizes() -> None:
    with pytest.raises(InvalidInput, match="hold 8 bytes, but shape \\[4\\] of FP32 needs 16"):
        _from_raw(b"\x00" * 8, "FP32", [4])


@pytest.mark.parametrize(
    ("blob", "rest", "grpc"),
    [
        (
            b"\x02\x00\x00\x00ab\x05\x00\x00\x00c",
            "BYTES input 'x': element 1 claims 5 bytes, but only 1 remain",
            "input 'x': BYTES element 1 declares 5 bytes, but only 1 remain in its raw contents",
        ),
        (
            b"\x02\x00\x00\x00ab",
            "BYTES input 'x': its shape holds 2 elements, but the binary data (6 bytes of 4-byte "
            "lengths and values) holds 1",
            "input 'x': its BYTES raw contents end after 1 of 2 elements",
        ),
        (
            b"\x00\x00\x00\x00\x00\x00\x00\x00zz",
            "BYTES input 'x': its shape holds 2 elements, but the binary data (10 bytes of 4-byte "
            "lengths and values) holds 2 and 2 bytes more",
            "input 'x': 2 bytes remain in its BYTES raw contents after the 2 elements its shape "
            "holds",
        ),
    ],
)
def test_one_bytes_parser_in_each_protocols_words(blob: bytes, rest: str, grpc: str) -> None:
    tensor = WireTensor("input", "x", Datatype.BYTES, (2,))
    for words, message in ((REST_WORDS, rest), (GRPC_WORDS, grpc)):
        with pytest.raises(InvalidInput) as info:
            read_tensor(tensor, RawData(blob, words))
        assert str(info.value) == message


def test_json_data_and_typed_values() -> None:
    tensor = WireTensor("output", "y", Datatype.INT16, (2, 2))
    assert read_tensor(tensor, JsonData([[1, 2], [3, 4]])).dtype == np.int16
    with pytest.raises(InvalidInput, match="data of output 'y' has values in \\[1, 70000\\]"):
        read_tensor(tensor, JsonData([1, 2, 3, 70000]))
    typed = TypedValues("int_contents", [1, 2, 3, 4], np.dtype(np.int32))
    assert read_tensor(tensor, typed).tolist() == [[1, 2], [3, 4]]
    written = write_tensor(
        "output", "y", np.array([b"a", "b"], dtype=object), Datatype.BYTES, Form.JSON
    )
    assert written.values == ["a", "b"]
    with pytest.raises(InvalidInput, match=r"input 'x' holds bytes that are not UTF-8.*as binary"):
        write_tensor("input", "x", np.array([b"\xff"], dtype=object), Datatype.BYTES, Form.JSON)


def test_element_conversions() -> None:
    assert as_bytes("é") == "é".encode() and as_bytes(b"\xff") == b"\xff"
    assert as_bytes(bytearray(b"a")) == b"a" and as_bytes(7) == b"7"
    assert as_text(b"ok") == "ok" and as_text("x") == "x"
    with pytest.raises(UnicodeDecodeError):
        as_text(b"\xff")
