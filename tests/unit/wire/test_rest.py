"""The REST body codec: JSON and binary tensors both ways, for the server and the client."""

from __future__ import annotations

import json
import struct
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest

from dlscale.errors import InvalidInput
from dlscale.types import Datatype, InferenceRequest, InferenceResponse, TensorSpec
from dlscale.wire.rest import (
    OutputFormat,
    decode_raw_request,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from dlscale.wire.tensors import serialize_bytes


def _json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def _binary(doc: dict[str, Any], *blobs: bytes) -> tuple[bytes, int]:
    head = _json(doc)
    return head + b"".join(blobs), len(head)


def test_nested_and_flat_json_decode_alike() -> None:
    for data in ([[1, 2, 3], [4, 5, 6]], [1, 2, 3, 4, 5, 6]):
        doc = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": data}]}
        request, fmt = decode_request(_json(doc), None, "m", "2")
        x = request.inputs["x"]
        assert x.dtype == np.float32
        np.testing.assert_array_equal(x, np.arange(1, 7, dtype=np.float32).reshape(2, 3))
        assert request.model_version == "2"
        assert request.outputs is None
        assert not fmt.all_binary


def test_id_parameters_and_requested_outputs() -> None:
    doc = {
        "id": "abc",
        "parameters": {"priority": 2, "timeout": 500, "custom": "yes"},
        "inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [-3]}],
        "outputs": [{"name": "a", "parameters": {"binary_data": True}}, {"name": "b"}],
    }
    request, fmt = decode_request(_json(doc), None, "m")
    assert request.id == "abc"
    assert request.priority == 2
    assert request.timeout_us == 500
    assert request.parameters["custom"] == "yes"
    assert [o.name for o in request.outputs or []] == ["a", "b"]
    assert fmt.is_binary("a")
    assert not fmt.is_binary("b")


def test_binary_inputs_are_views_of_the_body() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    n = np.array([1, -1], dtype=np.int64)
    doc = {
        "inputs": [
            {
                "name": "x",
                "shape": [3, 4],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 48},
            },
            {"name": "n", "shape": [2], "datatype": "INT64", "data": [1, -1]},
            {"name": "b", "shape": [2], "datatype": "BF16", "parameters": {"binary_data_size": 4}},
        ],
        "parameters": {"binary_data_output": True},
    }
    bf = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    body, length = _binary(doc, x.tobytes(), bf.tobytes())
    buffer = bytearray(body)
    request, fmt = decode_request(buffer, length, "m")
    np.testing.assert_array_equal(request.inputs["x"], x)
    np.testing.assert_array_equal(request.inputs["n"], n)
    np.testing.assert_array_equal(request.inputs["b"], bf)
    assert fmt.all_binary
    buffer[length] = 0xFF  # no copy was made: the array sees the change
    assert request.inputs["x"][0, 0] != 0.0


def test_bytes_json_and_binary() -> None:
    doc = {"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES", "data": ["é", ""]}]}
    request, _ = decode_request(_json(doc), None, "m")
    assert list(request.inputs["s"]) == ["é".encode(), b""]
    raw = serialize_bytes([b"\xff\x00", "ok"])
    assert raw == struct.pack("<I", 2) + b"\xff\x00" + struct.pack("<I", 2) + b"ok"
    doc = {
        "inputs": [
            {
                "name": "s",
                "shape": [1, 2],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(raw)},
            }
        ]
    }
    body, length = _binary(doc, raw)
    request, _ = decode_request(body, length, "m")
    assert request.inputs["s"].tolist() == [[b"\xff\x00", b"ok"]]


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("FP16", [1.0], "JSON cannot carry"),
        ("BF16", [1.0], "JSON cannot carry"),
        ("UINT8", [256], "outside the range of UINT8"),
        ("INT32", [True], "integers"),
        ("BOOL", [1], "true/false"),
        ("FP32", [[1.0], [2.0, 3.0]], "ragged"),
        ("FP32", [1.0, "2"], "numbers"),
        ("FP32", None, "neither data nor binary_data_size"),
        ("INT4", [1], "unknown datatype"),
        ("FP64", [1.0, 2.0], "holds 2"),
    ],
)
def test_bad_json_tensors(datatype: str, data: Any, message: str) -> None:
    doc = {"inputs": [{"name": "x", "shape": [1], "datatype": datatype, "data": data}]}
    with pytest.raises(InvalidInput, match=message):
        decode_request(_json(doc), None, "m")


def test_malformed_and_invalid_documents() -> None:
    with pytest.raises(InvalidInput, match="malformed JSON"):
        decode_request(b"{", None, "m")
    with pytest.raises(InvalidInput, match=r"invalid inference request.*\$\.inputs\[0\]\.shape"):
        decode_request(
            _json({"inputs": [{"name": "x", "shape": "1", "datatype": "FP32"}]}), None, "m"
        )
    with pytest.raises(InvalidInput, match="object"):
        decode_request(b"[]", None, "m")
    # priority and timeout are checked once, by the DataPlane, for both protocols
    # (tests/unit/serving/test_dataplane.py); the codec passes them through.
    request, _ = decode_request(_json({"inputs": [], "parameters": {"priority": -1}}), None, "m")
    assert request.parameters["priority"] == -1


