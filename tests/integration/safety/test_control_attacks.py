"""Issue 28: no client can read, change or crash what is not its own, through model control.

Each test performs an attack on a real server (REST and gRPC on 127.0.0.1) and asserts the safe
outcome: a 4xx or a client-error gRPC code that says what was wrong, nothing read or written
outside the model's folder, and a server that keeps serving.
"""

from __future__ import annotations

import base64
import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from tests.toolkit.models import write_null_model
from tests.toolkit.pipelines import pipeline_toml, step, write_pipeline
from tests.toolkit.repositories import triton_repository
from tests.toolkit.server import LocalServer, serving
from tritonclient.grpc import service_pb2

from dlscale.frontends.access import Restriction
from dlscale.serving.observe.trace import MAX_TRACE_FILES
from dlscale.serving.pipeline import MAX_NESTING
from dlscale.wire.classification import MAX_LABEL_BYTES

LOAD = "/v2/repository/models/classifier/load"
ADMIN = Restriction.parse("model-repository:admin-key=s3cret")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return triton_repository(tmp_path_factory.mktemp("control"))


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[LocalServer]:
    with serving(root, allow_client_shm=True) as running:
        yield running


@pytest.fixture(scope="module")
def http(server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def channel(server: LocalServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_url) as opened:
        yield opened


@pytest.fixture(scope="module")
def classifier_config(http: httpx.Client) -> dict[str, Any]:
    config: dict[str, Any] = http.get("/v2/models/classifier/config").json()
    return config


def _expect(response: httpx.Response, status: int, *fragments: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    for fragment in fragments:
        assert fragment in error, error


def _still_serving(http: httpx.Client) -> None:
    assert http.get("/v2/health/live").status_code == 200
    row = [0.0] * 16
    doc = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": row}]}
    name = http.get("/v2/models/classifier").json()["inputs"][0]["name"]
    doc["inputs"][0]["name"] = name
    assert http.post("/v2/models/classifier/infer", json=doc).status_code == 200


def _with_labels(config: dict[str, Any], label_file: str) -> str:
    changed = copy.deepcopy(config)
    changed["output"][0]["label_filename"] = label_file
    return json.dumps(changed)


def _load(http: httpx.Client, config: str, **files: bytes) -> httpx.Response:
    params: dict[str, str] = {"config": config}
    params |= {k: base64.b64encode(v).decode() for k, v in files.items()}
    return http.post(LOAD, json={"parameters": params})


# -- 1: label files stay inside the model's folder, regular and bounded ----------------------------


@pytest.mark.parametrize(
    "label_file",
    ["/etc/passwd", "/proc/self/environ", "../../../../../../etc/passwd", "1/../../../x", "a\0b"],
)
def test_a_label_file_outside_the_model_folder_is_refused(
    http: httpx.Client, classifier_config: dict[str, Any], label_file: str
) -> None:
    _expect(_load(http, _with_labels(classifier_config, label_file)), 400, "inside the model's")
    _still_serving(http)


def test_a_label_file_linking_outside_the_folder_is_not_read(
    http: httpx.Client, root: Path, classifier_config: dict[str, Any]
) -> None:
    (root / "classifier" / "passwd").symlink_to("/etc/passwd")
    try:
        response = _load(http, _with_labels(classifier_config, "passwd"))
    finally:
        (root / "classifier" / "passwd").unlink()
    _expect(response, 400, "label_file cannot be read", "inside the model's folder")
    assert "root" not in response.text
    _still_serving(http)


def test_a_fifo_as_label_file_neither_hangs_nor_is_read(
    http: httpx.Client, root: Path, classifier_config: dict[str, Any]
) -> None:
    os.mkfifo(root / "classifier" / "fifo")
    try:  # without the rule the load waits for a writer: the client's timeout fails the test
        response = _load(http, _with_labels(classifier_config, "fifo"))
    finally:
        (root / "classifier" / "fifo").unlink()
    _expect(response, 400, "not a regular file")
    _still_serving(http)


def test_a_huge_label_file_is_refused(
    http: httpx.Client, root: Path, classifier_config: dict[str, Any]
) -> None:
    huge = root / "classifier" / "huge.txt"
    with huge.open("wb") as file:
        file.truncate(MAX_LABEL_BYTES + 1)  # sparse: no disk taken
    try:
        response = _load(http, _with_labels(classifier_config, "huge.txt"))
    finally:
        huge.unlink()
    _expect(response, 400, "larger than the limit")
    _still_serving(http)


# -- 5: what a load's config may ask of the host ---------------------------------------------------


def test_a_load_config_is_bounded_by_the_host(
    http: httpx.Client, channel: grpc.Channel, classifier_config: dict[str, Any]
) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"max_batch_size": 2**31 - 1}, "max_batch_size 2147483647 is above the limit"),
        ({"instance_group": [{"count": 100_000, "kind": "KIND_CPU"}]}, "model instances"),
        ({"parameters": {"intra_op_thread_count": {"string_value": "100000"}}}, "intra_op_threads"),
    ]
    call = channel.unary_unary(
        "/inference.GRPCInferenceService/RepositoryModelLoad",
        request_serializer=service_pb2.RepositoryModelLoadRequest.SerializeToString,
        response_deserializer=service_pb2.RepositoryModelLoadResponse.FromString,
    )
    for change, fragment in cases:
        config = json.dumps({**classifier_config, **change})
        _expect(http.post(LOAD, json={"parameters": {"config": config}}), 400, fragment)
        message = service_pb2.RepositoryModelLoadRequest(model_name="classifier")
        message.parameters["config"].string_param = config
        with pytest.raises(grpc.RpcError) as caught:
            call(message, timeout=60)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert fragment in str(caught.value.details())
    _still_serving(http)


