"""Every RPC of the gRPC frontend through tritonclient (blocking, asyncio and streaming)."""

from __future__ import annotations

import queue
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from tests.toolkit.clients import infer_input
from tests.toolkit.repositories import MLP_B, MLP_W
from tests.toolkit.server import LocalServer
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

# -- health and metadata ------------------------------------------------------------------------


def test_health(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("identity")
    assert client.is_model_ready("identity", "1")
    assert not client.is_model_ready("identity", "2")
    assert not client.is_model_ready("no_such_model")


def test_server_metadata(client: triton.InferenceServerClient) -> None:
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "dlscale"
    assert {"binary_tensor_data", "schedule_policy", "model_repository", "statistics"} <= set(
        meta["extensions"]
    )


def test_model_metadata(client: triton.InferenceServerClient) -> None:
    meta = client.get_model_metadata("two_inputs", as_json=True)
    assert meta["name"] == "two_inputs"
    assert meta["versions"] == ["1"]
    assert meta["inputs"] == [
        {"name": "a", "datatype": "FP32", "shape": ["-1", "4"]},
        {"name": "b", "datatype": "FP32", "shape": ["-1", "4"]},
    ]
    assert [o["name"] for o in meta["outputs"]] == ["sum", "diff"]
    unbatched = client.get_model_metadata("unbatched")
    assert list(unbatched.inputs[0].shape) == [2, 3]
    assert unbatched.platform == "onnxruntime_onnx"


def test_model_config(client: triton.InferenceServerClient) -> None:
    config = client.get_model_config("identity").config
    assert config.name == "identity"
    assert config.max_batch_size == 32
    assert config.backend == "onnxruntime"
    assert [(i.name, list(i.dims)) for i in config.input] == [("x", [16])]
    assert config.input[0].data_type == triton.model_config_pb2.TYPE_FP32
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert config.dynamic_batching.priority_levels == 2
    assert config.instance_group[0].count == 1
    assert config.instance_group[0].kind == triton.model_config_pb2.ModelInstanceGroup.KIND_CPU
    ints = client.get_model_config("ints_bytes").config
    assert [i.data_type for i in ints.input] == [
        triton.model_config_pb2.TYPE_INT64,
        triton.model_config_pb2.TYPE_STRING,
    ]
    unbatched = client.get_model_config("unbatched").config
    assert unbatched.max_batch_size == 0 and list(unbatched.input[0].dims) == [2, 3]
    assert not unbatched.HasField("dynamic_batching")


# -- inference: raw contents (what tritonclient sends) ---------------------------------------------


def test_infer_identity_raw(client: triton.InferenceServerClient) -> None:
    x = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
    result = client.infer("identity", [infer_input("x", x)], request_id="req-1")
    np.testing.assert_array_equal(result.as_numpy("y"), x)
    response = result.get_response()
    assert response.id == "req-1"
    assert response.model_name == "identity" and response.model_version == "1"
    assert len(response.raw_output_contents) == 1


def test_infer_versioned_and_priority_and_timeout(client: triton.InferenceServerClient) -> None:
    x = np.ones((2, 16), np.float32)
    result = client.infer(
        "identity", [infer_input("x", x)], model_version="1", priority=1, timeout=10_000_000
    )
    np.testing.assert_array_equal(result.as_numpy("y"), x)


def test_infer_mlp(client: triton.InferenceServerClient) -> None:
    x = np.random.default_rng(2).standard_normal((7, 16)).astype(np.float32)
    y = client.infer("mlp", [infer_input("x", x)]).as_numpy("y")
    np.testing.assert_allclose(y, x @ MLP_W + MLP_B, rtol=1e-5, atol=1e-5)


def test_infer_two_inputs_and_requested_outputs(client: triton.InferenceServerClient) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 0.5, np.float32)
    inputs = [infer_input("a", a), infer_input("b", b)]
    both = client.infer("two_inputs", inputs)
    np.testing.assert_array_equal(both.as_numpy("sum"), a + b)
    np.testing.assert_array_equal(both.as_numpy("diff"), a - b)
    only = client.infer("two_inputs", inputs, outputs=[triton.InferRequestedOutput("diff")])
    assert only.as_numpy("sum") is None
    np.testing.assert_array_equal(only.as_numpy("diff"), a - b)


