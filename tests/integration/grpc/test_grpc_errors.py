"""Bad requests over gRPC: the right status code and a message that says what was wrong."""

from __future__ import annotations

import concurrent.futures

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tests.toolkit.clients import infer_input
from tests.toolkit.repositories import FRAGILE_ROWS, SMALL_LIMIT, WIDEN
from tests.toolkit.server import LocalServer
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

Stub = service_pb2_grpc.GRPCInferenceServiceStub


def _fails(
    client: triton.InferenceServerClient, model: str, *inputs: triton.InferInput, **kwargs: object
) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, list(inputs), **kwargs)
    return info.value


def _rpc_error(stub: Stub, request: service_pb2.ModelInferRequest) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    return info.value


def _raw_request(
    model: str, name: str, datatype: str, shape: list[int], blob: bytes
) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.append(blob)
    return request


X = np.zeros((2, 16), np.float32)

# -- what the DataPlane refuses: the same messages REST gives --------------------------------------


def test_unknown_model_and_version(client: triton.InferenceServerClient) -> None:
    err = _fails(client, "nothing", infer_input("x", X))
    assert err.status() == "StatusCode.NOT_FOUND"
    assert err.message().startswith("unknown model 'nothing' (loaded: 'fragile', 'half'")
    err = _fails(client, "identity", infer_input("x", X), model_version="9")
    assert err.status() == "StatusCode.NOT_FOUND"
    assert err.message() == "model 'identity' has no version '9' (served: [1])"
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        client.get_model_metadata("nothing")
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        client.get_model_config("nothing")
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        client.get_inference_statistics("nothing")


def test_missing_and_unexpected_inputs(client: triton.InferenceServerClient) -> None:
    a = np.zeros((1, 4), np.float32)
    err = _fails(client, "two_inputs", infer_input("a", a))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message() == "model 'two_inputs' expects inputs ['a', 'b']; the request lacks ['b']"
    three = [infer_input(n, a) for n in ("a", "b", "c")]
    err = _fails(client, "two_inputs", *three)
    assert err.message() == "unexpected inputs ['c'] for model 'two_inputs' (it takes: 'a', 'b')"


def test_wrong_datatype_and_shape(client: triton.InferenceServerClient) -> None:
    err = _fails(client, "identity", infer_input("x", X.astype(np.float64)))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message() == (
        "input 'x' of model 'identity' has datatype FP32; the request gave FP64"
    )
    err = _fails(client, "identity", infer_input("x", np.zeros((2, 15), np.float32)))
    assert err.message() == (
        "input 'x' of model 'identity' has shape [-1, 16]; the request gave [2, 15]"
    )


def test_batch_above_max_batch_size(client: triton.InferenceServerClient) -> None:
    err = _fails(client, "identity", infer_input("x", np.zeros((33, 16), np.float32)))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message() == "batch size 33 exceeds max_batch_size 32 of model 'identity'"


def test_unknown_output_and_bad_priority(client: triton.InferenceServerClient) -> None:
    err = _fails(
        client, "identity", infer_input("x", X), outputs=[triton.InferRequestedOutput("z")]
    )
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "unknown outputs ['z']" in err.message()
    err = _fails(client, "identity", infer_input("x", X), priority=3)
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "priority 3 is out of range" in err.message()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("priority", "high", "parameter 'priority' must be a non-negative integer, got 'high'"),
        ("priority", -1, "parameter 'priority' must be a non-negative integer, got -1"),
        ("timeout", "soon", "parameter 'timeout' must be a non-negative integer, got 'soon'"),
        ("timeout", -5, "parameter 'timeout' must be a non-negative integer, got -5"),
        ("timeout", 0.5, "parameter 'timeout' must be a non-negative integer, got 0.5"),
    ],
)
def test_bad_priority_and_timeout(stub: Stub, key: str, value: object, message: str) -> None:
    # Checked once, in the DataPlane: the same code and message as over REST.
    request = _raw_request("identity", "x", "FP32", [2, 16], X.tobytes())
    if isinstance(value, str):
        request.parameters[key].string_param = value
    elif isinstance(value, float):
        request.parameters[key].double_param = value
    else:
        request.parameters[key].int64_param = int(value)  # type: ignore[call-overload]
    err = _rpc_error(stub, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == message + (" (microseconds)" if key == "timeout" else "")


def test_timeout_expires_in_the_queue(client: triton.InferenceServerClient) -> None:
    # fragile waits up to a second to fill a batch; a 1 ms timeout expires first.
    err = _fails(client, "fragile", infer_input("x", np.zeros((1, 4), np.float32)), timeout=1000)
    assert err.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert "timed out in the queue" in err.message()


# -- what the frontend refuses while decoding ------------------------------------------------------


def test_data_length_mismatch(stub: Stub) -> None:
    err = _rpc_error(stub, _raw_request("identity", "x", "FP32", [2, 16], b"\x00" * 100))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        "input 'x': its raw contents hold 100 bytes, but shape [2, 16] of FP32 needs 128"
    )


