"""Readiness a Kubernetes probe can trust, and a shutdown that answers what it cuts.

Live as soon as the ports are open, while models load; ready (strictly, as Triton) only while
every model the server should serve is READY; requests still running at the end of the grace
get 503 / UNAVAILABLE rather than a closed connection.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tests.toolkit.models import write_broken, write_null_model
from tests.toolkit.server import LocalServer, serving, settings_for
from tritonclient.utils import InferenceServerException

ECHO = (
    '[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [2]\n'
    '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [2]\n'
)
#: A model whose warm-up (one batch, unbatched) takes this long: loading it is slow.
SLOW_LOAD_US = 3_000_000


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lifecycle")
    write_null_model(root, "echo", "max_batch_size = 4\n" + ECHO)
    write_null_model(
        root,
        "slow_load",
        f"max_batch_size = 0\n[backend_options]\ndelay_us = {SLOW_LOAD_US}\n" + ECHO,
    )
    # A request waits a minute for company here: long enough to outlast any grace below.
    write_null_model(
        root,
        "lingering",
        "max_batch_size = 8\n[batching]\nmax_queue_delay_us = 60000000\n"
        "adaptive_queue_delay = false\n" + ECHO,
    )
    return root


@pytest.fixture(scope="module")
def broken_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lifecycle_broken")
    write_null_model(root, "echo", "max_batch_size = 4\n" + ECHO)
    write_broken(root)
    return root


def _index(server: LocalServer) -> dict[str, dict[str, str]]:
    client = triton_http.InferenceServerClient(server.http_url)
    try:
        return {row["name"]: row for row in client.get_model_repository_index()}
    finally:
        client.close()


def _eventually(check: Callable[[], bool], what: str) -> None:
    for _ in range(600):
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"never: {what}")


def test_live_while_the_models_load_ready_once_they_are(repo: Path) -> None:
    # A liveness probe must not kill a pod that is only loading: every port refused before.
    server = LocalServer(settings_for(repo, load_models=("slow_load",)))
    server.start(wait_loaded=False)
    try:
        http = triton_http.InferenceServerClient(server.http_url)
        rpc = triton_grpc.InferenceServerClient(server.grpc_url)
        assert http.is_server_live() and rpc.is_server_live()
        assert not http.is_server_ready() and not rpc.is_server_ready()
        assert _index(server)["slow_load"]["state"] == "LOADING"
        with pytest.raises(InferenceServerException, match="LOADING") as caught:
            http.get_model_metadata("slow_load")
        assert caught.value.status() == "503"
        server.run(server.server.wait_loaded())
        assert http.is_server_ready() and rpc.is_server_ready()
        assert _index(server)["slow_load"]["state"] == "READY"
        http.close()
        rpc.close()
    finally:
        server.stop()


def test_a_model_that_failed_to_load_keeps_the_server_not_ready(
    broken_repo: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR), serving(broken_repo) as server:
        client = triton_http.InferenceServerClient(server.http_url)
        assert client.is_server_live() and not client.is_server_ready()
        assert client.is_model_ready("echo")  # the others serve
        broken = _index(server)["broken"]
        assert broken["state"] == "UNAVAILABLE" and "max_batch_size" in broken["reason"]
        client.unload_model("broken")  # no longer asked for: the server is ready again
        assert client.is_server_ready()
        client.close()
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any("broken" in r.getMessage() and "max_batch_size" in r.getMessage() for r in failures)


def test_without_strict_readiness_a_failed_model_leaves_the_server_ready(
    broken_repo: Path,
) -> None:
    with serving(broken_repo, strict_readiness=False) as server:
        client = triton_grpc.InferenceServerClient(server.grpc_url)
        assert client.is_server_ready()
        client.close()


def test_loading_another_model_keeps_the_server_ready(repo: Path) -> None:
    with serving(repo, load_models=("echo",)) as server:
        client = triton_http.InferenceServerClient(server.http_url)
        assert client.is_server_ready()
        loader = threading.Thread(
            target=lambda: server.run(server.dataplane.load_model("slow_load"))
        )
        loader.start()
        _eventually(lambda: _index(server)["slow_load"]["state"] == "LOADING", "loading")
        assert client.is_server_ready()  # while the loaded ones serve
        loader.join(60)
        assert _index(server)["slow_load"]["state"] == "READY" and client.is_server_ready()
        client.close()


def test_exit_on_error_stops_dlscale_serve(broken_repo: Path) -> None:
    command = [
        sys.executable, "-m", "dlscale", "serve", str(broken_repo), "--exit-on-error",
        "--http-port", "0", "--grpc-port", "0", "--metrics-port", "-1",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "broken" in done.stderr and "exit_on_error" in done.stderr


def _wait_queued(server: LocalServer, model: str) -> None:
    stats = server.dataplane.manager.get(model).stats
    _eventually(lambda: stats.pending >= 1, f"a request queued for {model}")


def test_requests_cut_at_the_grace_get_503_over_rest(repo: Path) -> None:
    server = LocalServer(settings_for(repo, load_models=("lingering",), grace_s=0.5))
    server.start()
    outcome: list[BaseException] = []

    def call() -> None:
        client = triton_http.InferenceServerClient(server.http_url, network_timeout=120)
        x = triton_http.InferInput("x", [1, 2], "FP32")
        x.set_data_from_numpy(np.ones((1, 2), np.float32))
        try:
            client.infer("lingering", [x])
        except InferenceServerException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    _wait_queued(server, "lingering")
    server.stop()
    caller.join(60)
    assert len(outcome) == 1
    error = outcome[0]
    assert isinstance(error, InferenceServerException) and error.status() == "503"
    assert "after a grace of 0.5 s" in str(error)


def test_requests_cut_at_the_grace_get_unavailable_over_grpc(repo: Path) -> None:
    server = LocalServer(settings_for(repo, load_models=("lingering",), grace_s=0.5))
    server.start()
    outcome: list[str] = []

    def call() -> None:
        client = triton_grpc.InferenceServerClient(server.grpc_url)
        x = triton_grpc.InferInput("x", [1, 2], "FP32")
        x.set_data_from_numpy(np.ones((1, 2), np.float32))
        try:
            client.infer("lingering", [x], client_timeout=120)
        except InferenceServerException as exc:
            outcome.append(exc.status())

    caller = threading.Thread(target=call)
    caller.start()
    _wait_queued(server, "lingering")
    server.stop()
    caller.join(60)
    assert outcome == ["StatusCode.UNAVAILABLE"]