def test_infer_int64(client: triton.InferenceServerClient) -> None:
    i = np.arange(6, dtype=np.int64).reshape(2, 3) - 3
    s = np.array([[b"a", b"b"], [b"c", b"d"]], dtype=object)
    result = client.infer("ints_bytes", [infer_input("i", i), infer_input("s", s)])
    np.testing.assert_array_equal(result.as_numpy("i2"), i * 2)
    assert result.as_numpy("i2").dtype == np.int64


def test_infer_bytes(client: triton.InferenceServerClient) -> None:
    i = np.zeros((2, 3), np.int64)
    s = np.array([[b"ab", b"c\x00d"], [b"", "é".encode()]], dtype=object)
    result = client.infer("ints_bytes", [infer_input("i", i), infer_input("s", s)])
    assert result.as_numpy("s_out").tolist() == s.tolist()


def test_infer_fp16_raw(client: triton.InferenceServerClient) -> None:
    h = np.array([[0.5, -1.25], [65504.0, 1e-3]], np.float16)
    result = client.infer("half", [infer_input("h", h)])
    out = result.as_numpy("h_out")
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, h)


def test_infer_unbatched(client: triton.InferenceServerClient) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = client.infer("unbatched", [infer_input("x", x)])
    np.testing.assert_array_equal(result.as_numpy("y"), x * 2)


# -- inference: typed contents (tritonclient's own messages, sent through its stub) --------------


def test_typed_contents_answered_raw_by_default(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    request = service_pb2.ModelInferRequest(model_name="identity", id="typed")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[2, 16])
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    response = stub.ModelInfer(request)
    assert response.id == "typed"
    out = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(2, 16)
    np.testing.assert_array_equal(out, x)
    assert not response.outputs[0].HasField("contents")