def test_raw_form() -> None:
    spec = TensorSpec("x", Datatype.FP32, (-1, 4))
    x = np.arange(4, dtype=np.float32)
    request, fmt = decode_raw_request(x.tobytes(), spec, True, "m")
    assert request.inputs["x"].shape == (1, 4)
    assert fmt.all_binary
    variable = TensorSpec("x", Datatype.INT16, (-1,))
    request, _ = decode_raw_request(b"\1\0\2\0\3\0", variable, False, "m")
    assert request.inputs["x"].tolist() == [1, 2, 3]
    with pytest.raises(InvalidInput, match="takes 16 bytes"):
        decode_raw_request(b"\0" * 12, spec, True, "m")
    with pytest.raises(InvalidInput, match="several variable dims"):
        decode_raw_request(b"\0" * 16, TensorSpec("x", Datatype.FP32, (-1, -1, 4)), False, "m")


def test_encode_json_binary_and_half() -> None:
    response = InferenceResponse(
        model_name="m",
        model_version="3",
        id="q",
        outputs={
            "a": np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2],  # not contiguous
            "b": np.array([[1, 2]], dtype=np.uint16),
            "h": np.array([0.5], dtype=np.float16),
            "s": np.array(["x", b"y"], dtype=object),
        },
    )
    encoded = encode_response(response, OutputFormat(binary=frozenset({"b"})))
    assert encoded.header_length is not None
    header = orjson.loads(bytes(encoded.parts[0]))
    assert header["id"] == "q"
    assert header["model_version"] == "3"
    a, b, h, s = header["outputs"]
    assert a == {"name": "a", "datatype": "FP32", "shape": [2, 2], "data": [0.0, 2.0, 3.0, 5.0]}
    assert b["parameters"] == {"binary_data_size": 4}
    assert h["parameters"] == {"binary_data_size": 2}  # FP16 always goes binary
    assert s["data"] == ["x", "y"]
    assert bytes(encoded.parts[1]) == np.array([1, 2], dtype=np.uint16).tobytes()
    assert bytes(encoded.parts[2]) == np.array([0.5], dtype=np.float16).tobytes()
    only_json = encode_response(
        InferenceResponse("m", {"a": np.zeros(2, dtype=np.float32)}), OutputFormat()
    )
    assert only_json.header_length is None
    assert len(only_json.parts) == 1


def test_encode_rejects_non_utf8_bytes_in_json() -> None:
    response = InferenceResponse("m", {"s": np.array([b"\xff"], dtype=object)})
    with pytest.raises(InvalidInput, match="binary_data"):
        encode_response(response, OutputFormat())
    encoded = encode_response(response, OutputFormat(all_binary=True))
    assert bytes(encoded.parts[1]) == struct.pack("<I", 1) + b"\xff"


# -- the client's side: the same layout, the other way ---------------------------------------------


def _as_body(encoded: Any) -> tuple[bytes, int | None]:
    return b"".join(bytes(p) for p in encoded.parts), encoded.header_length


@pytest.mark.parametrize("binary", [False, True])
def test_client_requests_decode_as_the_server_reads_them(binary: bool) -> None:
    inputs = {
        "x": np.arange(6, dtype=np.float32).reshape(2, 3),
        "n": np.array([[1, -2]], dtype=np.int64),
        "s": np.array([["é", b"\x00b"]], dtype=object),
        "h": np.array([0.5, -2.0], dtype=np.float16),  # binary whatever was asked
    }
    if not binary:
        inputs["s"] = np.array([["é", "b"]], dtype=object)  # JSON carries UTF-8 text only
    body, length = _as_body(encode_request(InferenceRequest("m", inputs, id="r"), binary))
    assert length is not None  # the FP16 input always travels binary
    request, fmt = decode_request(body, length, "m")
    assert request.id == "r" and fmt.all_binary == binary
    for name, array in inputs.items():
        got = request.inputs[name]
        assert got.dtype == Datatype.from_numpy(array.dtype).numpy and got.shape == array.shape
        expected = [x.encode() if isinstance(x, str) else x for x in array.reshape(-1).tolist()]
        assert got.reshape(-1).tolist() == expected


def test_client_reads_server_responses_with_the_same_parser() -> None:
    outputs = {
        "a": np.arange(4, dtype=np.float32).reshape(2, 2),
        "b": np.array([True, False]),
        "s": np.array([b"\xff", b""], dtype=object),
        "h": np.array([0.5], dtype=np.float16),
    }
    response = InferenceResponse("m", outputs, model_version="3", id="q")
    body, length = _as_body(encode_response(response, OutputFormat(binary=frozenset({"s"}))))
    decoded = decode_response(body, length)
    assert (decoded.model_name, decoded.model_version, decoded.id) == ("m", "3", "q")
    for name, array in outputs.items():
        assert decoded.outputs[name].dtype == array.dtype
        assert decoded.outputs[name].tolist() == array.tolist()


def _binary_answer(size: int) -> bytes:
    output = {
        "name": "y",
        "shape": [4],
        "datatype": "FP32",
        "parameters": {"binary_data_size": size},
    }
    return _json({"outputs": [output]})


def test_client_decoding_errors_are_the_servers() -> None:
    head = _binary_answer(8)
    with pytest.raises(
        InvalidInput, match="output 'y' of shape \\[4\\] and datatype FP32 takes 16 bytes"
    ):
        decode_response(head + b"\0" * 8, len(head))
    head = _binary_answer(16)
    with pytest.raises(InvalidInput, match="2 bytes after the JSON header"):
        decode_response(head + b"\0" * 18, len(head))
    with pytest.raises(InvalidInput, match="invalid inference response"):
        decode_response(_json({"model_name": "m"}), None)
    other = _json(
        {
            "outputs": [
                {
                    "name": "y",
                    "shape": [1],
                    "datatype": "INT64",
                    "data": [7],
                    "parameters": {"content_type": {"np": 1}},
                }
            ]
        }
    )
    assert decode_response(other, None).outputs["y"].tolist() == [7]
