"""The rules the small-request path of ModelInfer keeps while it takes less work per call.

A small ModelInferRequest is parsed whole by protobuf and a large one split around its raw
contents (frontends/grpc/frontend.py); each tensor's shape is checked once, against the server's
own element limit, also for a tensor in a shared-memory region (wire/grpc.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from tests.toolkit.server import LocalServer, serving
from tritonclient.grpc import service_pb2

from dlscale.wire.grpc import SPLIT_FROM_BYTES

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
#: The element limit of the server below: well under the codec's default.
MOST = 1000


@pytest.fixture(scope="module")
def limited(repo: Path) -> Iterator[LocalServer]:
    with serving(repo, http_port=None, max_tensor_elements=MOST) as running:
        yield running


def _infer(url: str, message: service_pb2.ModelInferRequest) -> service_pb2.ModelInferResponse:
    with grpc.insecure_channel(url) as channel:
        call = channel.unary_unary(
            INFER,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        answer: service_pb2.ModelInferResponse = call(message, timeout=30)
        return answer


def test_a_region_tensor_is_held_to_the_servers_element_limit(limited: LocalServer) -> None:
    # A tensor in a region carries no data, so no read of its bytes refuses it: its shape is
    # checked against the server's limit (not only the codec's default) before anything else.
    message = service_pb2.ModelInferRequest(model_name="identity")
    tensor = message.inputs.add(name="x", datatype="FP32", shape=[100, 16])
    tensor.parameters["shared_memory_region"].string_param = "nowhere"
    tensor.parameters["shared_memory_byte_size"].int64_param = 100 * 16 * 4
    with pytest.raises(grpc.RpcError) as caught:
        _infer(limited.grpc_url, message)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"more than the {MOST} elements" in caught.value.details()


def test_a_tensor_within_the_limit_is_answered(limited: LocalServer) -> None:
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    message = service_pb2.ModelInferRequest(model_name="identity")
    message.inputs.add(name="x", datatype="FP32", shape=[2, 16])
    message.raw_input_contents.append(x.tobytes())
    answer = _infer(limited.grpc_url, message)
    assert np.frombuffer(answer.raw_output_contents[0], np.float32).tolist() == x.ravel().tolist()


@pytest.mark.parametrize("size", [16, SPLIT_FROM_BYTES], ids=["parsed-whole", "split"])
def test_small_and_large_messages_answer_alike(server: LocalServer, size: int) -> None:
    # BYTES elements of `size` bytes each: the second message is past the split size.
    elements = [b"a" * size, b"b" * size]
    raw = b"".join(len(e).to_bytes(4, "little") + e for e in elements)
    message = service_pb2.ModelInferRequest(model_name="ints_bytes", id="same")
    message.inputs.add(name="i", datatype="INT64", shape=[1, 3])
    message.inputs.add(name="s", datatype="BYTES", shape=[1, 2])
    message.raw_input_contents.extend([np.array([[1, 2, 3]], np.int64).tobytes(), raw])
    answer = _infer(server.grpc_url, message)
    outputs = dict(zip((o.name for o in answer.outputs), answer.raw_output_contents, strict=True))
    assert answer.id == "same" and outputs["s_out"] == raw
    assert np.frombuffer(outputs["i2"], np.int64).tolist() == [2, 4, 6]


def test_raw_and_typed_contents_together_are_refused_in_a_small_message(
    server: LocalServer,
) -> None:
    message = service_pb2.ModelInferRequest(model_name="two_inputs")
    a = message.inputs.add(name="a", datatype="FP32", shape=[1, 2])
    a.contents.fp32_contents.extend([1.0, 2.0])
    message.inputs.add(name="b", datatype="FP32", shape=[1, 2])
    message.raw_input_contents.append(np.zeros(2, np.float32).tobytes())
    with pytest.raises(grpc.RpcError) as caught:
        _infer(server.grpc_url, message)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "typed contents" in caught.value.details()


def test_an_undecodable_stream_message_names_its_method(server: LocalServer) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stream = channel.stream_stream(STREAM)
        with pytest.raises(grpc.RpcError) as caught:
            list(stream(iter([b"\xff\xff\xff\xff"]), timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the ModelStreamInfer request is not a valid protobuf" in caught.value.details()