def test_typed_contents_both_ways(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request = service_pb2.ModelInferRequest(model_name="two_inputs")
    for name, values in (("a", [1.0, 2.0, 3.0, 4.0]), ("b", [0.5, 0.5, 0.5, 0.5])):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend(
            values
        )
    request.parameters["binary_data_output"].bool_param = False
    response = stub.ModelInfer(request)
    assert not response.raw_output_contents
    got = {o.name: (list(o.shape), list(o.contents.fp32_contents)) for o in response.outputs}
    assert got == {"sum": ([1, 4], [1.5, 2.5, 3.5, 4.5]), "diff": ([1, 4], [0.5, 1.5, 2.5, 3.5])}


def test_typed_int64_and_fp16_forces_raw(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request = service_pb2.ModelInferRequest(model_name="ints_bytes")
    request.inputs.add(name="i", datatype="INT64", shape=[1, 3]).contents.int64_contents.extend(
        [-(2**40), 0, 7]
    )
    request.inputs.add(name="s", datatype="BYTES", shape=[1, 2]).contents.bytes_contents.extend(
        [b"x", b"y"]
    )
    request.parameters["binary_data_output"].bool_param = False
    response = stub.ModelInfer(request)
    i2 = next(o for o in response.outputs if o.name == "i2")
    assert list(i2.contents.int64_contents) == [-(2**41), 0, 14]
    assert len(next(o for o in response.outputs if o.name == "s_out").contents.bytes_contents) == 2
    # FP16 has no typed field: asked for typed outputs, the whole response still comes raw.
    half = service_pb2.ModelInferRequest(model_name="half")
    half.inputs.add(name="h", datatype="FP16", shape=[1, 2])
    half.raw_input_contents.append(np.array([[1.5, 2.0]], np.float16).tobytes())
    half.parameters["binary_data_output"].bool_param = False
    response = stub.ModelInfer(half)
    assert np.frombuffer(response.raw_output_contents[0], np.float16).tolist() == [1.5, 2.0]


# -- streaming ---------------------------------------------------------------------------------


def test_stream_sync_error_in_stream_and_stream_goes_on(
    client: triton.InferenceServerClient,
) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        sent = {}
        for n in range(6):
            x = np.full((n % 3 + 1, 16), float(n), np.float32)
            sent[str(n)] = x
            client.async_stream_infer("identity", [infer_input("x", x)], request_id=str(n))
            if n == 2:  # a bad request in the middle: wrong input name
                client.async_stream_infer("identity", [infer_input("nope", x)], request_id="bad")
        got, errors = {}, []
        for _ in range(7):
            result, error = results.get(timeout=30)
            if error is not None:
                errors.append(str(error))
            else:
                got[result.get_response().id] = result.as_numpy("y")
    finally:
        client.stop_stream()
    assert errors == ["model 'identity' expects inputs ['x']; the request lacks ['x']"]
    assert sorted(got) == sorted(sent)
    for rid, x in sent.items():
        np.testing.assert_array_equal(got[rid], x)


async def test_aio_client_and_stream(server: LocalServer) -> None:
    async with triton_aio.InferenceServerClient(server.grpc_url) as client:
        assert await client.is_server_live()
        assert await client.is_model_ready("mlp")
        meta = await client.get_model_metadata("mlp", as_json=True)
        assert meta["outputs"][0]["shape"] == ["-1", "8"]
        x = np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32)
        result = await client.infer("mlp", [infer_input("x", x)])
        np.testing.assert_allclose(result.as_numpy("y"), x @ MLP_W + MLP_B, rtol=1e-5, atol=1e-5)

        async def requests() -> AsyncIterator[dict[str, Any]]:
            for n in range(5):
                model = "unknown_model" if n == 3 else "identity"
                arr = np.full((1, 16), float(n), np.float32)
                yield {"model_name": model, "inputs": [infer_input("x", arr)], "request_id": str(n)}

        answers, errors = {}, []
        async for result, error in client.stream_infer(requests()):
            if error is not None:
                errors.append(str(error))
            else:
                answers[result.get_response().id] = result.as_numpy("y")
            if len(answers) + len(errors) == 5:
                break
        assert len(errors) == 1 and errors[0].startswith("unknown model 'unknown_model' (loaded:")
        assert {k: v[0, 0] for k, v in answers.items()} == {"0": 0.0, "1": 1.0, "2": 2.0, "4": 4.0}


# -- statistics and repository -------------------------------------------------------------------


def test_statistics(client: triton.InferenceServerClient) -> None:
    before = client.get_inference_statistics("mlp").model_stats[0]
    client.infer("mlp", [infer_input("x", np.zeros((3, 16), np.float32))])
    with pytest.raises(InferenceServerException):
        client.infer("mlp", [infer_input("x", np.zeros((3, 15), np.float32))])
    after = client.get_inference_statistics("mlp", "1").model_stats[0]
    assert (after.name, after.version) == ("mlp", "1")
    assert after.inference_count == before.inference_count + 3
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    assert after.inference_stats.fail.count == before.inference_stats.fail.count + 1
    assert after.inference_stats.compute_infer.ns > 0
    assert after.last_inference > 0
    assert any(b.batch_size == 3 for b in after.batch_stats)
    everything = client.get_inference_statistics(as_json=True)
    assert {"identity", "mlp", "two_inputs"} <= {s["name"] for s in everything["model_stats"]}


def test_repository_index_unload_load(client: triton.InferenceServerClient) -> None:
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["spare"].state == "READY" and index["spare"].version == "1"
    x = np.ones((1, 16), np.float32)
    client.unload_model("spare")
    assert not client.is_model_ready("spare")
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["spare"].state == "UNAVAILABLE" and index["spare"].reason == "unloaded"
    ready = {m.name for m in client.get_model_repository_index().models if m.state == "READY"}
    assert "spare" not in ready and "identity" in ready
    with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
        client.infer("spare", [infer_input("x", x)])
    client.load_model("spare")
    assert client.is_model_ready("spare")
    np.testing.assert_array_equal(client.infer("spare", [infer_input("x", x)]).as_numpy("y"), x)


def test_repository_errors(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match=r"NOT_FOUND.*no model 'nothing'"):
        client.load_model("nothing")
    with pytest.raises(InferenceServerException, match=r"INVALID_ARGUMENT.*not a valid Triton"):
        client.load_model("spare", config='{"max_batch_size": "two"}')
    with pytest.raises(InferenceServerException, match=r"INVALID_ARGUMENT.*needs the 'config'"):
        client.load_model("spare", files={"file:1/model.onnx": b"x"})
