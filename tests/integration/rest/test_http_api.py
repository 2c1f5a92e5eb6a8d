"""Every REST endpoint through the real tritonclient (sync and asyncio) against a real server."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as th
import tritonclient.http.aio as tha
from tests.toolkit.repositories import mlp_reference
from tests.toolkit.server import LocalServer
from tritonclient.utils import InferenceServerException


def _input(name: str, array: np.ndarray, datatype: str, binary: bool) -> th.InferInput:
    tensor = th.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


# -- health and metadata ---------------------------------------------------------------------------


def test_health_and_server_metadata(client: th.InferenceServerClient) -> None:
    assert client.is_server_live()
    # The repository's "broken" model failed to load: under strict readiness (the default, as
    # Triton's) the server says not ready, and its index says why (test_repository_index).
    assert not client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "dlscale"
    assert {"binary_tensor_data", "model_repository", "statistics", "schedule_policy"} <= set(
        meta["extensions"]
    )


def test_model_metadata_and_readiness(client: th.InferenceServerClient) -> None:
    meta = client.get_model_metadata("two_inputs")
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("a", "FP32", [-1, 4]),
        ("b", "INT32", [-1, 4]),
    ]
    assert [t["name"] for t in meta["outputs"]] == ["sum", "b_copy"]
    assert client.get_model_metadata("plus", "1")["versions"] == ["1", "2"]
    assert client.is_model_ready("identity")
    assert client.is_model_ready("plus", "2")
    assert not client.is_model_ready("plus", "3")
    assert not client.is_model_ready("no_such_model")
    assert not client.is_model_ready("broken")


def test_model_config(client: th.InferenceServerClient) -> None:
    # Triton's layout (the JSON form of gRPC's ModelConfig), as tritonclient reads it.
    config = client.get_model_config("identity")
    assert config["name"] == "identity"
    assert config["max_batch_size"] == 64
    assert config["platform"] == client.get_model_metadata("identity")["platform"]
    assert config["platform"] == "onnxruntime_onnx" and config["backend"] == "onnxruntime"
    (tensor,) = config["input"]
    assert {k: tensor[k] for k in ("name", "data_type", "dims")} == {
        "name": "input",
        "data_type": "TYPE_FP32",
        "dims": [16],
    }
    assert tensor["is_shape_tensor"] is False and tensor["format"] == "FORMAT_NONE"
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert client.get_model_config("plus", "1")["version_policy"] == {"all": {}}


def test_model_config_has_triton_s_whole_schema(client: th.InferenceServerClient) -> None:
    # Code written against Triton reads these keys; a subset gave it KeyError.
    config = client.get_model_config("identity")
    assert config["model_transaction_policy"] == {"decoupled": False}
    assert config["response_cache"] == {"enable": False}
    assert config["default_model_filename"] == "model.onnx"
    assert config["model_warmup"] == [] and config["batch_input"] == []
    assert config["optimization"]["input_pinned_memory"] == {"enable": True}
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] >= 0
    assert config["cc_model_filenames"] == {} and config["metric_tags"] == {}
    stats = client.get_inference_statistics("identity")["model_stats"][0]["inference_stats"]
    assert stats["cache_hit"] == {"count": 0, "ns": 0}
    assert stats["cache_miss"] == {"count": 0, "ns": 0}


# -- inference -------------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True])
def test_identity_json_and_binary(client: th.InferenceServerClient, binary: bool) -> None:
    x = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
    result = client.infer(
        "identity",
        [_input("input", x, "FP32", binary)],
        request_id="req-42",
        outputs=[th.InferRequestedOutput("output", binary_data=binary)],
    )
    np.testing.assert_array_equal(result.as_numpy("output"), x)
    response = result.get_response()
    assert response["id"] == "req-42"
    assert response["model_name"] == "identity"
    assert response["model_version"] == "1"
    assert ("parameters" in response["outputs"][0]) == binary


def test_mlp_matches_numpy(client: th.InferenceServerClient) -> None:
    x = np.random.default_rng(2).standard_normal((7, 16)).astype(np.float32)
    result = client.infer("mlp", [_input("x", x, "FP32", True)])
    np.testing.assert_allclose(result.as_numpy("y"), mlp_reference(x), rtol=1e-5, atol=1e-5)


def test_two_inputs_mixed_encodings_and_output_selection(
    client: th.InferenceServerClient,
) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4) / 4
    b = np.arange(8, dtype=np.int32).reshape(2, 4) - 3
    inputs = [_input("a", a, "FP32", True), _input("b", b, "INT32", False)]
    both = client.infer(
        "two_inputs",
        inputs,
        outputs=[
            th.InferRequestedOutput("sum", binary_data=False),
            th.InferRequestedOutput("b_copy", binary_data=True),
        ],
    )
    np.testing.assert_array_equal(both.as_numpy("sum"), a + b)
    np.testing.assert_array_equal(both.as_numpy("b_copy"), b)
    only = client.infer("two_inputs", inputs, outputs=[th.InferRequestedOutput("b_copy")])
    assert [o["name"] for o in only.get_response()["outputs"]] == ["b_copy"]
    assert only.as_numpy("sum") is None


@pytest.mark.parametrize("binary", [False, True])
def test_bytes_tensors(client: th.InferenceServerClient, binary: bool) -> None:
    text = np.array([["héllo", ""], ["a b", "ok"]], dtype=object)
    result = client.infer(
        "strings",
        [_input("text", text, "BYTES", binary)],
        outputs=[th.InferRequestedOutput("echo", binary_data=binary)],
    )
    echoed = result.as_numpy("echo")
    assert echoed.shape == (2, 2)
    decoded = [x.decode() if isinstance(x, bytes) else x for x in echoed.reshape(-1)]
    assert decoded == ["héllo", "", "a b", "ok"]


@pytest.mark.parametrize("binary", [False, True])
def test_int64_and_non_batched_bool(client: th.InferenceServerClient, binary: bool) -> None:
    n = np.array([[1, -2, 2**40]], dtype=np.int64)
    doubled = client.infer("int64", [_input("n", n, "INT64", binary)]).as_numpy("doubled")
    np.testing.assert_array_equal(doubled, n * 2)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    flags = np.array([True, False, True])
    result = client.infer(
        "fixed",
        [_input("x", x, "FP32", binary), _input("flags", flags, "BOOL", binary)],
        outputs=[
            th.InferRequestedOutput("y", binary_data=binary),
            th.InferRequestedOutput("flipped", binary_data=binary),
        ],
    )
    np.testing.assert_array_equal(result.as_numpy("y"), x * 3)
    np.testing.assert_array_equal(result.as_numpy("flipped"), ~flags)


def test_fp16_travels_binary(client: th.InferenceServerClient) -> None:
    x = np.array([[0.5, -1.25, 3.0, 65504.0]], dtype=np.float16)
    result = client.infer(
        "half",
        [_input("x", x, "FP16", True)],
        outputs=[th.InferRequestedOutput("y", binary_data=False)],
    )
    # FP16 cannot travel as JSON numbers: the server sends it binary even when asked for JSON.
    np.testing.assert_array_equal(result.as_numpy("y"), x)


def test_versions(client: th.InferenceServerClient) -> None:
    x = np.zeros((1, 4), dtype=np.float32)
    for version, expected in (("1", 1.0), ("2", 2.0), ("", 2.0)):
        out = client.infer("plus", [_input("input", x, "FP32", True)], model_version=version)
        np.testing.assert_array_equal(out.as_numpy("output"), x + expected)
        assert out.get_response()["model_version"] == (version or "2")


def test_gzip_and_deflate_request_bodies(client: th.InferenceServerClient) -> None:
    x = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)
    for algorithm in ("gzip", "deflate"):
        result = client.infer(
            "identity",
            [_input("input", x, "FP32", True)],
            request_compression_algorithm=algorithm,
        )
        np.testing.assert_array_equal(result.as_numpy("output"), x)


def test_raw_binary_form(server: LocalServer) -> None:
    """Inference-Header-Content-Length: 0 sends one input's bytes; all outputs come back binary."""
    x = np.arange(16, dtype=np.float32)
    r = httpx.post(
        f"http://{server.http_url}/v2/models/identity/infer",
        content=x.tobytes(),
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert r.status_code == 200, r.text
    header_length = int(r.headers["Inference-Header-Content-Length"])
    result = th.InferResult.from_response_body(r.content, header_length=header_length)
    np.testing.assert_array_equal(result.as_numpy("output"), x.reshape(1, 16))


def test_priority_and_timeout_reach_the_batcher(client: th.InferenceServerClient) -> None:
    x = np.ones((1, 4), dtype=np.float32)
    with pytest.raises(InferenceServerException, match="priority 3 is out of range"):
        client.infer("queued", [_input("input", x, "FP32", True)], priority=3)
    # The "queued" model waits 300 ms for more rows: a 1 us timeout expires in the queue.
    with pytest.raises(InferenceServerException, match="timed out in the queue") as caught:
        client.infer("queued", [_input("input", x, "FP32", True)], timeout=1)
    assert caught.value.status() == "503"
    out = client.infer("queued", [_input("input", x, "FP32", True)], priority=1)
    np.testing.assert_array_equal(out.as_numpy("output"), x)


# -- repository and statistics ---------------------------------------------------------------------


def test_statistics(client: th.InferenceServerClient) -> None:
    x = np.ones((3, 16), dtype=np.float32)
    before = client.get_inference_statistics("identity")["model_stats"][0]
    client.infer("identity", [_input("input", x, "FP32", True)])
    after = client.get_inference_statistics("identity", "1")["model_stats"][0]
    assert after["inference_count"] == before["inference_count"] + 3
    success = after["inference_stats"]["success"]["count"]
    assert success == before["inference_stats"]["success"]["count"] + 1
    everything = client.get_inference_statistics()["model_stats"]
    assert {"identity", "mlp", "plus"} <= {s["name"] for s in everything}


def test_repository_index_load_unload(
    client: th.InferenceServerClient, server: LocalServer
) -> None:
    index = {(m["name"], m.get("version")): m for m in client.get_model_repository_index()}
    assert index[("plus", "2")]["state"] == "READY"
    assert index[("broken", None)]["state"] == "UNAVAILABLE"
    assert "max_batch_size" in index[("broken", None)]["reason"]
    x = np.ones((1, 4), dtype=np.float32)
    client.unload_model("two_inputs")
    assert not client.is_model_ready("two_inputs")
    # An unloaded model's row still names its version, as Triton's does (code reads the key).
    rows = [m for m in client.get_model_repository_index() if m["name"] == "two_inputs"]
    assert rows == [
        {"name": "two_inputs", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    ]
    with pytest.raises(InferenceServerException, match="not ready") as caught:
        client.infer(
            "two_inputs",
            [_input("a", x, "FP32", True), _input("b", x.astype(np.int32), "INT32", True)],
        )
    assert caught.value.status() == "503"
    client.load_model("two_inputs")
    assert client.is_model_ready("two_inputs")
    with pytest.raises(InferenceServerException, match="no model 'ghost'") as caught:
        client.load_model("ghost")
    assert caught.value.status() == "404"
    ready = httpx.post(f"http://{server.http_url}/v2/repository/index", json={"ready": True}).json()
    assert ready and all(m["state"] == "READY" for m in ready)
    assert "broken" not in {m["name"] for m in ready}


# -- the asyncio client ----------------------------------------------------------------------------


async def test_aio_client_everything(server: LocalServer) -> None:
    async with tha.InferenceServerClient(server.http_url) as client:
        assert await client.is_server_live()
        assert not await client.is_server_ready()  # "broken" failed to load (strict readiness)
        assert await client.is_model_ready("mlp")
        assert (await client.get_model_metadata("mlp"))["inputs"][0]["name"] == "x"
        x = np.random.default_rng(4).standard_normal((3, 16)).astype(np.float32)
        for binary in (False, True):
            tensor = tha.InferInput("x", [3, 16], "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            result = await client.infer(
                "mlp",
                [tensor],
                request_id="aio",
                outputs=[tha.InferRequestedOutput("y", binary_data=binary)],
            )
            np.testing.assert_allclose(result.as_numpy("y"), mlp_reference(x), rtol=1e-5, atol=1e-5)
            assert result.get_response()["id"] == "aio"
        stats = await client.get_inference_statistics("mlp")
        assert stats["model_stats"][0]["inference_count"] >= 6
        index = await client.get_model_repository_index()
        assert any(m["name"] == "mlp" for m in index)
