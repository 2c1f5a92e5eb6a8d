"""The Open Inference Protocol over gRPC on a Ray fleet: tritonclient through its router."""

from __future__ import annotations

import queue
from typing import Any

import numpy as np
import pytest
from tests.integration.scale.conftest import RAY_MISSING, Deployed
from tests.toolkit.clients import infer_input

pytest.importorskip("ray", reason=RAY_MISSING)

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def test_infer_metadata_and_config(grpc: grpcclient.InferenceServerClient) -> None:
    assert grpc.is_server_live() and grpc.is_server_ready() and grpc.is_model_ready("identity")
    x = np.random.default_rng(1).random((3, 16), dtype=np.float32)
    answer = grpc.infer("identity", [infer_input("input", x)]).as_numpy("output")
    np.testing.assert_array_equal(answer, x)
    assert grpc.get_model_metadata("mlp").inputs[0].shape == [-1, 256]
    assert grpc.get_model_config("digits").config.max_batch_size == 256
    assert "statistics" in grpc.get_server_metadata().extensions


@pytest.mark.parametrize(
    ("model", "shape", "code", "words"),
    [
        ("nope", (1, 16), "StatusCode.NOT_FOUND", "unknown model 'nope'"),
        ("identity", (1, 15), "StatusCode.INVALID_ARGUMENT", "has shape [-1, 16]"),
    ],
)
def test_errors_carry_the_single_host_servers_codes(
    grpc: grpcclient.InferenceServerClient,
    model: str,
    shape: tuple[int, ...],
    code: str,
    words: str,
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        grpc.infer(model, [infer_input("input", np.zeros(shape, np.float32))])
    assert caught.value.status() == code and words in caught.value.message()


def test_the_stream_answers_each_request_and_reports_errors_in_stream(
    grpc: grpcclient.InferenceServerClient,
) -> None:
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    sent = {str(k): np.full((1, 4), k, np.float32) for k in range(4)}
    for request_id, x in sent.items():
        grpc.async_stream_infer("sleeper", [infer_input("x", x)], request_id=request_id)
    grpc.async_stream_infer("sleeper", [infer_input("x", np.zeros((1, 5), np.float32))])
    got, errors = {}, []
    for _ in range(len(sent) + 1):
        result, error = answers.get(timeout=60)
        if error is not None:
            errors.append(str(error))
        else:
            response = result.get_response()  # type: ignore[attr-defined]
            got[response.id] = result.as_numpy("y")  # type: ignore[attr-defined]
    grpc.stop_stream()
    assert sorted(got) == sorted(sent)
    for request_id, x in sent.items():
        np.testing.assert_array_equal(got[request_id], x)
    assert len(errors) == 1 and "has shape [-1, 4]" in errors[0]


def test_repository_and_statistics_rpcs(grpc: grpcclient.InferenceServerClient) -> None:
    index = {m.name: m for m in grpc.get_model_repository_index().models}
    assert index["identity"].state == "READY" and index["broken"].state == "UNAVAILABLE"
    grpc.infer("identity", [infer_input("input", np.ones((1, 16), np.float32))])
    stats = grpc.get_inference_statistics("identity").model_stats[0]
    assert stats.name == "identity" and stats.inference_stats.success.count >= 1


def test_model_stream_infer_through_the_router(deployed: Deployed) -> None:
    """A Python model that streams, behind the router: 0..N responses, the final flagged."""
    client = grpcclient.InferenceServerClient(deployed.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([2], np.int32))
    client.async_stream_infer("ticker", [count], enable_empty_final_response=True)
    answers = [results.get(timeout=60.0) for _ in range(3)]
    client.stop_stream()
    client.close()
    assert all(error is None for _, error in answers)
    assert [r.as_numpy("TICK").tolist() for r, _ in answers[:2]] == [[0], [1]]
    assert answers[2][0].get_response().parameters["triton_final_response"].bool_param


def test_load_and_unload_over_grpc_reach_the_control_endpoint(
    grpc: grpcclient.InferenceServerClient, deployed: Deployed
) -> None:
    """HAProxy sends the two RPCs (by their HTTP/2 path) to the router actor, which sends them
    to every replica and records them; a model no replica has is refused as a replica refuses
    it, and not recorded."""
    import json
    import urllib.request

    def wanted() -> dict[str, str]:
        with urllib.request.urlopen(f"http://{deployed.http_url}/dlscale/fleet") as page:
            return dict(json.loads(page.read())["models"])

    grpc.unload_model("mlp")
    assert not grpc.is_model_ready("mlp") and wanted()["mlp"] == "unload"
    grpc.load_model("mlp")
    assert grpc.is_model_ready("mlp") and wanted()["mlp"] == "load"
    with pytest.raises(InferenceServerException) as caught:
        grpc.load_model("nope")
    assert caught.value.status() == "StatusCode.NOT_FOUND" and "nope" in caught.value.message()
    assert "nope" not in wanted()
