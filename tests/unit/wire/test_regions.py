"""Tensors in shared-memory regions on the wire: parsed into references, written back, both ways."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dlscale.errors import InvalidInput
from dlscale.types import Datatype, InferenceResponse, RegionRef, RegionTensor
from dlscale.wire.grpc import decode_infer_request, decode_infer_response, encode_infer_response
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb
from dlscale.wire.regions import region_of, region_parameters
from dlscale.wire.rest import decode_request, decode_response, encode_response


def test_region_parameters_read_back() -> None:
    ref = RegionRef("r", 64, 8)
    assert region_of("input", "x", region_parameters(ref)) == ref
    assert region_parameters(RegionRef("r", 64)) == {
        "shared_memory_region": "r",
        "shared_memory_byte_size": 64,
    }
    assert region_of("input", "x", {"binary_data_size": 4}) is None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"shared_memory_region": "r"}, "both are required"),
        ({"shared_memory_byte_size": 4}, "without 'shared_memory_region'"),
        ({"shared_memory_region": "", "shared_memory_byte_size": 4}, "must be a region name"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": -1}, "non-negative integer"),
        (
            {
                "shared_memory_region": "r",
                "shared_memory_byte_size": 4,
                "shared_memory_offset": 1.5,
            },
            "non-negative integer",
        ),
        ({"shared_memory_region": 3, "shared_memory_byte_size": 4}, "must be a region name"),
    ],
)
def test_incomplete_region_parameters_are_refused(params: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        region_of("input", "x", params)


def test_rest_request_with_regions() -> None:
    doc = {
        "inputs": [
            {
                "name": "x",
                "shape": [2, 4],
                "datatype": "FP32",
                "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 32},
            }
        ],
        "outputs": [
            {
                "name": "y",
                "parameters": {
                    "shared_memory_region": "out",
                    "shared_memory_byte_size": 32,
                    "shared_memory_offset": 64,
                },
            }
        ],
    }
    request, _ = decode_request(json.dumps(doc).encode(), None, "m")
    assert request.inputs == {}
    assert request.in_regions == {"x": RegionTensor(Datatype.FP32, (2, 4), RegionRef("in", 32))}
    assert request.outputs is not None and request.outputs[0].region == RegionRef("out", 32, 64)
    doc["outputs"][0]["parameters"]["binary_data"] = True  # type: ignore[index]
    with pytest.raises(InvalidInput, match="both 'shared_memory_region' and 'binary_data'"):
        decode_request(json.dumps(doc).encode(), None, "m")


def test_rest_response_names_the_region_and_carries_no_data() -> None:
    placed = RegionTensor(Datatype.FP32, (2, 4), RegionRef("out", 32, 64))
    response = InferenceResponse("m", {"z": np.ones(2, np.int32)}, in_regions={"y": placed})
    body = encode_response(response, decode_request(b'{"inputs": []}', None, "m")[1])
    raw = b"".join(body.parts)
    doc = json.loads(raw)
    assert doc["outputs"][1] == {
        "name": "y",
        "datatype": "FP32",
        "shape": [2, 4],
        "parameters": {
            "shared_memory_region": "out",
            "shared_memory_byte_size": 32,
            "shared_memory_offset": 64,
        },
    }
    back = decode_response(raw, None)
    assert back.in_regions == {"y": placed}
    # Triton names no region in its answer: the client's own request says where it went.
    del doc["outputs"][1]["parameters"]
    asked = {"y": RegionRef("out", 32, 64)}
    assert decode_response(json.dumps(doc).encode(), None, asked).in_regions == {"y": placed}


def test_grpc_raw_contents_skip_inputs_in_regions() -> None:
    message = pb.ModelInferRequest(model_name="m")
    a = message.inputs.add(name="a", datatype="FP32", shape=[1, 2])
    a.parameters["shared_memory_region"].string_param = "in"
    a.parameters["shared_memory_byte_size"].int64_param = 8
    message.inputs.add(name="b", datatype="FP32", shape=[1, 2])
    message.raw_input_contents.append(np.array([[1, 2]], np.float32).tobytes())
    request = decode_infer_request(message)
    np.testing.assert_array_equal(request.inputs["b"], [[1, 2]])
    assert request.in_regions["a"].ref == RegionRef("in", 8)
    message.raw_input_contents.append(b"x" * 8)  # one blob per input: the region's must be empty
    with pytest.raises(InvalidInput, match="carries no data in the message"):
        decode_infer_request(message)


def test_grpc_response_gives_an_empty_blob_per_output_in_a_region() -> None:
    placed = RegionTensor(Datatype.FP32, (1, 2), RegionRef("out", 8))
    response = InferenceResponse("m", {"z": np.ones(2, np.float32)}, in_regions={"y": placed})
    message = encode_infer_response(response, raw=True, max_bytes=2**20)
    assert [o.name for o in message.outputs] == ["z", "y"]
    assert list(message.raw_output_contents) == [np.ones(2, np.float32).tobytes(), b""]
    back = decode_infer_response(message)
    assert back.in_regions == {"y": placed}
    np.testing.assert_array_equal(back.outputs["z"], np.ones(2))
