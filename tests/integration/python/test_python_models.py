"""User Python models with tritonclient over REST and gRPC, as against Triton: Triton's model.py
(pb_utils, BLS) from a config.pbtxt repository, dlscale's own `Model` API, in the server process
and in worker processes; user-code errors, a killed worker, malformed inputs."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tests.toolkit.python_models import python_repository
from tests.toolkit.server import LocalServer, serving
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from dlscale.backends.python import triton_python_backend_utils as pb_utils

A = np.arange(8, dtype=np.float32).reshape(2, 4)
B = np.ones((2, 4), np.float32)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return python_repository(tmp_path_factory.mktemp("python_repo"))


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo) as running:
        yield running


def infer_input(name: str, array: np.ndarray, module: Any) -> Any:
    """A tritonclient input (of `module`: tritonclient.http or .grpc) holding `array`."""
    inp = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    inp.set_data_from_numpy(array)
    return inp


def _pair(module: Any, a: np.ndarray, b: np.ndarray) -> list[Any]:
    return [infer_input("INPUT0", a, module), infer_input("INPUT1", b, module)]


def test_a_triton_python_model_answers_over_both_protocols(
    http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    for model in ("add_sub", "add_sub_inline"):
        over_http = http.infer(model, _pair(th, A, B))
        np.testing.assert_array_equal(over_http.as_numpy("OUTPUT0"), A + B)
        np.testing.assert_array_equal(over_http.as_numpy("OUTPUT1"), A - B)
        over_grpc = grpc.infer(model, _pair(tg, A, B))
        np.testing.assert_array_equal(over_grpc.as_numpy("OUTPUT0"), A + B)
    index = {m["name"]: m["state"] for m in http.get_model_repository_index()}
    assert set(index.values()) == {"READY"}, index
    metadata = http.get_model_metadata("add_sub")
    assert metadata["platform"] == "python"
    assert grpc.get_model_config("add_sub").config.backend == "python"


def test_bls_calls_another_model_of_the_same_server(
    http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    before = http.get_inference_statistics("add_sub")["model_stats"][0]["inference_count"]
    np.testing.assert_array_equal(
        http.infer("bls", _pair(th, A, B)).as_numpy("OUTPUT0"), 2 * (A + B)
    )
    np.testing.assert_array_equal(
        grpc.infer("a_bls", _pair(tg, A, B)).as_numpy("OUTPUT0"), 2 * (A + B)
    )
    # The calls went through add_sub's own batcher: its statistics counted them.
    after = http.get_inference_statistics("add_sub")["model_stats"][0]["inference_count"]
    assert after == before + 2 * len(A)


def test_requests_batched_together_are_answered_each_its_own(
    http: th.InferenceServerClient,
) -> None:
    rng = np.random.default_rng(3)
    sent = [rng.standard_normal((1 + i % 3, 4)).astype(np.float32) for i in range(8)]
    pending = [http.async_infer("add_sub", _pair(th, x, x)) for x in sent]
    for x, waiting in zip(sent, pending, strict=True):
        np.testing.assert_allclose(waiting.get_result().as_numpy("OUTPUT0"), 2 * x)


def test_an_error_response_fails_only_its_own_request(
    http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    bad = A.copy()
    bad[0, 0] = np.nan
    for model in ("add_sub", "add_sub_inline"):
        good = [http.async_infer(model, _pair(th, A, B)) for _ in range(3)]
        refused = http.async_infer(model, _pair(th, bad, B))
        with pytest.raises(InferenceServerException) as caught:
            refused.get_result()
        assert caught.value.status() == "400"
        assert "INPUT0 holds NaN" in str(caught.value)
        for waiting in good:
            np.testing.assert_array_equal(waiting.get_result().as_numpy("OUTPUT0"), A + B)
    with pytest.raises(InferenceServerException) as over_grpc:
        grpc.infer("add_sub", _pair(tg, bad, B))
    assert over_grpc.value.status() == "StatusCode.INVALID_ARGUMENT"


#: TritonError code -> what Triton answers over HTTP and gRPC (shared/reference/oip.md).
TRITON_ANSWERS = {
    pb_utils.TritonError.UNKNOWN: ("400", "StatusCode.UNKNOWN"),
    pb_utils.TritonError.INTERNAL: ("500", "StatusCode.INTERNAL"),
    pb_utils.TritonError.NOT_FOUND: ("404", "StatusCode.NOT_FOUND"),
    pb_utils.TritonError.INVALID_ARG: ("400", "StatusCode.INVALID_ARGUMENT"),
    pb_utils.TritonError.UNAVAILABLE: ("503", "StatusCode.UNAVAILABLE"),
    pb_utils.TritonError.UNSUPPORTED: ("501", "StatusCode.UNIMPLEMENTED"),
    pb_utils.TritonError.ALREADY_EXISTS: ("400", "StatusCode.ALREADY_EXISTS"),
    pb_utils.TritonError.CANCELLED: ("400", "StatusCode.CANCELLED"),
}


@pytest.mark.parametrize("code", list(TRITON_ANSWERS))
def test_each_error_code_reaches_the_client_as_triton_answers_it(
    code: int, http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    sent = np.full((1, 4), code, np.float32)
    with pytest.raises(InferenceServerException) as over_http:
        http.infer("coded", _pair(th, sent, sent))
    with pytest.raises(InferenceServerException) as over_grpc:
        grpc.infer("coded", _pair(tg, sent, sent))
    got = (over_http.value.status(), over_grpc.value.status())
    assert got == TRITON_ANSWERS[code]
    assert "coded" in over_http.value.message() and "coded" in over_grpc.value.message()
    assert http.is_server_live() and http.is_model_ready("coded")


def test_malformed_inputs_are_refused_and_the_model_keeps_serving(
    http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    wide = np.zeros((1, 5), np.float32)
    with pytest.raises(InferenceServerException) as caught:
        http.infer("add_sub", _pair(th, wide, wide))
    assert caught.value.status() == "400"
    with pytest.raises(InferenceServerException) as missing:
        grpc.infer("add_sub", [infer_input("INPUT0", A, tg)])
    assert missing.value.status() == "StatusCode.INVALID_ARGUMENT"
    np.testing.assert_array_equal(http.infer("add_sub", _pair(th, A, B)).as_numpy("OUTPUT0"), A + B)


def test_an_exception_in_execute_fails_its_batch_with_the_traceback_in_the_log_only(
    http: th.InferenceServerClient, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.ERROR, logger="dlscale.python"),
        pytest.raises(InferenceServerException) as caught,
    ):
        http.infer("fragile", [infer_input("INPUT0", -B, th)])
    assert caught.value.status() == "500"
    message = str(caught.value)
    assert "ValueError: negative input is not allowed" in message
    assert "Traceback" not in message and "model.py" not in message
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "dlscale.python")
    assert "Traceback (most recent call last)" in logged
    assert 'raise ValueError("negative input is not allowed")' in logged
    answer = http.infer("fragile", [infer_input("INPUT0", B, th)])
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), B)


def test_dlscale_models_in_process_and_in_a_worker(
    http: th.InferenceServerClient,
    grpc: tg.InferenceServerClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for model in ("scale", "scale_worker"):
        np.testing.assert_array_equal(
            http.infer(model, [infer_input("x", A, th)]).as_numpy("y"), 3 * A
        )
        np.testing.assert_array_equal(
            grpc.infer(model, [infer_input("x", A, tg)]).as_numpy("y"), 3 * A
        )
        inf = np.full((1, 4), np.inf, np.float32)
        with (
            caplog.at_level(logging.ERROR, logger="dlscale.python"),
            pytest.raises(InferenceServerException) as caught,
        ):
            http.infer(model, [infer_input("x", inf, th)])
        assert caught.value.status() == "500"
        assert "RuntimeError: infinite input" in str(caught.value)
        assert "Traceback" not in str(caught.value)
    logged = [r.getMessage() for r in caplog.records if r.name == "dlscale.python"]
    assert sum("Traceback (most recent call last)" in m for m in logged) == 2


def test_a_killed_worker_fails_its_batch_and_is_restarted(
    repo: Path,
    http: th.InferenceServerClient,
    grpc: tg.InferenceServerClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = http.infer("fragile", [infer_input("INPUT0", B, th)]).as_numpy("OUTPUT1")
    pid = int(first[0, 0])
    assert pid != os.getpid()  # Triton models run in worker processes by default
    marker = repo / "fragile" / "sleeping"
    outcome: list[object] = []
    answered = threading.Event()

    def done(result: object, error: object) -> None:
        outcome.append(error)
        answered.set()

    with caplog.at_level(logging.WARNING, logger="dlscale.python"):
        slow = np.full((1, 4), 60000, np.float32)  # execute sleeps a minute
        grpc.async_infer("fragile", [infer_input("INPUT0", slow, tg)], done)
        for _ in range(600):  # until the worker is inside execute
            if marker.exists():
                break
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        assert answered.wait(timeout=60)
        again = http.infer("fragile", [infer_input("INPUT0", B, th)])
    error = outcome[0]
    assert isinstance(error, InferenceServerException)
    assert error.status() == "StatusCode.INTERNAL"
    assert "worker process died" in str(error)
    np.testing.assert_array_equal(again.as_numpy("OUTPUT0"), B)
    assert int(again.as_numpy("OUTPUT1")[0, 0]) != pid
    logged = [r.getMessage() for r in caplog.records if r.name == "dlscale.python"]
    assert any("restarted" in m for m in logged)


def test_a_load_request_may_not_upload_python_code(
    tmp_path: Path, http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    ran = tmp_path / "ran"
    model = "class Model:\n    def infer(self, inputs):\n        return inputs\n"
    code = f"open({str(ran)!r}, 'w').close()\n" + model
    config = {
        "name": "uploaded",
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
    }
    files = {"file:1/model.py": code.encode()}
    with pytest.raises(InferenceServerException) as caught:
        http.load_model("uploaded", config=json.dumps(config), files=files)
    assert caught.value.status() == "403"
    assert "may not upload ['1/model.py'] for backend 'python'" in str(caught.value)
    with pytest.raises(InferenceServerException) as over_grpc:
        grpc.load_model("uploaded", config=json.dumps(config), files=files)
    assert over_grpc.value.status() == "StatusCode.PERMISSION_DENIED"
    assert not ran.exists()
    assert not http.is_model_ready("uploaded")
