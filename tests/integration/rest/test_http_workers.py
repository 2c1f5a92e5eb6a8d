"""`--http-workers`: REST in worker processes on one port, answered by the model process.

Real servers on 127.0.0.1 port 0 with two workers, the real tritonclient; fresh connections land
on either worker (SO_REUSEPORT), and each answer is checked against its own request.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import httpx
import numpy as np
import pytest
import tritonclient.http as th
from tests.toolkit.models import write_null_model
from tests.toolkit.repositories import BATCHED, NULL_TENSORS, rest_repository
from tests.toolkit.server import LocalServer, serving
from tests.toolkit.waiting import process_gone
from tritonclient.utils import InferenceServerException

from dlscale.frontends.workers.pool import HttpWorkers
from dlscale.serving.regions.registry import RegionKind
from dlscale.serving.regions.system import SHM_DIR

WORKERS = 2
IMAGES = BATCHED.format(max_batch=32, delay=0) + NULL_TENSORS.format(
    inp="input", out="output", width="3, 224, 224", out_width="3, 224, 224"
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = rest_repository(tmp_path_factory.mktemp("workers"))
    write_null_model(root, "echo", IMAGES)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo, http_workers=WORKERS, max_body_bytes=64 * 2**20) as running:
        yield running


def _workers(server: LocalServer) -> HttpWorkers:
    return cast(HttpWorkers, server.server.frontends["http"])


def _input(name: str, array: np.ndarray, datatype: str, binary: bool = True) -> th.InferInput:
    tensor = th.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def _infer_fresh(url: str, model: str, x: np.ndarray) -> np.ndarray:
    """One request on a new connection (so the kernel picks a worker for it)."""
    client = th.InferenceServerClient(url)
    try:
        return cast(
            np.ndarray, client.infer(model, [_input("input", x, "FP32")]).as_numpy("output")
        )
    finally:
        client.close()


def test_concurrent_requests_answered_by_every_worker(server: LocalServer) -> None:
    before = [w.host.answered for w in _workers(server).workers.values()]
    inputs = [np.full((2, 16), i, np.float32) + np.arange(16, dtype=np.float32) for i in range(40)]
    with ThreadPoolExecutor(8) as pool:
        outputs = list(pool.map(lambda x: _infer_fresh(server.http_url, "identity", x), inputs))
    for x, y in zip(inputs, outputs, strict=True):
        np.testing.assert_array_equal(y, x)
    after = [w.host.answered for w in _workers(server).workers.values()]
    served = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(served) == len(inputs)
    assert all(n > 0 for n in served), served  # 40 connections never all hash to one worker


def test_large_tensors_travel_in_shared_memory(server: LocalServer) -> None:
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((8, 3, 224, 224)).astype(np.float32) for _ in range(6)]
    with ThreadPoolExecutor(3) as pool:
        outputs = list(pool.map(lambda x: _infer_fresh(server.http_url, "echo", x), inputs))
    for x, y in zip(inputs, outputs, strict=True):
        np.testing.assert_array_equal(y, x)
    # The workers' body segments are in /dev/shm while the server runs.
    assert list(SHM_DIR.glob(f"{_workers(server).prefix}*"))


@pytest.mark.parametrize("binary", [False, True])
def test_bytes_tensors(server: LocalServer, binary: bool) -> None:
    client = th.InferenceServerClient(server.http_url)
    text = np.array([["héllo", ""], ["a b", "ok"]], dtype=object)
    result = client.infer(
        "strings",
        [_input("text", text, "BYTES", binary)],
        outputs=[th.InferRequestedOutput("echo", binary_data=binary)],
    )
    echoed = result.as_numpy("echo")
    decoded = [x.decode() if isinstance(x, bytes) else x for x in echoed.reshape(-1)]
    assert decoded == ["héllo", "", "a b", "ok"]


def test_priority_and_timeout_reach_the_batcher(server: LocalServer) -> None:
    client = th.InferenceServerClient(server.http_url)
    x = np.ones((1, 4), dtype=np.float32)
    with pytest.raises(InferenceServerException, match="priority 3 is out of range") as bad:
        client.infer("queued", [_input("input", x, "FP32")], priority=3)
    assert bad.value.status() == "400"
    # The "queued" model waits 300 ms for more rows: a 1 us timeout expires in the queue.
    with pytest.raises(InferenceServerException, match="timed out in the queue") as caught:
        client.infer("queued", [_input("input", x, "FP32")], timeout=1)
    assert caught.value.status() == "503"
    out = client.infer("queued", [_input("input", x, "FP32")], priority=1)
    np.testing.assert_array_equal(out.as_numpy("output"), x)


def test_bad_input_is_4xx(server: LocalServer) -> None:
    url = f"http://{server.http_url}"
    with httpx.Client(base_url=url) as http:
        assert http.post("/v2/models/identity/infer", content=b"{not json").status_code == 400
        wrong = {
            "inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]
        }
        r = http.post("/v2/models/identity/infer", json=wrong)
        assert r.status_code == 400, r.text
        assert http.post("/v2/models/nope/infer", json=wrong).status_code == 404


def test_every_worker_reports_the_same_state(server: LocalServer) -> None:
    _infer_fresh(server.http_url, "identity", np.zeros((1, 16), np.float32))
    seen = set()
    for _ in range(12):  # fresh connections: both workers answer some
        with httpx.Client(base_url=f"http://{server.http_url}") as http:
            stats = http.get("/v2/models/identity/stats").json()
            index = http.post("/v2/repository/index").json()
            meta = http.get("/v2/models/identity").json()
            ready = http.get("/v2/health/ready").status_code
        success = stats["model_stats"][0]["inference_stats"]["success"]["count"]
        seen.add((success, len(index), meta["name"], ready))
    assert len(seen) == 1, seen
    assert (
        server.dataplane.statistics("identity")[0].inference_stats.success.count
        == next(iter(seen))[0]
    )


def test_client_regions_are_registered_in_the_owner(repo: Path) -> None:
    import tritonclient.utils.shared_memory as shm

    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    handle = shm.create_shared_memory_region("wk", f"/dlscale-test-wk-{os.getpid()}", 2 * x.nbytes)
    try:
        shm.set_shared_memory_region(handle, [x])
        with serving(repo, http_workers=WORKERS, allow_client_shm=True) as running:
            first = th.InferenceServerClient(running.http_url)
            first.register_system_shared_memory(
                "wk", f"/dlscale-test-wk-{os.getpid()}", 2 * x.nbytes
            )
            assert running.dataplane.shared_memory.users("wk") == 0  # known to the owner
            for _ in range(8):  # fresh connections: the region is one, whichever worker answers
                client = th.InferenceServerClient(running.http_url)
                assert [r["name"] for r in client.get_system_shared_memory_status()] == ["wk"]
                tensor = th.InferInput("input", list(x.shape), "FP32")
                tensor.set_shared_memory("wk", x.nbytes)
                out = th.InferRequestedOutput("output", binary_data=True)
                out.set_shared_memory("wk", x.nbytes, offset=x.nbytes)
                client.infer("identity", [tensor], outputs=[out])
                got = shm.get_contents_as_numpy(handle, np.float32, list(x.shape), offset=x.nbytes)
                np.testing.assert_array_equal(got, x)
                client.close()
            first.unregister_system_shared_memory("wk")
            assert running.dataplane.shared_memory.status(RegionKind.SYSTEM) == []
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_crashed_worker_is_replaced(repo: Path) -> None:
    with serving(repo, http_workers=WORKERS) as running:
        workers = _workers(running)
        victim = workers.workers[0]
        os.kill(victim.process.pid, signal.SIGKILL)
        victim.process.wait()  # its listening socket is closed: connections go to the other
        # The other worker keeps answering while the victim is replaced.
        x = np.ones((1, 16), np.float32)
        for _ in range(10):
            np.testing.assert_array_equal(_infer_fresh(running.http_url, "identity", x), x)
        while workers.workers[0] is victim or not workers.workers[0].host.listening.is_set():
            time.sleep(0.05)
        assert workers.restarts == 1
        for _ in range(10):
            np.testing.assert_array_equal(_infer_fresh(running.http_url, "identity", x), x)
        processes = [w.process for w in workers.workers.values()]
        prefix = workers.prefix
    assert all(p.poll() is not None for p in processes)
    assert not list(SHM_DIR.glob(f"{prefix}*"))


def test_stop_leaves_no_processes_or_segments(repo: Path) -> None:
    with serving(repo, http_workers=WORKERS, max_body_bytes=64 * 2**20) as running:
        x = np.ones((4, 3, 224, 224), np.float32)
        np.testing.assert_array_equal(_infer_fresh(running.http_url, "echo", x), x)
        workers = _workers(running)
        processes = [w.process for w in workers.workers.values()]
        assert list(SHM_DIR.glob(f"{workers.prefix}*"))
    assert [p.returncode for p in processes] == [0] * WORKERS
    assert not list(SHM_DIR.glob(f"{workers.prefix}*"))


@contextmanager
def _serving(root: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`dlscale serve --http-workers 2` as a user runs it; killed if the test left it running."""
    process, port = _serve(root)
    try:
        yield process, port
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _serve(root: Path) -> tuple[subprocess.Popen[str], int]:
    """`dlscale serve --http-workers 2`, and the port its log names once `echo` is ready."""
    command = [
        sys.executable, "-m", "dlscale", "serve", str(root), "--http-workers", str(WORKERS),
        "--http-port", "0", "--grpc-port", "-1", "--metrics-port", "-1", "--log-level", "INFO",
    ]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    for line in process.stderr:
        found = re.search(r"REST served by \d+ worker processes on port (\d+)", line)
        if found:
            threading.Thread(target=process.stderr.read, daemon=True).start()  # keep it drained
            port = int(found.group(1))
            url = f"http://127.0.0.1:{port}/v2/models/echo/ready"
            while httpx.get(url).status_code != 200:  # the ports open before the models load
                assert process.poll() is None
                time.sleep(0.1)
            return process, port
    raise AssertionError(f"dlscale serve exited with {process.wait()} before it served")


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_dlscale_serve_stops_its_workers_on_a_signal(repo: Path, sig: signal.Signals) -> None:
    with _serving(repo) as (process, port):
        workers = _children(process.pid)
        assert len(workers) == WORKERS
        x = np.ones((4, 3, 224, 224), np.float32)
        np.testing.assert_array_equal(_infer_fresh(f"127.0.0.1:{port}", "echo", x), x)
        assert list(SHM_DIR.glob(f"dlscale.{process.pid}.*"))  # a worker received into one
        process.send_signal(sig)
        assert process.wait(60) == 0
    assert all(process_gone(pid) for pid in workers)
    assert not list(SHM_DIR.glob(f"dlscale.{process.pid}.*"))


def test_workers_stop_when_the_model_process_dies(repo: Path) -> None:
    with _serving(repo) as (process, port):
        workers = _children(process.pid)
        x = np.ones((4, 3, 224, 224), np.float32)
        np.testing.assert_array_equal(_infer_fresh(f"127.0.0.1:{port}", "echo", x), x)
        process.kill()
        process.wait()
    for pid in workers:  # each sees its channel close (and SIGTERM from the kernel)
        while not process_gone(pid):
            time.sleep(0.05)
    # They removed their own segments on the way out.
    assert not list(SHM_DIR.glob(f"dlscale.{process.pid}.*"))
