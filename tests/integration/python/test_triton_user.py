"""A Triton user's day, with tritonclient over HTTP and gRPC: a repository written as Triton's
docs write one, Triton's config schema, classification, loading with overrides, statistics,
the trace and logging extensions, and a log line per failed request."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tests.toolkit.models import add_graph, onnx_model
from tests.toolkit.repositories import CLASSES, CLASSIFIER, triton_repository
from tests.toolkit.server import LocalServer, serving
from tritonclient.utils import InferenceServerException

X = np.random.default_rng(5).standard_normal((3, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = triton_repository(tmp_path_factory.mktemp("triton_repo"))
    trace_file = tmp_path_factory.mktemp("traces") / "trace.json"
    with serving(root, trace_file=trace_file) as running:
        yield running


def _expected_classes(k: int) -> list[list[bytes]]:
    scores = CLASSIFIER.reference(X)
    rows = []
    for row in scores:
        top = sorted(range(len(row)), key=lambda i: -row[i])[:k]
        rows.append([f"{row[i]:f}:{i}:{CLASSES[i]}".encode() for i in top])
    return rows


def test_the_repository_loads_as_triton_would(
    http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert {n: m["state"] for n, m in index.items()} == dict.fromkeys(
        ("bare", "classifier", "settings", "simple"), "READY"
    )
    metadata = http.get_model_metadata("simple")
    assert metadata["platform"] == "onnxruntime_onnx"
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT0", "INPUT1"]
    a, b = np.arange(8, dtype=np.float32).reshape(2, 4), np.ones((2, 4), np.float32)
    inputs = [tg.InferInput("INPUT0", [2, 4], "FP32"), tg.InferInput("INPUT1", [2, 4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = grpc.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    # Auto-complete (no config) and MLServer's layout (model-settings.json beside the file).
    assert http.get_model_config("bare")["max_batch_size"] == 4
    assert http.get_model_config("settings")["max_batch_size"] == 8


def test_config_is_tritons_schema_over_both_protocols(
    http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    over_http = http.get_model_config("classifier")
    over_grpc = grpc.get_model_config("classifier", as_json=True)["config"]
    for config in (over_http, over_grpc):
        assert config["platform"] == "onnxruntime_onnx"
        assert config["input"][0]["name"] == "x" and config["input"][0]["data_type"] == "TYPE_FP32"
        assert [int(d) for d in config["input"][0]["dims"]] == [16]
        assert config["output"][0]["label_filename"] == "labels.txt"
        assert [int(s) for s in config["dynamic_batching"]["preferred_batch_size"]] == [4, 8]
        assert config["instance_group"][0]["kind"] == "KIND_CPU"
        assert config["parameters"] == {"intra_op_thread_count": {"string_value": "1"}}
        assert int(config["version_policy"]["latest"]["num_versions"]) == 1


def test_classification_over_http_and_grpc(
    http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    x_http = th.InferInput("x", list(X.shape), "FP32")
    x_http.set_data_from_numpy(X)
    asked = th.InferRequestedOutput("y", class_count=3)
    over_http = http.infer("classifier", [x_http], outputs=[asked]).as_numpy("y")
    x_grpc = tg.InferInput("x", list(X.shape), "FP32")
    x_grpc.set_data_from_numpy(X)
    over_grpc = grpc.infer(
        "classifier", [x_grpc], outputs=[tg.InferRequestedOutput("y", class_count=3)]
    ).as_numpy("y")
    for got in (over_http, over_grpc):
        assert got.shape == (3, 3)
        assert got.tolist() == _expected_classes(3)
    # JSON outputs too; and more classes than the output has gives all of them.
    many = th.InferRequestedOutput("y", binary_data=False, class_count=50)
    got = http.infer("classifier", [x_http], outputs=[many]).as_numpy("y")
    # tritonclient hands BYTES sent as JSON back as str.
    assert got.shape == (3, 10)
    assert [[s.encode() for s in row] for row in got.tolist()] == _expected_classes(10)
    bad = th.InferRequestedOutput("y", class_count=-1)
    with pytest.raises(InferenceServerException, match="must be a non-negative integer"):
        http.infer("classifier", [x_http], outputs=[bad])


def test_statistics_count_requests_and_batches(grpc: tg.InferenceServerClient) -> None:
    before = grpc.get_inference_statistics("simple").model_stats[0]
    inputs = [tg.InferInput(n, [3, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    for inp in inputs:
        inp.set_data_from_numpy(np.zeros((3, 4), np.float32))
    grpc.infer("simple", inputs)
    after = grpc.get_inference_statistics("simple").model_stats[0]
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    assert after.inference_stats.compute_infer.count == after.inference_stats.success.count
    assert after.inference_count == before.inference_count + 3
    three = next(b for b in after.batch_stats if b.batch_size == 3)
    assert three.compute_input.count == three.compute_infer.count == three.compute_output.count


def test_load_with_a_config_override_and_with_files(
    server: LocalServer, http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    config = http.get_model_config("classifier")
    config["max_batch_size"] = 4
    config["dynamic_batching"]["preferred_batch_size"] = [2, 4]
    http.load_model("classifier", config=json.dumps(config))
    assert grpc.get_model_config("classifier").config.max_batch_size == 4
    http.load_model("classifier")  # again from the repository
    assert http.get_model_config("classifier")["max_batch_size"] == 16

    model = onnx_model(add_graph(5.0, 4, "x", "y")).SerializeToString()
    uploaded = json.dumps(
        {
            "backend": "onnxruntime",
            "max_batch_size": 2,
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
        }
    )
    x = np.ones((1, 4), np.float32)
    for client, name in ((http, "plus_five_http"), (grpc, "plus_five_grpc")):
        client.load_model(name, config=uploaded, files={"file:1/model.onnx": model})
        assert client.is_model_ready(name)
        inp = tg.InferInput("x", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(grpc.infer(name, [inp]).as_numpy("y"), x + 5)
        rows = {m["name"]: m for m in http.get_model_repository_index()}
        assert rows[name]["state"] == "READY"
        client.unload_model(name)
        assert name not in server.dataplane.uploads.names()


def test_trace_settings_and_trace_files(
    server: LocalServer, http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    assert http.get_trace_settings()["trace_level"] == ["OFF"]
    settings = http.update_trace_settings(
        "simple", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "2"}
    )
    assert settings["trace_level"] == ["TIMESTAMPS"] and settings["trace_rate"] == "1"
    assert http.get_trace_settings()["trace_level"] == ["OFF"]  # only the model's changed
    over_grpc = grpc.get_trace_settings("simple", as_json=True)["settings"]
    assert over_grpc["trace_level"]["value"] == ["TIMESTAMPS"]
    inputs = [th.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    for inp in inputs:
        inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
    for i in range(2):
        http.infer("simple", inputs, request_id=f"traced-{i}")
    trace_file = server.dataplane.tracer.trace_file
    assert trace_file is not None
    server.dataplane.tracer.wait()  # files are written by the tracer's thread
    written = json.loads(trace_file.with_name(trace_file.name + ".0").read_text())
    headers = [t for t in written if "model_name" in t]
    assert [(t["model_name"], t["request_id"]) for t in headers] == [
        ("simple", "traced-0"),
        ("simple", "traced-1"),
    ]
    stamps = [t["timestamps"] for t in written if "timestamps" in t]
    names = [s["name"] for s in stamps[0]]
    assert names == [
        "REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END",
    ]  # fmt: skip
    ns = [s["ns"] for s in stamps[0]]
    assert ns == sorted(ns)
    grpc.update_trace_settings("simple", {"trace_level": None, "trace_rate": None})
    assert http.get_trace_settings("simple")["trace_level"] == ["OFF"]
    with pytest.raises(InferenceServerException, match="cannot be changed through the protocol"):
        http.update_trace_settings(settings={"trace_file": "/tmp/elsewhere.json"})
    with pytest.raises(InferenceServerException, match="TENSORS is not supported"):
        grpc.update_trace_settings(settings={"trace_level": ["TENSORS"]})
    with pytest.raises(InferenceServerException, match="'trace_rate' must be an integer >= 1"):
        http.update_trace_settings(settings={"trace_rate": "often"})


def test_log_settings_over_both_protocols(
    http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    settings = http.get_log_settings()
    assert settings == {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }
    assert http.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
    assert logging.getLogger("dlscale").isEnabledFor(logging.DEBUG)
    answer = grpc.update_log_settings({"log_verbose_level": 0, "log_format": "ISO8601"})
    assert answer.settings["log_format"].string_param == "ISO8601"
    assert not logging.getLogger("dlscale").isEnabledFor(logging.DEBUG)
    with pytest.raises(InferenceServerException, match="log file cannot be changed"):
        http.update_log_settings({"log_file": "/tmp/x.log"})
    with pytest.raises(InferenceServerException, match="'log_info' must be true or false"):
        http.update_log_settings({"log_info": "yes"})
    grpc.update_log_settings({"log_format": "default"})


def test_extensions_are_advertised(http: th.InferenceServerClient) -> None:
    extensions = set(http.get_server_metadata()["extensions"])
    assert {"classification", "model_configuration", "trace", "logging"} <= extensions


def test_one_log_line_per_failed_request(
    http: th.InferenceServerClient,
    grpc: tg.InferenceServerClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    wrong = th.InferInput("x", [1, 5], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 5), np.float32))
    with caplog.at_level(logging.INFO, logger="dlscale.requests"):
        with pytest.raises(InferenceServerException):
            http.infer("classifier", [wrong])
        with pytest.raises(InferenceServerException):
            grpc.get_model_metadata("ghost")
    lines = [r.getMessage() for r in caplog.records if r.name == "dlscale.requests"]
    assert len(lines) == 2
    assert lines[0].startswith("HTTP request failed: model=classifier status=400 reason=REJECTED")
    assert "has shape [-1, 16]" in lines[0]
    assert lines[1].startswith("gRPC request failed: model=ghost status=NOT_FOUND reason=REJECTED")


def test_label_files_must_exist(tmp_path: Path) -> None:
    root = triton_repository(tmp_path)
    (root / "classifier" / "labels.txt").unlink()
    with serving(root) as running:
        rows = {r.name: r for r in running.dataplane.repository_index()}
    assert rows["classifier"].state == "UNAVAILABLE"
    assert "label_file cannot be read" in rows["classifier"].reason


def test_the_access_log_has_a_line_per_request(
    http: th.InferenceServerClient,
    grpc: tg.InferenceServerClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="dlscale.access"):  # what --access-log turns on
        http.get_model_metadata("simple")
        grpc.is_model_ready("simple")
    lines = [r.getMessage() for r in caplog.records if r.name == "dlscale.access"]
    assert len(lines) == 2
    assert lines[0].startswith("HTTP GET /v2/models/simple 200 ")
    assert lines[1].startswith("gRPC ModelReady simple OK ")
    assert all(line.endswith("ms") for line in lines)