def test_typed_count_mismatch(stub: Stub) -> None:
    request = service_pb2.ModelInferRequest(model_name="identity")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 16]).contents.fp32_contents.extend(
        [1.0] * 31
    )
    err = _rpc_error(stub, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "input 'x': 31 values in fp32_contents, but shape [2, 16] holds 32"


def test_unknown_datatype(stub: Stub) -> None:
    err = _rpc_error(stub, _raw_request("identity", "x", "FP8", [2, 16], b"\x00" * 32))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("input 'x' has unknown datatype 'FP8' (known: BOOL, UINT8")


def test_raw_count_mismatch(stub: Stub) -> None:
    request = _raw_request("two_inputs", "a", "FP32", [1, 4], b"\x00" * 16)
    request.inputs.add(name="b", datatype="FP32", shape=[1, 4])
    err = _rpc_error(stub, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        "the request has 2 inputs but 1 raw_input_contents; give one raw blob per input, in the "
        "order of the inputs"
    )


def test_typed_and_raw_mixed(stub: Stub) -> None:
    request = _raw_request("two_inputs", "a", "FP32", [1, 4], b"\x00" * 16)
    request.inputs.add(name="b", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend(
        [0.0] * 4
    )
    err = _rpc_error(stub, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "inputs ['b'] carry typed contents while the request also carries raw" in err.details()


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_as_typed_contents(stub: Stub, datatype: str) -> None:
    request = service_pb2.ModelInferRequest(model_name="half")
    request.inputs.add(name="h", datatype=datatype, shape=[1, 2]).contents.fp32_contents.extend(
        [1.0, 2.0]
    )
    err = _rpc_error(stub, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        f"input 'h' is {datatype}, which cannot travel as typed contents; send it in "
        "raw_input_contents"
    )


def test_contents_in_the_wrong_field(stub: Stub) -> None:
    request = service_pb2.ModelInferRequest(model_name="identity")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 16]).contents.int_contents.extend(
        [1] * 16
    )
    err = _rpc_error(stub, request)
    assert err.details() == (
        "input 'x' is FP32, but its contents are in ['int_contents'] (expected fp32_contents)"
    )


def test_malformed_bytes(stub: Stub) -> None:
    blob = (3).to_bytes(4, "little") + b"ab"
    request = _raw_request("ints_bytes", "s", "BYTES", [1, 2], blob)
    request.inputs.add(name="i", datatype="INT64", shape=[1, 3])
    request.raw_input_contents.append(b"\x00" * 24)
    err = _rpc_error(stub, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        "input 's': BYTES element 0 declares 3 bytes, but only 2 remain in its raw contents"
    )


# -- message size limits -------------------------------------------------------------------------


def test_request_above_the_message_limit(small_server: LocalServer) -> None:
    client = triton.InferenceServerClient(small_server.grpc_url)
    big = np.zeros((SMALL_LIMIT // 64 + 1, 16), np.float32)
    err = _fails(client, "identity", infer_input("x", big))
    assert err.status() == "StatusCode.RESOURCE_EXHAUSTED"
    # gRPC itself refuses it, before any of the server's code runs.
    assert "Received message larger than max" in err.message()
    assert f"vs. {SMALL_LIMIT})" in err.message()
    # The same server still answers requests within the limit.
    assert client.infer("identity", [infer_input("x", X)]).as_numpy("y").shape == (2, 16)


def test_response_above_the_message_limit(small_server: LocalServer) -> None:
    client = triton.InferenceServerClient(small_server.grpc_url)
    rows = SMALL_LIMIT // (4 * 4 * WIDEN) + 1
    err = _fails(client, "widen", infer_input("x", np.zeros((rows, 4), np.float32)))
    assert err.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert err.message().startswith("the response is ")
    assert f"above the server's gRPC message limit of {SMALL_LIMIT} bytes" in err.message()


# -- a backend that fails one batch ----------------------------------------------------------------


def test_backend_failure_fails_only_its_batch(client: triton.InferenceServerClient) -> None:
    bad = np.ones((FRAGILE_ROWS, 4), np.float32)
    err = _fails(client, "fragile", infer_input("x", bad))
    assert err.status() == "StatusCode.INTERNAL"
    assert "onnxruntime failed" in err.message()
    # Two requests that share a batch of FRAGILE_ROWS rows fail together ...
    one, two = np.ones((1, 4), np.float32), np.ones((FRAGILE_ROWS - 1, 4), np.float32)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(client.infer, "fragile", [infer_input("x", part)]) for part in (one, two)
        ]
        for future in futures:
            with pytest.raises(InferenceServerException, match="INTERNAL"):
                future.result()
    # ... and the model, and the server, go on serving other batches.
    good = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_array_equal(
        client.infer("fragile", [infer_input("x", good)]).as_numpy("y"), good
    )
    assert client.infer("identity", [infer_input("x", X)]).as_numpy("y").shape == (2, 16)
