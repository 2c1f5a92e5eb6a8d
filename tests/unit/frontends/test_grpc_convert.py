"""The protobuf converter: every datatype both ways, raw and typed, and each decoding error."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from dlscale.errors import InvalidInput, PayloadTooLarge, Unsupported
from dlscale.frontends.grpc import convert
from dlscale.frontends.grpc.grpc_gen import inference_pb2 as pb
from dlscale.types import Datatype, InferenceRequest, InferenceResponse

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
    message = convert.infer_response(_response(array), raw=True, max_bytes=2**20)
    assert message.outputs[0].datatype == datatype.value
    assert list(message.outputs[0].shape) == [1, 3]
    decoded = convert.infer_request(_as_request(message)).inputs["t"]
    assert decoded.dtype == datatype.numpy
    assert decoded.tolist() == array.tolist()


@pytest.mark.parametrize("datatype", TYPED)
def test_typed_round_trip(datatype: Datatype) -> None:
    array = SAMPLES[datatype]
    message = convert.infer_response(_response(array), raw=False, max_bytes=2**20)
    assert not message.raw_output_contents
    decoded = convert.infer_request(_as_request(message)).inputs["t"]
    assert decoded.dtype == datatype.numpy
    assert decoded.tolist() == array.tolist()


def test_half_precision_outputs_force_raw() -> None:
    response = InferenceResponse(
        model_name="m",
        outputs={"a": SAMPLES[Datatype.FP32], "b": SAMPLES[Datatype.BF16]},
    )
    message = convert.infer_response(response, raw=False, max_bytes=2**20)
    assert len(message.raw_output_contents) == 2
    assert not any(o.HasField("contents") for o in message.outputs)


def test_str_outputs_become_bytes() -> None:
    array = np.array(["ab", "é"], dtype=object)
    raw = convert.infer_response(_response(array), raw=True, max_bytes=2**20)
    assert raw.raw_output_contents[0] == b"\x02\x00\x00\x00ab\x02\x00\x00\x00\xc3\xa9"
    typed = convert.infer_response(_response(array), raw=False, max_bytes=2**20)
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
    decoded = convert.infer_request(request)
    assert (decoded.model_name, decoded.model_version, decoded.id) == ("m", "2", "abc")
    assert decoded.priority == 2 and decoded.timeout_us == 5000
    assert decoded.parameters["note"] == "hi" and decoded.parameters["scale"] == 0.5
    assert decoded.outputs is not None and decoded.outputs[0].binary is True
    assert not convert.wants_raw(decoded)
    assert convert.wants_raw(InferenceRequest(model_name="m", inputs={}))


def test_no_outputs_means_all() -> None:
    request = pb.ModelInferRequest(model_name="m")
    assert convert.infer_request(request).outputs is None


def _decode_error(request: Any) -> str:
    with pytest.raises(InvalidInput) as info:
        convert.infer_request(request)
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
        convert.infer_request(request)


def test_response_size_limit() -> None:
    array = np.zeros((64, 64), np.float32)  # 16 KiB of data
    convert.infer_response(_response(array), raw=True, max_bytes=20_000)
    with pytest.raises(PayloadTooLarge, match="above the server's gRPC message limit of 16000"):
        convert.infer_response(_response(array), raw=True, max_bytes=16_000)


def test_model_config_layout() -> None:
    config = {
        "name": "m",
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "batching": {
            "max_queue_delay_us": 100,
            "preferred_batch_sizes": [4, 8],
            "priority_levels": 2,
            "default_priority_level": 2,
            "max_queue_size": 10,
            "default_timeout_us": 0,
        },
        "instances": [{"count": 2, "device": "cuda:1"}, {"count": 1, "device": "cpu"}],
        "metadata": {"owner": "me", "rank": 3},
    }
    meta = {
        "platform": "onnxruntime",
        "inputs": [{"name": "x", "datatype": "BYTES", "shape": [-1, 3]}],
        "outputs": [{"name": "y", "datatype": "BF16", "shape": [-1, 3, 4]}],
    }
    got = convert.model_config(config, meta).config
    assert got.max_batch_size == 8
    assert got.input[0].data_type == pb.TYPE_STRING and list(got.input[0].dims) == [3]
    assert got.output[0].data_type == pb.TYPE_BF16 and list(got.output[0].dims) == [3, 4]
    assert list(got.dynamic_batching.preferred_batch_size) == [4, 8]
    assert got.dynamic_batching.default_queue_policy.max_queue_size == 10
    kinds = [(g.kind, list(g.gpus), g.count) for g in got.instance_group]
    assert kinds == [
        (pb.ModelInstanceGroup.KIND_GPU, [1], 2),
        (pb.ModelInstanceGroup.KIND_CPU, [], 1),
    ]
    assert got.parameters["rank"].string_value == "3"


STAT_KEYS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


def test_statistics_layout() -> None:
    duration = {"count": 2, "ns": 1000}
    stats = {
        "model_stats": [
            {
                "name": "m",
                "version": "1",
                "last_inference": 123,
                "inference_count": 5,
                "execution_count": 2,
                "inference_stats": dict.fromkeys(STAT_KEYS, duration),
                "batch_stats": [{"batch_size": 4, "compute_infer": duration}],
            }
        ]
    }
    got = convert.statistics(stats).model_stats[0]
    assert (got.name, got.version, got.inference_count, got.execution_count) == ("m", "1", 5, 2)
    assert got.inference_stats.queue.ns == 1000
    assert got.batch_stats[0].batch_size == 4 and got.batch_stats[0].compute_infer.count == 2
    assert got.last_inference == 123