def test_a_warm_up_larger_than_memory_is_a_client_error(
    http: httpx.Client, classifier_config: dict[str, Any]
) -> None:
    changed = copy.deepcopy(classifier_config)
    changed["max_batch_size"] = 2**16
    changed["input"][0]["dims"] = [2**20, 2**20]
    _expect(_load(http, json.dumps(changed)), 400, "warm-up batch")
    _still_serving(http)


# -- 10 and 11: load files named to escape, clash or break the file system ------------------------

UPLOAD = json.dumps(
    {
        "backend": "onnxruntime",
        "max_batch_size": 2,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
    }
)


@pytest.mark.parametrize(
    ("files", "fragment"),
    [
        ({"file:1/../../escaped": b"x"}, "inside the model's folder"),
        ({"file:1/sub/../../../escaped": b"x"}, "inside the model's folder"),
        ({"file:1/a\0b": b"x"}, "control characters"),
        ({"file:1/a.bin": b"x", "file:1/a.bin/b.bin": b"y"}, "both as files and as folders"),
        ({"file:1/" + "n" * 300 + ".bin": b"x"}, "cannot be written"),
    ],
)
def test_load_files_stay_in_their_folder(
    http: httpx.Client, server: LocalServer, files: dict[str, bytes], fragment: str
) -> None:
    params = {"config": UPLOAD} | {k: base64.b64encode(v).decode() for k, v in files.items()}
    response = http.post("/v2/repository/models/upload/load", json={"parameters": params})
    _expect(response, 400, fragment)
    uploads = server.dataplane.uploads
    if uploads._root is not None:  # nothing was written beside the uploads' own folder
        assert not list(uploads._root.parent.glob("escaped"))
        assert not list(uploads._root.glob("escaped"))
    _still_serving(http)


# -- 11: raw tensor contents must hold exactly what the shape needs ------------------------------


