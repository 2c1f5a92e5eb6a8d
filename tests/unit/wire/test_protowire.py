"""Raw contents beside protobuf: split on receipt, joined once on sending, byte-exact both ways."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from dlscale.types import InferenceRequest, InferenceResponse
from dlscale.wire.grpc import (
    RAW_INPUT_FIELD,
    RAW_OUTPUT_FIELD,
    SPLIT_FROM_BYTES,
    decode_infer_request,
    decode_infer_response,
    encode_infer_response,
    frame_infer_request,
    frame_infer_response,
    read_framed,
    serialize,
)
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb
from dlscale.wire.protowire import embedded, field_parts, split_field, varint

LARGE = np.arange(2 * 3 * 224 * 224, dtype=np.float32).reshape(2, 3, 224, 224)


def test_varints_match_protobuf() -> None:
    for value in (0, 1, 127, 128, 300, 2**31, 2**63 - 1):
        assert varint(value) == pb.InferParameter(uint64_param=value).SerializeToString()[1:]


@pytest.mark.parametrize("size", [10, SPLIT_FROM_BYTES + 10])
def test_a_request_reads_back_the_same_from_views(size: int) -> None:
    a = np.arange(size // 4, dtype=np.float32)
    b = np.arange(7, dtype=np.int64)
    request = InferenceRequest("m", {"a": a, "b": b}, id="r", parameters={"priority": 2})
    data = serialize(frame_infer_request(request), RAW_INPUT_FIELD)
    # The same bytes protobuf would write for the whole message.
    whole = pb.ModelInferRequest.FromString(data)
    assert [bytes(r) for r in whole.raw_input_contents] == [a.tobytes(), b.tobytes()]
    framed = read_framed(data, pb.ModelInferRequest, RAW_INPUT_FIELD)
    assert not framed.message.raw_input_contents or size < SPLIT_FROM_BYTES
    decoded = decode_infer_request(framed)
    np.testing.assert_array_equal(decoded.inputs["a"], a)
    np.testing.assert_array_equal(decoded.inputs["b"], b)
    assert decoded.id == "r" and decoded.parameters == {"priority": 2}


def test_split_takes_the_field_wherever_it_is() -> None:
    # Raw blobs before, between and after the other fields: protobuf takes any order.
    head = pb.ModelInferRequest(model_name="m", id="i").SerializeToString()
    tail = pb.ModelInferRequest(model_version="3").SerializeToString()
    blobs = [b"one", b"", b"three" * 1000]
    data = b"".join(
        [
            *field_parts(RAW_INPUT_FIELD, blobs[:1]),
            head,
            *field_parts(RAW_INPUT_FIELD, blobs[1:2]),
            tail,
            *field_parts(RAW_INPUT_FIELD, blobs[2:]),
        ]
    )
    rest, views = split_field(data, RAW_INPUT_FIELD)
    assert [bytes(v) for v in views] == blobs
    parsed = pb.ModelInferRequest.FromString(rest)
    assert (parsed.model_name, parsed.id, parsed.model_version) == ("m", "i", "3")
    assert pb.ModelInferRequest.FromString(data).raw_input_contents == blobs


@pytest.mark.parametrize(
    "data",
    [
        b"\x3a\xff\xff\xff\xff\x0f",  # a raw blob longer than the message
        b"\x0a\x05ab",  # a string longer than the message
        b"\x08\xff",  # a truncated varint
        b"\x0f",  # wire type 7 does not exist
    ],
)
def test_malformed_messages_raise_what_protobuf_raises(data: bytes) -> None:
    with pytest.raises(DecodeError):
        split_field(data, RAW_INPUT_FIELD)
    with pytest.raises(DecodeError):
        pb.ModelInferRequest.FromString(data)


def test_a_response_serializes_as_protobuf_would() -> None:
    response = InferenceResponse("m", {"y": LARGE, "z": np.ones(3, np.int32)}, "1", "r")
    expected = encode_infer_response(response, True, 2**30).SerializeToString()
    data = serialize(frame_infer_response(response, True, 2**30), RAW_OUTPUT_FIELD)
    assert pb.ModelInferResponse.FromString(data) == pb.ModelInferResponse.FromString(expected)
    back = decode_infer_response(read_framed(data, pb.ModelInferResponse, RAW_OUTPUT_FIELD))
    np.testing.assert_array_equal(back.outputs["y"], LARGE)
    streamed = serialize(frame_infer_response(response, True, 2**30), RAW_OUTPUT_FIELD, True)
    wrapped = pb.ModelStreamInferResponse.FromString(streamed)
    assert wrapped.infer_response == pb.ModelInferResponse.FromString(expected)
    assert embedded(2, [b"ab"]) == [b"\x12\x02", b"ab"]


def _peak_bytes(work: Callable[[], Any]) -> int:
    """The most memory `work` held at once beyond what it started with (tracemalloc)."""
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        kept = work()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del kept
    return peak - start


def test_copies_of_the_payload_one_out_none_in() -> None:
    payload = LARGE.nbytes
    response = InferenceResponse("m", {"y": LARGE}, "1", "r")
    # Sending: the one join into the bytes gRPC takes, and nothing else of the payload's size.
    out = _peak_bytes(lambda: serialize(frame_infer_response(response, True, 2**30), 6))
    assert payload <= out < 1.1 * payload
    stream = _peak_bytes(lambda: serialize(frame_infer_response(response, True, 2**30), 6, True))
    assert payload <= stream < 1.1 * payload
    # Receiving: views of the received bytes, no copy of the payload.
    data = serialize(frame_infer_response(response, True, 2**30), RAW_OUTPUT_FIELD)
    read = _peak_bytes(
        lambda: decode_infer_response(read_framed(data, pb.ModelInferResponse, 6)).outputs
    )
    assert read < 0.1 * payload
    request = InferenceRequest("m", {"x": LARGE})
    sent = serialize(frame_infer_request(request), RAW_INPUT_FIELD)
    decoded = _peak_bytes(
        lambda: decode_infer_request(read_framed(sent, pb.ModelInferRequest, 7)).inputs
    )
    assert decoded < 0.1 * payload
