"""The codec's bounds: a tensor declares no more than it carries; malformed JSON is a 400.

Each case is decoded over REST and gRPC alike where the protocol can carry it; each is refused
with InvalidInput (400 / INVALID_ARGUMENT) before anything the size of the lie is allocated.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from dlscale.errors import InvalidInput
from dlscale.wire.bounds import MAX_DIMS
from dlscale.wire.grpc import decode_infer_request
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb
from dlscale.wire.rest import decode_request

#: Far below what any of the lies below would allocate (hundreds of MB to GB).
_SMALL_PEAK = 4 * 2**20


@contextmanager
def _peak_below(limit: int) -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < limit, f"decoding allocated {peak} bytes"


def _rest(doc: dict[str, Any], *blobs: bytes, max_elements: int | None = None) -> str:
    head = json.dumps(doc).encode()
    body = head + b"".join(blobs)
    kwargs = {} if max_elements is None else {"max_elements": max_elements}
    with pytest.raises(InvalidInput) as info:
        decode_request(body, len(head) if blobs else None, "m", **kwargs)
    return str(info.value)


def _grpc(shape: list[int], datatype: str, raw: bytes, max_elements: int | None = None) -> str:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype=datatype, shape=shape)
    message.raw_input_contents.append(raw)
    kwargs = {} if max_elements is None else {"max_elements": max_elements}
    with pytest.raises(InvalidInput) as info:
        decode_infer_request(message, **kwargs)
    return str(info.value)


def _binary_input(shape: list[int], datatype: str, size: int) -> dict[str, Any]:
    params = {"binary_data_size": size}
    return {"inputs": [{"name": "x", "shape": shape, "datatype": datatype, "parameters": params}]}


def test_a_bytes_shape_larger_than_its_data_allocates_nothing() -> None:
    # 193 bytes declaring 10^8 elements allocated 573 MB (REST) and 7.6 GB at 10^9 (gRPC);
    # 5 * 10^7 elements are within the element limit, so the bytes carried are what refuses.
    element = b"\x01\x00\x00\x00a"
    with _peak_below(_SMALL_PEAK):
        rest = _rest(_binary_input([5 * 10**7], "BYTES", len(element)), element)
        grpc = _grpc([5 * 10**7], "BYTES", element)
    assert "holds 50000000 elements" in rest and "holds 1" in rest
    assert "end after 1 of 50000000 elements" in grpc


@pytest.mark.parametrize("datatype", ["FP32", "UINT8", "BOOL"])
def test_a_numeric_shape_larger_than_its_data_allocates_nothing(datatype: str) -> None:
    with _peak_below(_SMALL_PEAK):
        rest = _rest(_binary_input([10**9], datatype, 4), b"\x00" * 4)
        grpc = _grpc([10**9], datatype, b"\x00" * 4)
    assert "max_tensor_elements" in rest and "max_tensor_elements" in grpc


@pytest.mark.parametrize(
    "shape",
    [[0, 2**62], [2**62, 0], [10**30], [1] * (MAX_DIMS + 1)],
    ids=["zero-hides-huge", "huge-then-zero", "beyond-int64", "65-dims"],
)
def test_impossible_shapes_are_refused_on_both_protocols(shape: list[int]) -> None:
    rest = _rest(_binary_input(shape, "FP32", 0), b"")
    assert "max_tensor_elements" in rest or "dimensions" in rest
    if max(shape) < 2**63:  # gRPC shapes are int64
        grpc = _grpc(shape, "FP32", b"")
        assert "max_tensor_elements" in grpc or "dimensions" in grpc


def test_the_configured_maximum_binds_even_when_the_data_is_there() -> None:
    raw = np.zeros(100, np.float32).tobytes()
    assert "100" in _rest(_binary_input([100], "FP32", len(raw)), raw, max_elements=99)
    assert "99 elements" in _grpc([100], "FP32", raw, max_elements=99)
    request = decode_infer_request(_with_raw([100], "FP32", raw), max_elements=100)
    assert request.inputs["x"].shape == (100,)


def _with_raw(shape: list[int], datatype: str, raw: bytes) -> Any:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype=datatype, shape=shape)
    message.raw_input_contents.append(raw)
    return message


def _json_doc(data: Any, datatype: str = "FP32", shape: list[int] | None = None) -> bytes:
    tensor = {"name": "x", "shape": shape or [1], "datatype": datatype, "data": data}
    return json.dumps({"inputs": [tensor]}).encode()


def _refused(body: bytes) -> str:
    with pytest.raises(InvalidInput) as info:
        decode_request(body, None, "m")
    return str(info.value)


def test_invalid_utf8_inside_a_json_string_is_the_clients_mistake() -> None:
    body = _json_doc(["ab"], "BYTES").replace(b"ab", b"a\xff")
    assert "invalid utf-8" in _refused(body).lower()  # msgspec words it as its release does
    name = _json_doc([1.0]).replace(b'"x"', b'"\xc3("')
    assert "invalid utf-8" in _refused(name).lower()


@pytest.mark.parametrize("depth", [70, 1_000, 5_000])
def test_deep_json_nesting_is_refused(depth: int) -> None:
    nested = b"[" * depth + b"1" + b"]" * depth
    body = _json_doc([0]).replace(b"[0]", nested)
    assert "nested" in _refused(body)
    strings = _json_doc(["a"], "BYTES").replace(b'["a"]', nested.replace(b"1", b'"a"'))
    assert "nested" in _refused(strings)


def test_bytes_data_nested_unevenly_deep_is_refused() -> None:
    uneven: Any = "a"
    for _ in range(200):
        uneven = [uneven]
    body = _json_doc(["a", uneven], "BYTES", [2])
    assert "nested deeper" in _refused(body)


def test_fp32_values_beyond_its_range_are_refused_not_made_infinite() -> None:
    assert "beyond the range of FP32" in _refused(_json_doc([1e39]))
    assert "beyond the range of FP32" in _refused(_json_doc([-1e300]))
    request, _ = decode_request(_json_doc([3.4e38]), None, "m")
    assert np.isfinite(request.inputs["x"]).all()
    fp64, _ = decode_request(_json_doc([1e300], "FP64"), None, "m")
    assert fp64.inputs["x"][0] == 1e300


def test_json_numbers_beyond_float64_are_refused() -> None:
    assert "out of range" in _refused(_json_doc([0]).replace(b"[0]", b"[1e400]"))


@pytest.mark.parametrize(
    "decode",
    [lambda: decode_request(b"\xff\xfe{", None, "m"), lambda: decode_request(b"{", None, "m")],
)
def test_malformed_json_says_so(decode: Callable[[], object]) -> None:
    with pytest.raises(InvalidInput, match="malformed JSON"):
        decode()
