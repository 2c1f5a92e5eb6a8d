"""The bench's OIP messages and raw tensor codec against the published proto (tritonclient's)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dlscale.bench import oip_proto as pb
from dlscale.bench.tensors import from_raw, to_raw
from dlscale.errors import BenchError

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
    got_meta = pb.ModelMetadataResponse.FromString(meta.SerializeToString())
    assert got_meta.inputs[0].datatype == "FP16" and list(got_meta.inputs[0].shape) == [-1, 4]


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
    from dlscale.types import Datatype

    datatype = Datatype.from_numpy(array.dtype).value
    back = from_raw(to_raw(array), datatype, array.shape)
    assert back.dtype == array.dtype and np.array_equal(back, array)


def test_bytes_tensors_are_length_prefixed() -> None:
    array = np.array([b"ab", b""], dtype=object)
    raw = to_raw(array)
    assert raw == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"
    assert list(from_raw(raw, "BYTES", [2])) == [b"ab", b""]


def test_a_short_buffer_is_an_error_naming_sizes() -> None:
    with pytest.raises(BenchError, match="needs 16 bytes; got 8"):
        from_raw(b"\x00" * 8, "FP32", [4])
