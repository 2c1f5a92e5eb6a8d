"""`dlscale serve` started as a user starts it: ready, serving, metrics, and a clean SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

LISTEN = re.compile(r"(http|grpc|metrics) listening on 127\.0\.0\.1:(\d+)")


class ServeProcess:
    """A `dlscale serve` child process whose log is read line by line as it runs."""

    def __init__(self, repo: Path) -> None:
        # The console script pip installed, as a user runs it.
        command = [
            str(Path(sys.executable).parent / "dlscale"), "serve", str(repo),
            "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.lines: list[str] = []
        self.ports: dict[str, int] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            found = LISTEN.search(line)
            if found:
                self.ports[found.group(1)] = int(found.group(2))

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("dlscale serve exited:\n" + "\n".join(self.lines))
            if {"http", "grpc", "metrics"} <= set(self.ports):
                client = httpclient.InferenceServerClient(f"127.0.0.1:{self.ports['http']}")
                if client.is_server_ready():
                    return
            time.sleep(0.2)
        raise AssertionError("not ready in time:\n" + "\n".join(self.lines))

    def log(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def served(small_repo: Path) -> Iterator[ServeProcess]:
    process = ServeProcess(small_repo)
    try:
        process.wait_ready()
        yield process
    finally:
        if process.proc.poll() is None:
            process.proc.kill()
            process.proc.wait()


def _identity_input(rows: int, seed: int) -> tuple[httpclient.InferInput, np.ndarray]:
    data = np.random.default_rng(seed).random((rows, 16), dtype=np.float32)
    tensor = httpclient.InferInput("input", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=True)
    return tensor, data


def test_serve_answers_rest_grpc_and_metrics_then_stops_cleanly(served: ServeProcess) -> None:
    http = httpclient.InferenceServerClient(f"127.0.0.1:{served.ports['http']}")
    tensor, data = _identity_input(3, 0)
    assert np.array_equal(http.infer("identity", [tensor]).as_numpy("output"), data)

    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{served.ports['grpc']}")
    g = grpcclient.InferInput("input", [2, 16], "FP32")
    g.set_data_from_numpy(data[:2])
    assert np.array_equal(grpc.infer("identity", [g]).as_numpy("output"), data[:2])
    assert grpc.is_model_ready("digits")

    url = f"http://127.0.0.1:{served.ports['metrics']}/metrics"
    metrics = urllib.request.urlopen(url, timeout=10).read().decode()
    assert 'nv_inference_request_success{model="identity",version="1"} 2.0' in metrics
    assert "nv_cpu_utilization" in metrics
    assert 'dlscale_batch_size_bucket{le="+Inf",model="identity",version="1"}' in metrics

    for model in ("identity", "mlp", "digits"):
        assert f"model {model}: READY" in served.log()

    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(timeout=60) == 0
    assert "stopping: finishing requests in flight" in served.log()
    assert "model identity: UNAVAILABLE (unloaded)" in served.log()


def test_sigterm_lets_requests_in_flight_finish(served: ServeProcess) -> None:
    port = served.ports["http"]
    started = threading.Event()

    def one(seed: int) -> str:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
        tensor, data = _identity_input(8, seed)
        started.set()
        try:
            result = client.infer("identity", [tensor]).as_numpy("output")
        except Exception as exc:  # refused after shutdown began: acceptable, never wrong data
            return f"refused: {exc}"
        assert np.array_equal(result, data), "a response carried another request's data"
        return "ok"

    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(one, seed) for seed in range(400)]
        started.wait(30)
        served.proc.send_signal(signal.SIGTERM)
        outcomes = [f.result() for f in futures]
    assert served.proc.wait(timeout=60) == 0
    assert outcomes.count("ok") > 0
    assert all(o == "ok" or o.startswith("refused") for o in outcomes)
