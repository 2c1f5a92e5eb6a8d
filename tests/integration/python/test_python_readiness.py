"""A Triton Python model's own readiness (`is_ready`), asked by tritonclient over REST and gRPC
as Triton's python backend asks it: sync or async, in a worker process or in the server's, its
answer deciding the model's readiness and, under strict readiness, the server's; a raise or an
answer that is not a bool says not ready; a call slower than five seconds says not ready and is
not called again while it runs."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tests.toolkit.python_models import readiness_model, triton_config, write_triton_python_model
from tests.toolkit.server import LocalServer, serving
from tests.toolkit.waiting import until

#: The models: is_ready in a worker process (Triton's default), and `async def` in the server's.
MODELS = {"ready_worker": ("process", False), "ready_inline": ("thread", True)}
X = np.ones((1, 4), np.float32)
#: A model without is_ready in a worker process that will not start again once told so (a file
#: `refuse` beside it); it answers with its worker's pid.
NO_RESTART = """
import os
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        if (Path(args["model_repository"]) / "refuse").exists():
            raise RuntimeError("told not to start again")

    def execute(self, requests):
        pid = np.full((1, 4), os.getpid(), np.float32)
        outputs = [pb_utils.Tensor("OUTPUT0", pid), pb_utils.Tensor("OUTPUT1", pid)]
        return [pb_utils.InferenceResponse(output_tensors=outputs) for _ in requests]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readiness_repo")
    for name, (isolation, asynchronous) in MODELS.items():
        config = triton_config(name, isolation=isolation)
        folder = write_triton_python_model(root, name, readiness_model(asynchronous), config)
        (folder / "readiness").write_text("yes")
    write_triton_python_model(root, "no_restart", NO_RESTART, triton_config("no_restart"))
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo) as running:
        yield running


@pytest.fixture(scope="module")
def http(server: LocalServer) -> Iterator[th.InferenceServerClient]:
    client = th.InferenceServerClient(server.http_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server: LocalServer) -> Iterator[tg.InferenceServerClient]:
    client = tg.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture(params=list(MODELS))
def model(request: pytest.FixtureRequest, repo: Path) -> Iterator[str]:
    name = str(request.param)
    yield name
    _answer(repo, name, "yes")


def _answer(repo: Path, model: str, said: str) -> None:
    (repo / model / "readiness").write_text(said)


def _asked(repo: Path, model: str) -> int:
    asked = repo / model / "asked"
    return len(asked.read_text().splitlines()) if asked.exists() else 0


def _server_ready(server: LocalServer) -> httpx.Response:
    return httpx.get(f"http://{server.http_url}/v2/health/ready", timeout=30)


def _answer_of(http: th.InferenceServerClient, model: str) -> np.ndarray:
    inputs = [th.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(X)
    return np.asarray(http.infer(model, inputs).as_numpy("OUTPUT0"))


def _infers(http: th.InferenceServerClient, model: str) -> bool:
    return bool(np.array_equal(_answer_of(http, model), 2 * X))


def test_is_ready_decides_the_models_readiness_and_the_servers(
    model: str,
    repo: Path,
    server: LocalServer,
    http: th.InferenceServerClient,
    grpc: tg.InferenceServerClient,
) -> None:
    assert http.is_model_ready(model) and grpc.is_model_ready(model)
    assert _server_ready(server).status_code == 200
    _answer(repo, model, "no")
    assert not http.is_model_ready(model) and not grpc.is_model_ready(model)
    assert not http.is_server_ready() and not grpc.is_server_ready()  # strict readiness
    said = _server_ready(server)
    assert said.status_code == 503 and f"model {model!r} says it cannot serve" in said.text
    asked = httpx.get(f"http://{server.http_url}/v2/models/{model}/ready", timeout=30)
    assert asked.status_code == 503 and "is loaded but says it cannot serve" in asked.text
    assert _infers(http, model)  # as in Triton, readiness is told, not enforced on requests
    _answer(repo, model, "yes")
    assert http.is_model_ready(model) and grpc.is_model_ready(model)
    assert _server_ready(server).status_code == 200


@pytest.mark.parametrize(
    ("said", "logged"),
    [("raise", "the feature store is unreachable"), ("maybe", "expected True or False")],
)
def test_an_is_ready_that_raises_or_answers_no_bool_says_not_ready(
    model: str,
    said: str,
    logged: str,
    repo: Path,
    http: th.InferenceServerClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _answer(repo, model, said)
    assert not http.is_model_ready(model)
    assert logged in caplog.text  # with the traceback of a raise, in the server's log
    assert _infers(http, model) and http.is_server_live()


def test_a_hung_is_ready_says_not_ready_and_is_not_called_again_while_it_runs(
    repo: Path, server: LocalServer, http: th.InferenceServerClient
) -> None:
    model = "ready_worker"
    _answer(repo, model, "hang")
    before = _asked(repo, model)
    answers: list[bool] = []

    def check() -> None:
        with th.InferenceServerClient(server.http_url) as own:  # a client per thread
            answers.append(own.is_model_ready(model))

    threads = [threading.Thread(target=check) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Each check waited its five seconds for the one call under way: not ready, one call.
    assert answers == [False, False] and _asked(repo, model) == before + 1
    assert _infers(http, model)  # its batches ran beside the hung call
    _answer(repo, model, "yes")
    (repo / model / "release").touch()
    until(lambda: http.is_model_ready(model))  # the hung call answers at last
    asked = _asked(repo, model)
    assert http.is_model_ready(model) and _asked(repo, model) == asked + 1  # then a new call


def test_a_worker_model_without_is_ready_is_not_ready_while_no_worker_runs(
    repo: Path, http: th.InferenceServerClient, grpc: tg.InferenceServerClient
) -> None:
    # Last in the module: the model stays without a worker.
    pid = int(_answer_of(http, "no_restart")[0, 0])
    assert pid != os.getpid() and http.is_model_ready("no_restart")
    (repo / "no_restart" / "refuse").touch()
    os.kill(pid, signal.SIGKILL)  # and its restart fails: no worker runs it
    until(lambda: not http.is_model_ready("no_restart"))
    assert not grpc.is_model_ready("no_restart")
