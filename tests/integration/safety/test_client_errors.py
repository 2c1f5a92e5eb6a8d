"""The same client mistake gets the same answer over REST and gRPC: 400 / INVALID_ARGUMENT.

Each case below answered 500 or INTERNAL (or UNKNOWN), or was accepted by one protocol and
refused by the other, before; every message is the same text on both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from tests.toolkit.models import write_null_model
from tests.toolkit.server import LocalServer, serving
from tritonclient.grpc import service_pb2, service_pb2_grpc

ECHO = (
    'max_batch_size = 4\n[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [2]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [2]\n'
)
TEXT = (
    'max_batch_size = 4\n[[inputs]]\nname = "x"\ndatatype = "BYTES"\nshape = [1]\n'
    '[[outputs]]\nname = "y"\ndatatype = "BYTES"\nshape = [1]\n'
)
INFER = "/v2/models/echo/infer"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("client_errors")
    write_null_model(root, "echo", ECHO)
    write_null_model(root, "text", TEXT)
    # Over its rate limit after one request: refused before what it was sent is read.
    write_null_model(root, "limited", ECHO + "[qos]\nrate_limit = 0.01\nrate_burst = 1\n")
    # A model whose file is not ONNX: the runtime's error names the file by its full path.
    (root / "garbled" / "1").mkdir(parents=True)
    (root / "garbled" / "1" / "model.onnx").write_bytes(b"not onnx")
    (root / "garbled" / "config.toml").write_text("max_batch_size = 1\n")
    with serving(root) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: LocalServer) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _rest(server: LocalServer, doc: dict[str, Any], model: str = "echo") -> tuple[int, str]:
    response = httpx.post(f"http://{server.http_url}/v2/models/{model}/infer", json=doc)
    return response.status_code, str(response.json().get("error", ""))


def _grpc(stub: Any, request: Any) -> tuple[grpc.StatusCode, str]:
    try:
        stub.ModelInfer(request)
    except grpc.RpcError as exc:
        return exc.code(), str(exc.details())
    return grpc.StatusCode.OK, ""


def _doc(shape: list[int], data: Any, **params: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "inputs": [{"name": "x", "shape": shape, "datatype": "FP32", "data": data}]
    }
    if params:
        doc["parameters"] = params
    return doc


def _message(shape: list[int], raw: bytes, model: str = "echo", **params: Any) -> Any:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP32", shape=shape)
    request.raw_input_contents.append(raw)
    for key, value in params.items():
        slot = request.parameters[key]
        if isinstance(value, str):
            slot.string_param = value
        elif isinstance(value, float):
            slot.double_param = value
        else:
            slot.int64_param = value
    return request


ONE_ROW = b"\x00" * 8


@pytest.mark.parametrize(
    "params",
    [
        {"priority": "high"},
        {"priority": float("inf")},
        {"timeout": -5},
        {"timeout": "soon"},
        {"timeout": float("inf")},
        {"priority": 1.5},
    ],
    ids=[
        "string-priority",
        "inf-priority",
        "negative-timeout",
        "string-timeout",
        "inf-timeout",
        "fractional-priority",
    ],
)
def test_schedule_parameters_are_refused_alike(
    server: LocalServer, stub: Any, params: dict[str, Any]
) -> None:
    # JSON cannot carry infinity: its REST twin is the largest double, refused the same way.
    rest_params = {k: 1e308 if v == float("inf") else v for k, v in params.items()}
    status, rest_error = _rest(server, _doc([1, 2], [0.0, 0.0], **rest_params))
    code, grpc_error = _grpc(stub, _message([1, 2], ONE_ROW, **params))
    assert status == 400 and code == grpc.StatusCode.INVALID_ARGUMENT
    key = next(iter(params))
    assert f"parameter {key!r} must be a non-negative integer" in rest_error
    assert f"parameter {key!r} must be a non-negative integer" in grpc_error


@pytest.mark.parametrize(
    "shape",
    [[1] * 65, [10**12], [0, 2**62], [5 * 10**7, 1]],
    ids=["65-dims", "huge", "zero-hides-huge", "more-than-carried"],
)
def test_impossible_shapes_are_refused_alike(
    server: LocalServer, stub: Any, shape: list[int]
) -> None:
    status, rest_error = _rest(server, _doc(shape, [0.0, 0.0]))
    code, grpc_error = _grpc(stub, _message(shape, ONE_ROW))
    assert status == 400 and code == grpc.StatusCode.INVALID_ARGUMENT, (rest_error, grpc_error)
    assert rest_error and grpc_error


def test_bytes_declaring_more_than_they_carry(server: LocalServer, stub: Any) -> None:
    element = (1).to_bytes(4, "little") + b"a"
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [10**7, 1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(element)},
                }
            ]
        }
    ).encode()
    response = httpx.post(
        f"http://{server.http_url}/v2/models/text/infer",
        content=head + element,
        headers={"Inference-Header-Content-Length": str(len(head))},
    )
    assert response.status_code == 400 and "10000000 elements" in response.json()["error"]
    request = service_pb2.ModelInferRequest(model_name="text")
    request.inputs.add(name="x", datatype="BYTES", shape=[10**7, 1])
    request.raw_input_contents.append(element)
    code, error = _grpc(stub, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "10000000 elements" in error


def test_json_the_decoder_cannot_read_is_a_400(server: LocalServer) -> None:
    url = f"http://{server.http_url}{INFER}"
    bad_utf8 = (
        b'{"inputs": [{"name": "x\xff", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}'
    )
    deep = b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": ' + (
        b"[" * 5000 + b"]" * 5000 + b"}]}"
    )
    # msgspec words the first as its release does ("invalid UTF-8", "Invalid UTF-8 encoded")
    for body, fragment in ((bad_utf8, "invalid utf-8"), (deep, "nested")):
        response = httpx.post(url, content=body)
        assert response.status_code == 400 and fragment in response.json()["error"].lower()
    index = httpx.post(f"http://{server.http_url}/v2/repository/index", content=b"[" * 5000)
    assert index.status_code == 400 and "nested" in index.json()["error"]


def test_fp32_out_of_range_is_refused(server: LocalServer) -> None:
    status, error = _rest(server, _doc([1, 2], [1e39, 0.0]))
    assert status == 400 and "beyond the range of FP32" in error


def test_undecodable_protobuf_is_invalid_argument(server: LocalServer) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        for method in ("ModelInfer", "RepositoryIndex", "ServerLive"):
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
            with pytest.raises(grpc.RpcError) as caught:
                call(b"\xff\xff\xff\xff")
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"the {method} request is not a valid protobuf" in caught.value.details()
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        with pytest.raises(grpc.RpcError) as caught:
            list(stream(iter([b"\xff\xff\xff\xff"])))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_errors_never_show_the_hosts_absolute_paths(server: LocalServer, stub: Any) -> None:
    root = str(server.server.settings.repository)
    response = httpx.post(f"http://{server.http_url}/v2/repository/models/garbled/load")
    assert response.status_code == 400, response.text
    assert root not in response.text and "garbled" in response.text
    index = httpx.post(f"http://{server.http_url}/v2/repository/index").text
    assert root not in index
    ghost = httpx.post(f"http://{server.http_url}/v2/repository/models/ghost/load").text
    assert root not in ghost and "ghost" in ghost
    try:
        stub.RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(model_name="garbled"))
    except grpc.RpcError as exc:
        assert root not in str(exc.details()) and "garbled" in str(exc.details())
    else:
        raise AssertionError("a model that is not ONNX loaded")


def test_a_model_over_its_limits_refuses_before_reading_the_tensors(
    server: LocalServer, stub: Any
) -> None:
    # The rate limit's burst of one goes to the first request; each protocol then gets 429 /
    # RESOURCE_EXHAUSTED for tensors it would refuse as malformed had it read them.
    assert _rest(server, _doc([1, 2], [1.0, 2.0]), "limited")[0] in (200, 429)
    status, message = _rest(server, _doc([1, 2], [1.0]), "limited")
    assert status == 429 and "rate limit" in message
    code, message = _grpc(stub, _message([1, 2], b"\x00" * 4, "limited"))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "rate limit" in message
    assert _rest(server, _doc([1, 2], [1.0]))[0] == 400  # not refused: read, and found wrong
