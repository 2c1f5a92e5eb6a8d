"""Property-based fuzzing of both protocols (hypothesis), bounded to a few seconds.

Whatever a client sends, the server answers it with a 4xx or a gRPC client-error code (never a
5xx, INTERNAL or UNKNOWN), does not crash, and answers the next good request correctly. The
inference endpoints are fuzzed first, then every control endpoint (shared memory, repository,
trace, logging) on a server of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import grpc
import httpx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.toolkit.fuzz import JSON_VALUES, bounded
from tests.toolkit.models import write_null_model
from tests.toolkit.server import LocalServer, serving
from tritonclient.grpc import service_pb2

ECHO = (
    'max_batch_size = 8\n[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [2]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [2]\n'
)
TEXT = (
    'max_batch_size = 8\n[[inputs]]\nname = "s"\ndatatype = "BYTES"\nshape = [-1]\n'
    '[[outputs]]\nname = "t"\ndatatype = "BYTES"\nshape = [-1]\n'
)
DATATYPES = ["FP32", "FP16", "BF16", "FP64", "INT8", "INT64", "UINT32", "BOOL", "BYTES", "fp32"]
#: A few hundred examples per protocol and no per-example deadline: seconds, not minutes.
FUZZ = bounded(300)
CLIENT_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.PERMISSION_DENIED,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("fuzz")
    write_null_model(root, "echo", ECHO)
    write_null_model(root, "text", TEXT)
    with serving(root, max_body_bytes=2**20, max_tensor_elements=2**16) as running:
        yield running


@pytest.fixture(scope="module")
def http(server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def channel(server: LocalServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_url) as opened:
        yield opened


# -- strategies --------------------------------------------------------------------------------

_json = JSON_VALUES
_shape = st.lists(
    st.one_of(st.integers(-2, 4), st.sampled_from([2**31, 2**62, 10**20])), max_size=6
) | st.just([1] * 70)
_tensor = st.fixed_dictionaries(
    {"name": st.sampled_from(["x", "s", "z", ""]), "shape": _shape},
    optional={
        "datatype": st.sampled_from(DATATYPES) | st.text(max_size=5),
        "data": _json,
        "parameters": st.dictionaries(
            st.sampled_from(["binary_data_size", "binary_data", "shared_memory_region"]),
            _json,
            max_size=2,
        ),
    },
)
_request = st.fixed_dictionaries(
    {"inputs": st.lists(_tensor, max_size=3) | _json},
    optional={
        "id": _json,
        "parameters": st.dictionaries(
            st.sampled_from(["priority", "timeout", "binary_data_output", "custom"]),
            _json,
            max_size=3,
        ),
        "outputs": st.lists(st.fixed_dictionaries({"name": _json}), max_size=2) | _json,
    },
)


def _good_rest(http: httpx.Client) -> None:
    doc = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.5, -2.0]}]}
    response = http.post("/v2/models/echo/infer", json=doc)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [1.5, -2.0]


@FUZZ
@given(
    doc=_request,
    path=st.sampled_from(
        ["/v2/models/echo/infer", "/v2/models/text/infer", "/v2/repository/index"]
    ),
    tail=st.binary(max_size=64),
    header_length=st.none()
    | st.integers(-5, 400)
    | st.text(alphabet=st.characters(max_codepoint=126, min_codepoint=33), max_size=4),
    encoding=st.none() | st.sampled_from(["gzip", "deflate", "br", "identity"]),
)
def test_rest_answers_any_request_with_a_client_error(
    http: httpx.Client,
    doc: dict[str, Any],
    path: str,
    tail: bytes,
    header_length: int | str | None,
    encoding: str | None,
) -> None:
    body = json.dumps(doc).encode() + tail
    headers = {}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    response = http.post(path, content=body, headers=headers)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.json()["error"]
    _good_rest(http)


@FUZZ
@given(body=st.binary(max_size=256))
def test_rest_answers_any_bytes_with_a_client_error(http: httpx.Client, body: bytes) -> None:
    response = http.post("/v2/models/echo/infer", content=body)
    assert response.status_code < 500, response.text
    _good_rest(http)


# -- gRPC -----------------------------------------------------------------------------------------

_param = st.one_of(
    st.booleans().map(lambda v: ("bool_param", v)),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: ("int64_param", v)),
    st.text(max_size=6).map(lambda v: ("string_param", v)),
    st.floats().map(lambda v: ("double_param", v)),
)
_grpc_tensor = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["x", "s", "z"]),
        "datatype": st.sampled_from(DATATYPES) | st.text(max_size=4),
        "shape": st.lists(
            st.one_of(st.integers(-2, 4), st.sampled_from([2**31, 2**62])), max_size=5
        )
        | st.just([1] * 70),
    },
    optional={
        "raw": st.binary(max_size=48),
        "fp32": st.lists(st.floats(width=32), max_size=6),
        "bytes": st.lists(st.binary(max_size=6), max_size=4),
        "int64": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
    },
)


def _grpc_message(model: str, tensors: list[dict[str, Any]], params: dict[str, Any]) -> Any:
    message = service_pb2.ModelInferRequest(model_name=model)
    for key, (field, value) in params.items():
        setattr(message.parameters[key], field, value)
    for t in tensors:
        entry = message.inputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        entry.contents.fp32_contents.extend(t.get("fp32", []))
        entry.contents.bytes_contents.extend(t.get("bytes", []))
        entry.contents.int64_contents.extend(t.get("int64", []))
        if "raw" in t:
            message.raw_input_contents.append(t["raw"])
    return message


def _good_grpc(channel: grpc.Channel) -> None:
    call = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=service_pb2.ModelInferRequest.SerializeToString,
        response_deserializer=service_pb2.ModelInferResponse.FromString,
    )
    x = np.array([[1.5, -2.0]], np.float32)
    message = service_pb2.ModelInferRequest(model_name="echo")
    message.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    message.raw_input_contents.append(x.tobytes())
    answer = call(message, timeout=30)
    assert np.frombuffer(answer.raw_output_contents[0], np.float32).tolist() == [1.5, -2.0]


@FUZZ
@given(
    model=st.sampled_from(["echo", "text", "ghost"]),
    tensors=st.lists(_grpc_tensor, max_size=3),
    params=st.dictionaries(st.sampled_from(["priority", "timeout", "binary_data_output"]), _param),
)
def test_grpc_answers_any_request_with_a_client_error(
    channel: grpc.Channel, model: str, tensors: list[dict[str, Any]], params: dict[str, Any]
) -> None:
    call = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=service_pb2.ModelInferRequest.SerializeToString,
        response_deserializer=service_pb2.ModelInferResponse.FromString,
    )
    try:
        call(_grpc_message(model, tensors, params), timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() in CLIENT_CODES, (exc.code(), exc.details())
    _good_grpc(channel)


@FUZZ
@given(
    method=st.sampled_from(
        ["ModelInfer", "ModelMetadata", "RepositoryIndex", "ModelConfig",
         "SystemSharedMemoryRegister", "CudaSharedMemoryRegister", "RepositoryModelLoad",
         "RepositoryModelUnload", "TraceSetting", "LogSettings", "SystemSharedMemoryStatus"]
    ),
    body=st.binary(max_size=128),
)  # fmt: skip
def test_grpc_answers_any_bytes_with_a_client_error(
    server: LocalServer, channel: grpc.Channel, method: str, body: bytes
) -> None:
    call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
    try:
        call(body, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() in CLIENT_CODES, (exc.code(), exc.details())
    _restore(server)
    _good_grpc(channel)


def test_the_fuzzed_server_still_reports_itself_ready(server: LocalServer) -> None:
    assert httpx.get(f"http://{server.http_url}/v2/health/ready").status_code == 200


# -- control endpoints ----------------------------------------------------------------------------

CONTROL = bounded(200)
#: Models the control fuzz may load and unload; `echo` answers the good request in between.
_control_model = st.sampled_from(["text", "ghost", "echo/../text", ""]) | st.text(max_size=6)
_load_parameters = st.dictionaries(
    st.sampled_from(["config", "file:1/model.onnx", "file:1/../../x", "file:1/a\0b", "file:0/m"])
    | st.text(max_size=8),
    _json | st.sampled_from(["{}", '{"backend": "null"}', '{"max_batch_size": 2147483647}']),
    max_size=3,
)
_trace_names = ["trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file"]
_log_names = ["log_info", "log_warning", "log_error", "log_verbose_level", "log_format", "log_file"]
_setting_names = st.sampled_from(_trace_names + _log_names) | st.text(max_size=6)


@pytest.fixture(scope="module")
def control_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("control_fuzz")
    write_null_model(root, "echo", ECHO)
    write_null_model(root, "text", TEXT)
    with serving(root, max_body_bytes=2**20, allow_client_shm=True) as running:
        yield running


@pytest.fixture(scope="module")
def control_http(control_server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{control_server.http_url}", timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def control_channel(control_server: LocalServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(control_server.grpc_url) as opened:
        yield opened


#: Every control route; {m} is a model's name, {r} a region's.
_CONTROL_ROUTES = [
    "/v2/systemsharedmemory/region/{r}/register", "/v2/systemsharedmemory/region/{r}/unregister",
    "/v2/cudasharedmemory/region/{r}/register", "/v2/cudasharedmemory/region/{r}/unregister",
    "/v2/systemsharedmemory/status", "/v2/repository/index", "/v2/repository/models/{m}/load",
    "/v2/repository/models/{m}/unload", "/v2/trace/setting", "/v2/models/{m}/trace/setting",
    "/v2/logging",
]  # fmt: skip


def _restore(server: LocalServer) -> None:
    """Settings a fuzzed request may change, back to where the next example expects them."""
    server.dataplane.logs.update({"log_verbose_level": 0, "log_error": True})
    server.dataplane.tracer.update({"trace_level": "OFF"})


#: Values a control setting may be sent, edge cases first: wrong shapes, huge numbers.
_edges = st.sampled_from(
    [["default"], {"a": 1}, 10**200, 2**64, 2**32, -1, "\ud800", [], [None], "1", True]
)
_edge = st.one_of(_edges, _edges, _json)  # edge cases two times in three


@CONTROL
@given(
    model=_control_model,
    region=st.sampled_from(["r", "x" * 80]) | st.text(max_size=4),
    path=st.sampled_from([8, 9, 10, 10]) | st.integers(0, 10),  # settings more often
    doc=_json | st.fixed_dictionaries({"parameters": _load_parameters}),
    data=st.data(),
    get=st.booleans(),
)
def test_rest_control_endpoints_answer_anything_with_a_client_error(
    control_server: LocalServer,
    control_http: httpx.Client,
    model: str,
    region: str,
    path: int,
    doc: Any,
    data: st.DataObject,
    get: bool,
) -> None:
    route = _CONTROL_ROUTES[path].format(m=quote(model, safe=""), r=quote(region, safe=""))
    body = doc
    if "setting" in route or "logging" in route:  # names the endpoint knows, mostly
        names = _log_names if "logging" in route else _trace_names
        key = st.sampled_from(names) | _setting_names
        body = data.draw(st.dictionaries(key, _edge, min_size=1, max_size=2))
    method = "GET" if get and "load" not in route else "POST"
    response = control_http.request(method, route, content=json.dumps(body).encode())
    unloaded = response.status_code == 503 and "is not ready" in response.text  # fuzz unloaded it
    assert response.status_code < 500 or unloaded, (route, body, response.text)
    _restore(control_server)
    _good_rest(control_http)


@CONTROL
@given(
    kind=st.sampled_from(["system", "cuda"]),
    key=st.binary(max_size=12),
    fields=st.dictionaries(
        st.sampled_from(["offset", "byte_size", "device_id", "raw_handle"]), _edge, max_size=3
    ),
    tail=st.binary(max_size=8),
)
def test_rest_control_shared_memory_answers_any_key_with_a_client_error(
    control_http: httpx.Client, kind: str, key: bytes, fields: dict[str, Any], tail: bytes
) -> None:
    # The key goes in as raw bytes: not always UTF-8, not always a valid JSON string.
    rest = json.dumps(fields).encode()[1:]
    body = b'{"key": "' + key + b'"' + (b", " + rest if fields else b"}") + tail
    response = control_http.post(f"/v2/{kind}sharedmemory/region/r/register", content=body)
    assert response.status_code < 500, (body, response.text)
    control_http.post(f"/v2/{kind}sharedmemory/region/r/unregister")
    _good_rest(control_http)


_log_value = st.one_of(
    st.booleans().map(lambda v: ("bool_param", v)),
    st.integers(0, 2**32 - 1).map(lambda v: ("uint32_param", v)),
    st.text(max_size=6).map(lambda v: ("string_param", v)),
)


def _grpc_control(draw: st.DrawFn) -> tuple[str, Any, Any]:
    """A control method, its request message and its response type."""
    pb = service_pb2
    method = draw(
        st.sampled_from(
            ["SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
             "SystemSharedMemoryStatus", "CudaSharedMemoryRegister", "RepositoryIndex",
             "RepositoryModelLoad", "RepositoryModelUnload", "TraceSetting", "LogSettings"]
        )
    )  # fmt: skip
    model = draw(_control_model)
    name = draw(st.sampled_from(["r", ""]) | st.text(max_size=4))
    size = draw(st.integers(0, 2**64 - 1))
    if method == "SystemSharedMemoryRegister":
        key, offset = draw(st.text(max_size=10)), draw(st.integers(0, 2**64 - 1))
        message: Any = pb.SystemSharedMemoryRegisterRequest(
            name=name, key=key, offset=offset, byte_size=size
        )
    elif method == "CudaSharedMemoryRegister":
        handle, device = draw(st.binary(max_size=64)), draw(st.integers(-(2**63), 2**63 - 1))
        message = pb.CudaSharedMemoryRegisterRequest(
            name=name, raw_handle=handle, device_id=device, byte_size=size
        )
    elif method in ("SystemSharedMemoryUnregister", "SystemSharedMemoryStatus"):
        message = getattr(pb, method + "Request")(name=name)
    elif method == "RepositoryIndex":
        message = pb.RepositoryIndexRequest(ready=draw(st.booleans()))
    elif method in ("RepositoryModelLoad", "RepositoryModelUnload"):
        message = getattr(pb, method + "Request")(model_name=model)
        for key, value in draw(_load_parameters).items():
            text = json.dumps(value)
            field = "bytes_param" if key.startswith("file:") else "string_param"
            setattr(message.parameters[key], field, text.encode() if "bytes" in field else text)
    elif method == "TraceSetting":
        message = pb.TraceSettingRequest(model_name=draw(st.sampled_from(["", "echo", "ghost"])))
        values = st.lists(st.text(max_size=6), max_size=2)
        for key, given in draw(st.dictionaries(_setting_names, values, max_size=3)).items():
            message.settings[key].value.extend(given)
    else:
        message = pb.LogSettingsRequest()
        for key, (field, value) in draw(st.dictionaries(_setting_names, _log_value)).items():
            setattr(message.settings[key], field, value)
    answer = getattr(pb, method.replace("Request", "") + "Response")
    return method, message, answer


@CONTROL
@given(data=st.data())
def test_grpc_control_endpoints_answer_anything_with_a_client_error(
    control_server: LocalServer, control_channel: grpc.Channel, data: st.DataObject
) -> None:
    method, message, answer = data.draw(st.composite(lambda draw: _grpc_control(draw))())
    call = control_channel.unary_unary(
        f"/inference.GRPCInferenceService/{method}",
        request_serializer=type(message).SerializeToString,
        response_deserializer=answer.FromString,
    )
    try:
        call(message, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() in CLIENT_CODES, (method, exc.code(), exc.details())
    _restore(control_server)
    _good_grpc(control_channel)
