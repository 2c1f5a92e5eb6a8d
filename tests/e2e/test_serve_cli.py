"""`dlscale serve` started as a user starts it: ready, serving, metrics, and a clean SIGTERM."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tests.toolkit.cli import ServeProcess, served
from tests.toolkit.models import write_null_model
from tests.toolkit.repositories import BATCHED, NULL_TENSORS
from tritonclient.utils import InferenceServerException

#: How long the "held" model waits to fill a batch: the requests sent before SIGTERM are still
#: queued when it arrives, so they are in flight by construction.
HOLD_US = 4_000_000
#: Requests in flight at SIGTERM, per protocol.
IN_FLIGHT = 4


@pytest.fixture
def zoo_server(small_repo: Path) -> Iterator[ServeProcess]:
    with served(small_repo) as process:
        yield process


def _identity_input(rows: int, seed: int) -> tuple[httpclient.InferInput, np.ndarray]:
    data = np.random.default_rng(seed).random((rows, 16), dtype=np.float32)
    tensor = httpclient.InferInput("input", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=True)
    return tensor, data


def test_serve_answers_rest_grpc_and_metrics_then_stops_cleanly(
    zoo_server: ServeProcess,
) -> None:
    http = httpclient.InferenceServerClient(zoo_server.http_url)
    tensor, data = _identity_input(3, 0)
    assert np.array_equal(http.infer("identity", [tensor]).as_numpy("output"), data)

    grpc = grpcclient.InferenceServerClient(zoo_server.grpc_url)
    g = grpcclient.InferInput("input", [2, 16], "FP32")
    g.set_data_from_numpy(data[:2])
    assert np.array_equal(grpc.infer("identity", [g]).as_numpy("output"), data[:2])
    assert grpc.is_model_ready("digits")

    identity = {"model": "identity", "version": "1"}
    assert zoo_server.metric("nv_inference_request_success", identity) == 2
    assert zoo_server.metric("dlscale_batch_size_count", identity) == 2
    assert 0 <= zoo_server.metric("nv_cpu_utilization", {}) <= 1

    for model in ("identity", "mlp", "digits"):
        assert f"model {model}: READY" in zoo_server.log()

    zoo_server.proc.send_signal(signal.SIGTERM)
    assert zoo_server.proc.wait(timeout=60) == 0
    assert "stopping: finishing requests in flight" in zoo_server.log()
    assert "model identity: UNAVAILABLE (unloaded)" in zoo_server.log()


# -- SIGTERM with requests in flight ---------------------------------------------------------------


@pytest.fixture
def held_repo(tmp_path: Path) -> Path:
    """One echo model that holds a request up to HOLD_US for company (FP32 [batch, 4])."""
    config = BATCHED.format(max_batch=64, delay=HOLD_US) + "adaptive_queue_delay = false\n"
    write_null_model(tmp_path, "held", config + NULL_TENSORS.format(
        inp="x", out="y", width=4, out_width=4))  # fmt: skip
    return tmp_path


def _rows(n: int) -> np.ndarray:
    return np.full((1, 4), float(n), np.float32)


def _rest(url: str, n: int) -> np.ndarray:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(_rows(n), binary_data=True)
    return client.infer("held", [tensor]).as_numpy("y")


def _grpc(url: str, n: int) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    tensor = grpcclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(_rows(n))
    return client.infer("held", [tensor], client_timeout=60).as_numpy("y")


def _refused(call: Callable[[str, int], np.ndarray], url: str, n: int) -> str:
    """How a request sent after SIGTERM was refused; fails the test if it was answered."""
    try:
        answer = call(url, n)
    except InferenceServerException as exc:
        return f"{exc.status()}: {exc.message()}"
    except OSError as exc:  # the listening socket is closed: the connection itself is refused
        return f"no connection ({type(exc).__name__})"
    raise AssertionError(f"a request sent after SIGTERM was answered: {answer}")


def test_sigterm_answers_requests_in_flight_and_refuses_new_ones(held_repo: Path) -> None:
    with served(held_repo) as server, ThreadPoolExecutor(2 * IN_FLIGHT) as pool:
        rest = [pool.submit(_rest, server.http_url, n) for n in range(IN_FLIGHT)]
        grpc = [pool.submit(_grpc, server.grpc_url, 100 + n) for n in range(IN_FLIGHT)]
        pending = ("nv_inference_pending_request_count", {"model": "held", "version": "1"})
        server.wait_until(lambda: server.metric(*pending) == 2 * IN_FLIGHT)
        server.proc.send_signal(signal.SIGTERM)
        server.wait_for("stopping: finishing requests in flight")
        ended = [f.exception() or f.result() for f in rest + grpc if f.done()]
        assert not ended, f"requests in flight ended before their batch was due: {ended}"

        # New requests are refused (503 or UNAVAILABLE, or no connection at all) ...
        refusals = [_refused(_rest, server.http_url, 200 + n) for n in range(3)]
        refusals += [_refused(_grpc, server.grpc_url, 300 + n) for n in range(3)]
        for reason in refusals:
            assert reason.startswith(("503", "StatusCode.UNAVAILABLE", "no connection")), reason
        # ... while each request in flight gets its own answer.
        for n, future in enumerate(rest):
            np.testing.assert_array_equal(future.result(timeout=60), _rows(n))
        for n, future in enumerate(grpc):
            np.testing.assert_array_equal(future.result(timeout=60), _rows(100 + n))
        assert server.proc.wait(timeout=60) == 0
    assert "model held: UNAVAILABLE (unloaded)" in server.log()
