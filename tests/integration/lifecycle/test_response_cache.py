"""Triton's response cache as a Triton user turns it on: `response_cache { enable: true }` in
config.pbtxt, `--cache-size` on the server; hits and misses in the statistics and metrics."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tests.toolkit.models import add_graph, save_onnx
from tests.toolkit.python_models import write_triton_python_model
from tests.toolkit.server import LocalServer, serving

CACHED = """name: "cached"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "input" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 4 ] } ]
response_cache { enable: true }
"""

#: A step whose answer its config decides: `input` times the config's parameter `factor`.
SCALER = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.factor = float(parameters["factor"]["string_value"])

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
                "output", pb_utils.get_input_tensor_by_name(r, "input").as_numpy() * self.factor
            )])
            for r in requests
        ]
"""
SCALER_CONFIG = CACHED.replace('"cached"', '"scaler"').replace(
    'backend: "onnxruntime"', 'backend: "python"'
).replace("response_cache { enable: true }", "") + (
    'parameters { key: "DLSCALE_ISOLATION" value: { string_value: "thread" } }\n'
    'parameters { key: "factor" value: { string_value: "2" } }\n'
)
#: A cached pipeline of one step, scaler (Triton's ensemble).
SCALED = (
    CACHED.replace('"cached"', '"scaled"').replace('backend: "onnxruntime"', 'platform: "ensemble"')
    + """ensemble_scheduling { step [ {
  model_name: "scaler" model_version: -1
  input_map { key: "input" value: "input" } output_map { key: "output" value: "output" }
} ] }
"""
)
#: A cached Python model that calls scaler (Triton's BLS) for its answer.
CALLS_SCALER = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="scaler", requested_output_names=["output"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "input")],
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out = pb_utils.get_output_tensor_by_name(answer, "output")
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""
CALLS_SCALER_CONFIG = (
    CACHED.replace('"cached"', '"calls_scaler"').replace(
        'backend: "onnxruntime"', 'backend: "python"'
    )
    + 'parameters { key: "DLSCALE_ISOLATION" value: { string_value: "thread" } }\n'
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("cache-repo")
    for name, config in (("cached", CACHED), ("plain", CACHED.replace("cached", "plain"))):
        save_onnx(add_graph(1.0), root / name / "1" / "model.onnx")
        text = config if name == "cached" else config.replace("response_cache { enable: true }", "")
        (root / name / "config.pbtxt").write_text(text)
    write_triton_python_model(root, "scaler", SCALER, SCALER_CONFIG)
    write_triton_python_model(root, "calls_scaler", CALLS_SCALER, CALLS_SCALER_CONFIG)
    (root / "scaled" / "1").mkdir(parents=True)
    (root / "scaled" / "config.pbtxt").write_text(SCALED)
    with serving(root, cache_bytes=1 << 20, metrics_port=0) as running:
        yield running


def _infer(client: httpclient.InferenceServerClient, model: str, x: np.ndarray) -> np.ndarray:
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    answer = client.infer(model, [tensor]).as_numpy("output")
    assert answer is not None
    return answer


def _cache_stats(client: httpclient.InferenceServerClient, model: str) -> tuple[int, int]:
    stats = client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
    return stats["cache_hit"]["count"], stats["cache_miss"]["count"]


def test_identical_requests_are_answered_from_the_cache(server: LocalServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    first, second = _infer(client, "cached", x), _infer(client, "cached", x)
    np.testing.assert_array_equal(first, x + 1)
    np.testing.assert_array_equal(second, first)
    assert _cache_stats(client, "cached") == (1, 1)
    # Another input is another answer: a miss, computed, right.
    np.testing.assert_array_equal(_infer(client, "cached", x + 5), x + 6)
    assert _cache_stats(client, "cached") == (1, 2)
    # Over gRPC, the same request meets the same cache.
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("input", [2, 4], "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_array_equal(grpc.infer("cached", [tensor]).as_numpy("output"), x + 1)
    assert _cache_stats(client, "cached") == (2, 2)
    config = client.get_model_config("cached")
    assert config["response_cache"] == {"enable": True}
    # A model whose config does not enable it is never cached.
    _infer(client, "plain", x), _infer(client, "plain", x)
    assert _cache_stats(client, "plain") == (0, 0)
    assert client.get_model_config("plain")["response_cache"] == {"enable": False}


def test_hits_and_misses_are_in_the_metrics(server: LocalServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    x = np.full((1, 4), 3.0, np.float32)
    _infer(client, "cached", x), _infer(client, "cached", x)
    hits, misses = _cache_stats(client, "cached")
    url = f"http://127.0.0.1:{server.server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    assert f'nv_cache_num_hits_per_model{{model="cached",version="1"}} {float(hits)}' in text
    assert f'nv_cache_num_misses_per_model{{model="cached",version="1"}} {float(misses)}' in text


def test_a_reloaded_model_never_answers_from_the_previous_loads_answers(
    server: LocalServer,
) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    x = np.full((1, 4), 7.0, np.float32)
    _infer(client, "cached", x)
    client.unload_model("cached")
    client.load_model("cached")
    np.testing.assert_array_equal(_infer(client, "cached", x), x + 1)
    assert _cache_stats(client, "cached") == (0, 1)  # computed again after the reload


@pytest.mark.parametrize("model", ["scaled", "calls_scaler"])
def test_reloading_a_model_that_computes_the_answer_changes_the_cached_answer(
    server: LocalServer, model: str
) -> None:
    # Issue 33: a pipeline (or a model that calls others) kept its cached answer after a step
    # it uses was reloaded to answer otherwise: 2.0 where 6.0 was now right.
    client = httpclient.InferenceServerClient(server.http_url)
    x = np.ones((1, 4), np.float32)
    # Three times: a model's first call of another is only known once it made it.
    for _ in range(3):
        np.testing.assert_array_equal(_infer(client, model, x), x * 2)
    assert _cache_stats(client, model)[0] >= 1  # the answer is held
    # Its config says so, a pipeline's as a model's (a pipeline's view once hid it).
    assert client.get_model_config(model)["response_cache"] == {"enable": True}
    config = client.get_model_config("scaler")
    config["parameters"]["factor"]["string_value"] = "6"
    client.load_model("scaler", config=json.dumps(config))
    try:
        np.testing.assert_array_equal(_infer(client, model, x), x * 6)
    finally:
        client.load_model("scaler")  # the repository's factor again, for the next case
    np.testing.assert_array_equal(_infer(client, model, x), x * 2)


def test_a_server_without_cache_serves_the_model_uncached_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    save_onnx(add_graph(1.0), tmp_path / "cached" / "1" / "model.onnx")
    (tmp_path / "cached" / "config.pbtxt").write_text(CACHED)
    with serving(tmp_path) as running:
        client = httpclient.InferenceServerClient(running.http_url)
        x = np.ones((1, 4), np.float32)
        _infer(client, "cached", x), _infer(client, "cached", x)
        assert _cache_stats(client, "cached") == (0, 0)
    assert "enable response_cache, but the server has no cache" in caplog.text
