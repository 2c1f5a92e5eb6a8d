"""Triton's response cache as a Triton user turns it on: `response_cache { enable: true }` in
config.pbtxt, `--cache-size` on the server; hits and misses in the statistics and metrics."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tests.toolkit.models import add_graph, save_onnx
from tests.toolkit.server import LocalServer, serving

CACHED = """name: "cached"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "input" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 4 ] } ]
response_cache { enable: true }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("cache-repo")
    for name, config in (("cached", CACHED), ("plain", CACHED.replace("cached", "plain"))):
        save_onnx(add_graph(1.0), root / name / "1" / "model.onnx")
        text = config if name == "cached" else config.replace("response_cache { enable: true }", "")
        (root / name / "config.pbtxt").write_text(text)
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