def test_raw_contents_longer_than_the_shape_are_refused(
    http: httpx.Client, channel: grpc.Channel
) -> None:
    call = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=service_pb2.ModelInferRequest.SerializeToString,
        response_deserializer=service_pb2.ModelInferResponse.FromString,
    )
    message = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="FP32", shape=[1, 4])
        message.raw_input_contents.append(np.zeros(5, np.float32).tobytes())  # 4 bytes too many
    with pytest.raises(grpc.RpcError) as caught:
        call(message, timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "raw contents hold 20 bytes" in str(caught.value.details())

    body = np.zeros(5, np.float32).tobytes()
    header = {
        "inputs": [
            {"name": n, "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 20}}
            for n in ("INPUT0", "INPUT1")
        ]
    }
    head = json.dumps(header).encode()
    response = http.post(
        "/v2/models/simple/infer",
        content=head + body + body,
        headers={"Inference-Header-Content-Length": str(len(head))},
    )
    _expect(response, 400, "takes 16 bytes, but 20 were sent")


# -- 8 and 10: trace and logging settings ----------------------------------------------------------


def test_log_and_trace_settings_refuse_what_they_cannot_hold(
    http: httpx.Client, server: LocalServer
) -> None:
    for change, fragment in [
        ({"log_format": ["default"]}, "'log_format' must be one of"),
        ({"log_format": {"a": 1}}, "'log_format' must be one of"),
        ({"log_verbose_level": 10**200}, "'log_verbose_level' must be an integer"),
        ({"log_verbose_level": 2**32}, "'log_verbose_level' must be an integer"),
    ]:
        _expect(http.post("/v2/logging", json=change), 400, fragment)
    for change, fragment in [
        ({"trace_rate": str(10**200)}, "'trace_rate' must be an integer"),
        ({"trace_count": 10**30}, "'trace_count' must be an integer"),
        ({"log_frequency": [str(2**40)]}, "'log_frequency' must be an integer"),
    ]:
        _expect(http.post("/v2/trace/setting", json=change), 400, fragment)
    assert server.dataplane.logs.settings()["log_error"] is True
    _still_serving(http)


def test_a_shared_memory_key_that_is_not_text_is_a_client_error(
    http: httpx.Client, channel: grpc.Channel
) -> None:
    body = b'{"key": "/dlscale-\\ud800", "offset": 0, "byte_size": 64}'
    response = http.post("/v2/systemsharedmemory/region/r/register", content=body)
    assert 400 <= response.status_code < 500, response.text
    raw = b'{"key": "/dlscale-\xff\xfe", "offset": 0, "byte_size": 64}'
    response = http.post("/v2/systemsharedmemory/region/r/register", content=raw)
    assert 400 <= response.status_code < 500, response.text
    call = channel.unary_unary("/inference.GRPCInferenceService/SystemSharedMemoryRegister")
    # name "r", then key (field 2) holding bytes that are not UTF-8
    with pytest.raises(grpc.RpcError) as caught:
        call(b"\x0a\x01r\x12\x03/\xff\xfe\x20\x40", timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    _still_serving(http)


def test_trace_and_logging_are_restricted_once_a_key_is_kept(root: Path) -> None:
    with (
        serving(root, http_restricted=(ADMIN,), grpc_restricted=(ADMIN,)) as running,
        httpx.Client(base_url=f"http://{running.http_url}", timeout=60) as client,
        grpc.insecure_channel(running.grpc_url) as opened,
    ):
        off = {"log_error": False}
        _expect(client.post("/v2/logging", json=off), 403, "'admin-key'")
        _expect(client.post("/v2/trace/setting", json={"trace_rate": "1"}), 403, "'admin-key'")
        assert running.dataplane.logs.settings()["log_error"] is True
        logs = opened.unary_unary(
            "/inference.GRPCInferenceService/LogSettings",
            request_serializer=service_pb2.LogSettingsRequest.SerializeToString,
            response_deserializer=service_pb2.LogSettingsResponse.FromString,
        )
        message = service_pb2.LogSettingsRequest()
        message.settings["log_error"].bool_param = False
        with pytest.raises(grpc.RpcError) as caught:
            logs(message, timeout=60)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        keyed = client.post("/v2/logging", json={"log_info": True}, headers={"admin-key": "s3cret"})
        assert keyed.status_code == 200, keyed.text
        assert client.post("/v2/models/simple/infer", json={}).status_code == 400  # still open


# -- issue 33: what a load request may name and nest ----------------------------------------------


def _grpc_load(channel: grpc.Channel, name: str, parameters: dict[str, str]) -> grpc.RpcError:
    call = channel.unary_unary(
        "/inference.GRPCInferenceService/RepositoryModelLoad",
        request_serializer=service_pb2.RepositoryModelLoadRequest.SerializeToString,
        response_deserializer=service_pb2.RepositoryModelLoadResponse.FromString,
    )
    message = service_pb2.RepositoryModelLoadRequest(model_name=name)
    for key, value in parameters.items():
        message.parameters[key].string_param = value
    with pytest.raises(grpc.RpcError) as caught:
        call(message, timeout=60)
    return caught.value


def test_a_load_request_out_of_bounds_is_a_client_error_naming_it(
    http: httpx.Client, channel: grpc.Channel, classifier_config: dict[str, Any]
) -> None:
    long = "m" * 300
    threads = {"intra_op_thread_count": {"string_value": "9" * 5000}}
    deep = '{"name": "classifier", "parameters": ' + "[" * 2000 + "]" * 2000 + "}"
    cases: list[tuple[str, dict[str, str], str]] = [
        (long, {}, "has 300 characters: the limit is 255"),
        (long, {"config": json.dumps({**classifier_config, "name": long})}, "the limit is 255"),
        (
            "classifier",
            {"config": json.dumps({**classifier_config, "parameters": threads})},
            "'intra_op_thread_count' must be a decimal count of at most 9 ASCII digits",
        ),
        ("classifier", {"config": deep}, "not a valid Triton model configuration"),
    ]
    for name, parameters, fragment in cases:
        load = f"/v2/repository/models/{name}/load"
        _expect(http.post(load, json={"parameters": parameters}), 400, fragment)
        refused = _grpc_load(channel, name, parameters)
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused
        assert fragment in str(refused.details())
    # A file parameter's base64 with characters beyond ASCII (REST carries files as base64).
    bad = {"config": json.dumps(classifier_config), "file:1/model.onnx": "ÿÿÿÿ"}
    _expect(http.post(LOAD, json={"parameters": bad}), 400, "is not valid base64")
    _still_serving(http)


def test_pipelines_nested_beyond_the_limit_are_refused_at_load(tmp_path: Path) -> None:
    # A chain of pipelines deep_0 -> deep_1 -> ... -> leaf: 400 deep answered every request
    # 500 (RecursionError). Each deep_i is 20 - i pipelines deep.
    write_null_model(tmp_path, "leaf", pipeline_toml(0, ["x"], ["y"], []))
    for i in range(20):
        model = f"deep_{i + 1}" if i < 19 else "leaf"
        config = pipeline_toml(0, ["x"], ["y"], [step(model, {"x": "x"}, {"y": "y"})])
        write_pipeline(tmp_path, f"deep_{i}", config)
    limit = f"deeper than the limit of {MAX_NESTING}"
    with (
        serving(tmp_path) as running,
        httpx.Client(base_url=f"http://{running.http_url}", timeout=60) as client,
    ):
        index = {m["name"]: m for m in client.post("/v2/repository/index").json()}
        too_deep = [f"deep_{i}" for i in range(20 - MAX_NESTING)]
        for name in too_deep:
            assert index[name]["state"] == "UNAVAILABLE"
            assert limit in index[name]["reason"]
        _expect(client.post("/v2/repository/models/deep_0/load"), 400, "deep_0", limit, " -> ")
        deepest = f"deep_{20 - MAX_NESTING}"  # exactly at the limit: loaded and answering
        assert index[deepest]["state"] == "READY"
        doc = {"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "data": [1.0] * 4}]}
        assert client.post(f"/v2/models/{deepest}/infer", json=doc).status_code == 200


def test_a_trace_file_per_request_stays_within_a_bounded_number_of_files(
    root: Path, tmp_path: Path
) -> None:
    # Issue 33: `log_frequency 1` from any client wrote one more file for each request.
    trace_file = tmp_path / "trace.json"
    with (
        serving(root, trace_file=trace_file) as running,
        httpx.Client(base_url=f"http://{running.http_url}", timeout=60) as client,
    ):
        every = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "1"}
        assert client.post("/v2/trace/setting", json=every).status_code == 200
        for _ in range(MAX_TRACE_FILES + 16):
            _still_serving(client)
        running.dataplane.tracer.wait()
        written = sorted(tmp_path.glob("trace.json.*"))
        assert 0 < len(written) <= MAX_TRACE_FILES
        assert all(json.loads(path.read_text()) for path in written)
