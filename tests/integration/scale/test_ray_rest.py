"""The Open Inference Protocol over REST on a Ray fleet: tritonclient through its router."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from tests.integration.scale.conftest import RAY_MISSING, Deployed

pytest.importorskip("ray", reason=RAY_MISSING)

import httpx
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

#: Zoo models and the shape of one row of their input.
ROWS = {"identity": (16,), "mlp": (256,), "digits": (1, 8, 8)}


def _input(array: np.ndarray, binary: bool) -> httpclient.InferInput:
    tensor = httpclient.InferInput("input", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def _reference(repo: Path, model: str, x: np.ndarray) -> np.ndarray:
    """The model file run by onnxruntime in this process."""
    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"))
    return np.asarray(session.run(None, {"input": x})[0])


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("model", sorted(ROWS))
def test_every_zoo_answer_matches_the_model_run_here(
    http: httpclient.InferenceServerClient, ray_repo: Path, model: str, binary: bool
) -> None:
    rng = np.random.default_rng(len(model))
    for rows in (1, 5):
        x = rng.random((rows, *ROWS[model]), dtype=np.float32)
        answer = http.infer(model, [_input(x, binary)]).as_numpy("output")
        np.testing.assert_allclose(answer, _reference(ray_repo, model, x), rtol=1e-5, atol=1e-6)


def test_concurrent_requests_each_get_their_own_rows(
    http: httpclient.InferenceServerClient,
) -> None:
    rng = np.random.default_rng(3)
    sent = [rng.random((1 + k % 3, 16), dtype=np.float32) for k in range(24)]
    pending = [http.async_infer("identity", [_input(x, True)]) for x in sent]
    for x, request in zip(sent, pending, strict=True):
        np.testing.assert_array_equal(request.get_result().as_numpy("output"), x)


def test_health_and_metadata_are_the_single_host_servers(
    http: httpclient.InferenceServerClient,
) -> None:
    assert http.is_server_live() and http.is_server_ready()
    meta = http.get_server_metadata()
    assert meta["name"] == "dlscale" and "model_repository" in meta["extensions"]
    model = http.get_model_metadata("mlp")
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 256]}]
    assert http.get_model_config("mlp")["max_batch_size"] == 256
    assert http.is_model_ready("digits") and not http.is_model_ready("broken")


@pytest.mark.parametrize(
    ("model", "shape", "status", "words"),
    [
        ("nope", (1, 16), "404", "unknown model 'nope'"),
        ("identity", (1, 15), "400", "has shape [-1, 16]"),
        ("broken", (1, 16), "503", "max_batch_size"),
    ],
)
def test_bad_requests_get_the_single_host_servers_errors(
    http: httpclient.InferenceServerClient,
    model: str,
    shape: tuple[int, ...],
    status: str,
    words: str,
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        http.infer(model, [_input(np.zeros(shape, np.float32), True)])
    assert caught.value.status() == status and words in caught.value.message()


def test_the_index_says_why_a_model_was_not_deployed(
    http: httpclient.InferenceServerClient,
) -> None:
    rows = {r["name"]: r for r in http.get_model_repository_index()}
    assert {n: rows[n]["state"] for n in ("identity", "mlp", "digits", "sleeper")} == dict.fromkeys(
        ("identity", "mlp", "digits", "sleeper"), "READY"
    )
    assert rows["broken"]["state"] == "UNAVAILABLE" and "max_batch_size" in rows["broken"]["reason"]


def test_unload_then_load_over_the_protocol(
    http: httpclient.InferenceServerClient, ray_repo: Path
) -> None:
    http.unload_model("digits")
    assert not http.is_model_ready("digits")
    with pytest.raises(InferenceServerException) as caught:
        http.infer("digits", [_input(np.zeros((1, 1, 8, 8), np.float32), True)])
    assert caught.value.status() == "503" and "unloaded" in caught.value.message()
    http.load_model("digits")
    assert http.is_model_ready("digits")
    x = np.random.default_rng(5).random((2, 1, 8, 8), dtype=np.float32)
    answer = http.infer("digits", [_input(x, True)]).as_numpy("output")
    np.testing.assert_allclose(answer, _reference(ray_repo, "digits", x), rtol=1e-5, atol=1e-6)


def test_statistics_count_the_requests_the_replica_answered(
    http: httpclient.InferenceServerClient,
) -> None:
    before = http.get_inference_statistics("identity")["model_stats"][0]["inference_stats"]
    x = np.ones((1, 16), np.float32)
    for _ in range(3):
        http.infer("identity", [_input(x, True)])
    with pytest.raises(InferenceServerException):
        http.infer("identity", [_input(np.ones((1, 3), np.float32), True)])
    after = http.get_inference_statistics("identity")["model_stats"][0]["inference_stats"]
    assert after["success"]["count"] - before["success"]["count"] == 3
    assert after["fail"]["count"] - before["fail"]["count"] == 1


def test_dlscale_bench_measures_it_unchanged(
    deployed: Deployed, ray_repo: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bench"
    command = [
        str(Path(sys.executable).parent / "dlscale"), "bench", f"http://{deployed.http_url}",
        "--model", "mlp", "--repo", str(ray_repo), "--scenario", "offline", "--duration", "1s",
        "--accuracy", "--out", str(out), "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((out / "report.json").read_text())["scenarios"][0]["result"]
    assert result["completed"] > 0 and result["errors"]["count"] == 0
    assert result["accuracy"] is not None


# -- streams: REST generate_stream through the router (docs/generative.md) ----------------

#: Long enough for a stream on a loaded machine; a hang fails instead of blocking forever.
PATIENCE_S = 60.0


def _url(deployed: Deployed, route: str) -> str:
    return f"http://{deployed.http_url}/v2/models/ticker/{route}"


def _ticks(deployed: Deployed, count: int, into: list[Any]) -> None:
    body = {"COUNT": count}
    with httpx.stream(
        "POST", _url(deployed, "generate_stream"), json=body, timeout=PATIENCE_S
    ) as r:
        into.append([json.loads(x[5:])["TICK"] for x in r.iter_lines() if x.startswith("data:")])


def test_generate_stream_through_the_router(deployed: Deployed) -> None:
    got: list[Any] = []
    _ticks(deployed, 3, got)
    assert got == [[0, 1, 2]]


def test_a_disconnect_behind_the_router_frees_the_replicas_slot(deployed: Deployed) -> None:
    got: list[Any] = []
    held = httpx.stream("POST", _url(deployed, "generate_stream"), json={"COUNT": -1}, timeout=60)
    with held as response:
        lines = response.iter_lines()
        assert next(x for x in lines if x.startswith("data:"))
        waiting = threading.Thread(target=_ticks, args=(deployed, 2, got))
        waiting.start()
    # The ticker takes one sequence at a time: the second finishes only once the first is gone.
    waiting.join(PATIENCE_S)
    assert got == [[0, 1]]
