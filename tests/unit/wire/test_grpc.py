"""ModelInfer messages: every datatype both ways, raw and typed, each decoding error, both sides."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from dlscale.errors import InvalidInput, PayloadTooLarge, Unsupported
from dlscale.types import Datatype, InferenceRequest, InferenceResponse, RequestedOutput
from dlscale.wire.grpc import (
    decode_infer_request,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
    wants_raw,
)
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb

SAMPLES: dict[Datatype, np.ndarray] = {
    Datatype.BOOL: np.array([[True, False, True]]),
    Datatype.UINT8: np.array([[0, 7, 255]], np.uint8),
    Datatype.UINT16: np.array([[0, 7, 65535]], np.uint16),
    Datatype.UINT32: np.array([[0, 7, 2**32 - 1]], np.uint32),
    Datatype.UINT64: np.array([[0, 7, 2**64 - 1]], np.uint64),
    Datatype.INT8: np.array([[-128, 0, 127]], np.int8),
    Datatype.INT16: np.array([[-(2**15), 0, 2**15 - 1]], np.int16),
    Datatype.INT32: np.array([[-(2**31), 0, 2**31 - 1]], np.int32),
    Datatype.INT64: np.array([[-(2**63), 0, 2**63 - 1]], np.int64),
    Datatype.FP16: np.array([[0.5, -2.0, 65504.0]], np.float16),
    Datatype.BF16: np.array([[0.5, -2.0, 3.0e38]], ml_dtypes.bfloat16),
    Datatype.FP32: np.array([[0.5, -2.0, 1e-30]], np.float32),
    Datatype.FP64: np.array([[0.5, -2.0, 1e-300]], np.float64),
    Datatype.BYTES: np.array([[b"", b"a\x00b", "é".encode()]], dtype=object),
}
TYPED = [d for d in Datatype if d not in (Datatype.FP16, Datatype.BF16)]


def _response(array: np.ndarray) -> InferenceResponse:
    return InferenceResponse(model_name="m", model_version="1", id="r", outputs={"t": array})


def _as_request(response_message: Any) -> Any:
    """Turn an encoded response into a request carrying the same tensor, the same way."""
    request = pb.ModelInferRequest(model_name="m")
    for out in response_message.outputs:
        tensor = request.inputs.add(name=out.name, datatype=out.datatype, shape=out.shape)
        if out.HasField("contents"):
            tensor.contents.CopyFrom(out.contents)
    request.raw_input_contents.extend(response_message.raw_output_contents)
    return request


@pytest.mark.parametrize("datatype", list(Datatype))
def test_raw_round_trip(datatype: Datatype) -> None:
    array = SAMPLES[datatype]
    message = encode_infer_response(_response(array), raw=True, max_bytes=2**20)
    assert message.outputs[0].datatype == datatype.value
    assert list(message.outputs[0].shape) == [1, 3]
    decoded = decode_infer_request(_as_request(message)).inputs["t"]
    assert decoded.dtype == datatype.numpy
    assert decoded.tolist() == array.tolist()


@pytest.mark.parametrize("datatype", TYPED)
def test_typed_round_trip(datatype: Datatype) -> None:
    array = SAMPLES[datatype]
    message = encode_infer_response(_response(array), raw=False, max_bytes=2**20)
    assert not message.raw_output_contents
    decoded = decode_infer_request(_as_request(message)).inputs["t"]
    assert decoded.dtype == datatype.numpy
    assert decoded.tolist() == array.tolist()


def test_half_precision_outputs_force_raw() -> None:
    response = InferenceResponse(
        model_name="m",
        outputs={"a": SAMPLES[Datatype.FP32], "b": SAMPLES[Datatype.BF16]},
    )
    message = encode_infer_response(response, raw=False, max_bytes=2**20)
    assert len(message.raw_output_contents) == 2
    assert not any(o.HasField("contents") for o in message.outputs)


def test_str_outputs_become_bytes() -> None:
    array = np.array(["ab", "é"], dtype=object)
    raw = encode_infer_response(_response(array), raw=True, max_bytes=2**20)
    assert raw.raw_output_contents[0] == b"\x02\x00\x00\x00ab\x02\x00\x00\x00\xc3\xa9"
    typed = encode_infer_response(_response(array), raw=False, max_bytes=2**20)
    assert list(typed.outputs[0].contents.bytes_contents) == [b"ab", "é".encode()]


def test_request_fields_and_parameters() -> None:
    request = pb.ModelInferRequest(model_name="m", model_version="2", id="abc")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    request.raw_input_contents.append(np.zeros(2, np.float32).tobytes())
    request.parameters["priority"].uint64_param = 2
    request.parameters["timeout"].int64_param = 5000
    request.parameters["binary_data_output"].bool_param = False
    request.parameters["note"].string_param = "hi"
    request.parameters["scale"].double_param = 0.5
    request.outputs.add(name="y").parameters["binary_data"].bool_param = True
    decoded = decode_infer_request(request)
    assert (decoded.model_name, decoded.model_version, decoded.id) == ("m", "2", "abc")
    assert decoded.priority == 2 and decoded.timeout_us == 5000
    assert decoded.parameters["note"] == "hi" and decoded.parameters["scale"] == 0.5
    assert decoded.outputs is not None and decoded.outputs[0].binary is True
    assert not wants_raw(decoded)
    assert wants_raw(InferenceRequest(model_name="m", inputs={}))


def test_no_outputs_means_all() -> None:
    request = pb.ModelInferRequest(model_name="m")
    assert decode_infer_request(request).outputs is None


def _decode_error(request: Any) -> str:
    with pytest.raises(InvalidInput) as info:
        decode_infer_request(request)
    return str(info.value)


def test_decoding_errors() -> None:
    negative = pb.ModelInferRequest(model_name="m")
    negative.inputs.add(name="x", datatype="FP32", shape=[-1, 2])
    assert "dimensions must be >= 0" in _decode_error(negative)

    twice = pb.ModelInferRequest(model_name="m")
    twice.inputs.add(name="x", datatype="INT32", shape=[0])
    twice.inputs.add(name="x", datatype="INT32", shape=[0])
    assert _decode_error(twice) == "input 'x' appears more than once in the request"

    narrow = pb.ModelInferRequest(model_name="m")
    narrow.inputs.add(name="x", datatype="INT8", shape=[2]).contents.int_contents.extend([1, 300])
    assert _decode_error(narrow) == "input 'x': values out of range for INT8"

    trailing = pb.ModelInferRequest(model_name="m")
    trailing.inputs.add(name="s", datatype="BYTES", shape=[1])
    trailing.raw_input_contents.append(b"\x01\x00\x00\x00ab")
    assert "1 bytes remain in its BYTES raw contents" in _decode_error(trailing)

    short = pb.ModelInferRequest(model_name="m")
    short.inputs.add(name="s", datatype="BYTES", shape=[2])
    short.raw_input_contents.append(b"\x00\x00\x00\x00")
    assert "end after 1 of 2 elements" in _decode_error(short)

    empty = pb.ModelInferRequest(model_name="m")
    empty.inputs.add(name="x", datatype="FP32", shape=[3])
    assert _decode_error(empty) == "input 'x': 0 values in fp32_contents, but shape [3] holds 3"

    no_value = pb.ModelInferRequest(model_name="m")
    no_value.parameters["priority"].SetInParent()
    assert _decode_error(no_value) == "parameter 'priority' has no value"


def test_classification_is_unsupported() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.outputs.add(name="y").parameters["classification"].int64_param = 3
    with pytest.raises(Unsupported, match="classification"):
        decode_infer_request(request)


def test_response_size_limit() -> None:
    array = np.zeros((64, 64), np.float32)  # 16 KiB of data
    encode_infer_response(_response(array), raw=True, max_bytes=20_000)
    with pytest.raises(PayloadTooLarge, match="above the server's gRPC message limit of 16000"):
        encode_infer_response(_response(array), raw=True, max_bytes=16_000)


# -- the client's side: the same messages, the other way -------------------------------------------


@pytest.mark.parametrize("datatype", list(Datatype))
def test_client_requests_decode_as_the_server_reads_them(datatype: Datatype) -> None:
    array = SAMPLES[datatype]
    request = InferenceRequest(
        "m",
        {"t": array},
        model_version="2",
        id="c",
        outputs=[RequestedOutput("y", parameters={"binary_data": True})],
        parameters={"priority": 1, "timeout": 2**63, "note": "hi", "flag": False, "scale": 0.5},
    )
    message = encode_infer_request(request)
    assert len(message.raw_input_contents) == 1
    decoded = decode_infer_request(pb.ModelInferRequest.FromString(message.SerializeToString()))
    assert decoded.inputs["t"].dtype == datatype.numpy
    assert decoded.inputs["t"].tolist() == array.tolist()
    assert (decoded.model_version, decoded.id) == ("2", "c")
    assert decoded.parameters == request.parameters
    assert decoded.outputs is not None and decoded.outputs[0].binary is True


@pytest.mark.parametrize("raw", [True, False])
def test_client_reads_server_responses_with_the_same_readers(raw: bool) -> None:
    outputs = {d.value: SAMPLES[d] for d in TYPED}
    message = encode_infer_response(InferenceResponse("m", outputs, "1", "r"), raw, 2**20)
    decoded = decode_infer_response(pb.ModelInferResponse.FromString(message.SerializeToString()))
    assert (decoded.model_name, decoded.model_version, decoded.id) == ("m", "1", "r")
    for name, array in outputs.items():
        assert decoded.outputs[name].dtype == array.dtype
        assert decoded.outputs[name].tolist() == array.tolist()


def test_client_decoding_errors_are_the_servers() -> None:
    reply = pb.ModelInferResponse(model_name="m")
    reply.outputs.add(name="y", datatype="FP32", shape=[4])
    reply.raw_output_contents.append(b"\x00" * 8)
    with pytest.raises(InvalidInput) as info:
        decode_infer_response(reply)
    assert (
        str(info.value)
        == "output 'y': its raw contents hold 8 bytes, but shape [4] of FP32 needs 16"
    )
    reply.outputs.add(name="z", datatype="FP32", shape=[1])
    with pytest.raises(InvalidInput, match="the response has 2 outputs but 1 raw_output_contents"):
        decode_infer_response(reply)


# -- the published schema (tritonclient's generated messages) --------------------------------------

service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")


def test_infer_request_bytes_parse_as_the_published_message() -> None:
    ours = pb.ModelInferRequest(model_name="m", model_version="2", id="x")
    tensor = ours.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 3])
    tensor.parameters["binary_data_size"].int64_param = 24
    ours.parameters["priority"].int64_param = 1
    ours.outputs.add(name="OUTPUT0")
    ours.raw_input_contents.append(b"\x00" * 24)
    theirs = service_pb2.ModelInferRequest.FromString(ours.SerializeToString())
    assert theirs.model_name == "m" and theirs.model_version == "2" and theirs.id == "x"
    assert list(theirs.inputs[0].shape) == [2, 3]
    assert theirs.inputs[0].parameters["binary_data_size"].int64_param == 24
    assert theirs.parameters["priority"].int64_param == 1
    assert theirs.outputs[0].name == "OUTPUT0"
    assert theirs.raw_input_contents[0] == b"\x00" * 24


def test_published_responses_parse_as_ours() -> None:
    reply = service_pb2.ModelInferResponse(model_name="m", id="7")
    out = reply.outputs.add(name="y", datatype="INT64", shape=[3])
    out.contents.int64_contents.extend([1, 2, 3])
    meta = service_pb2.ModelMetadataResponse(name="m", versions=["1"], platform="onnx")
    meta.inputs.add(name="x", datatype="FP16", shape=[-1, 4])
    got = pb.ModelInferResponse.FromString(reply.SerializeToString())
    assert list(got.outputs[0].contents.int64_contents) == [1, 2, 3]
    assert decode_infer_response(got).outputs["y"].tolist() == [1, 2, 3]
    got_meta = pb.ModelMetadataResponse.FromString(meta.SerializeToString())
    assert got_meta.inputs[0].datatype == "FP16" and list(got_meta.inputs[0].shape) == [-1, 4]
