"""A hostile client and misbehaving user code against Python models in worker processes
(issue 33), with a real server: the workers' segments cannot be registered as regions, outputs
are checked against the config, a raising batch fails its poison request alone, a leaking
worker is restarted, and a hung model unloads after its grace and loads again."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tests.toolkit.server import LocalServer, serving
from tests.toolkit.unsafe_models import unsafe_repository
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from dlscale.wire.segments import RESERVED_PREFIX, SHM_DIR

#: The unload grace of this module's server (--grace-s).
GRACE_S = 2.0
#: The victim's requests during the attack (each waits up to the model's 0.2 s batching delay).
REQUESTS = 40
#: Seconds of execute that means "for ever" to the fragile model (x / 1000).
FOREVER = 1e12


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unsafe_repository(tmp_path_factory.mktemp("unsafe_repo"))


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo, allow_client_shm=True, grace_s=GRACE_S) as running:
        yield running


def _input(module: Any, name: str, array: np.ndarray) -> Any:
    tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def _children() -> list[int]:
    """The processes this one started (the Python models' workers among them)."""
    me, found = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            found.append(int(stat.parent.name))
    return found


def _server_objects() -> set[str]:
    """Every shared-memory object the server's processes map, whatever its name, and those
    named with the server's prefix: what an attacker listing /dev/shm could find of it."""
    names = {p.name for p in SHM_DIR.glob(f"{RESERVED_PREFIX}{os.getpid()}.*")}
    for pid in _children():
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            path = line.split(maxsplit=5)[-1]
            if path.startswith(f"{SHM_DIR}/") and not path.endswith("(deleted)"):
                names.add(Path(path).name)
    return names


def test_no_segment_of_the_python_workers_can_be_registered(server: LocalServer) -> None:
    rng = np.random.default_rng(0)
    wrong: list[int] = []
    running = threading.Event()

    def victim() -> None:
        client = th.InferenceServerClient(server.http_url)
        try:
            for _ in range(REQUESTS):
                x = rng.random((2, 4), dtype=np.float32)  # x[0, 0] < 1: an honest request
                y = client.infer("wrong", [_input(th, "INPUT0", x)]).as_numpy("OUTPUT0")
                wrong.append(int(not np.array_equal(y, 2 * x)))
                running.set()
        finally:
            running.set()
            client.close()

    attacker = th.InferenceServerClient(server.http_url)
    thread = threading.Thread(target=victim)
    thread.start()
    tried = 0
    try:
        running.wait(60)
        while True:  # every object found, again and again while the victim's requests run
            for index, name in enumerate(sorted(_server_objects())):
                tried += 1
                with pytest.raises(InferenceServerException, match="server's own") as caught:
                    attacker.register_system_shared_memory(f"stolen{index}", f"/{name}", 64)
                assert caught.value.status() == "403"
            if not thread.is_alive():
                break
        # Under another name the object is the same: refused as the server's, not by its name.
        segment = sorted(SHM_DIR.glob(f"{RESERVED_PREFIX}{os.getpid()}.py*"))[0]
        alias = SHM_DIR / f"innocent-{os.getpid()}"
        os.rename(segment, alias)
        try:
            with pytest.raises(InferenceServerException, match="an object the server owns") as by:
                attacker.register_system_shared_memory("alias", f"/{alias.name}", 64)
            assert by.value.status() == "403"
        finally:
            os.rename(alias, segment)
        assert attacker.get_system_shared_memory_status() == []
    finally:
        thread.join()
        attacker.close()
    assert tried > 0, "the workers' segments were there to attack"
    assert len(wrong) == REQUESTS and sum(wrong) == 0


@pytest.mark.parametrize(
    ("mode", "problem"),
    [
        (1, r"has shape \[2, 3\]"),
        (2, "has 7 rows for a request of 2"),
        (3, "has datatype BYTES"),
        (5, "'SECRET' that is not declared"),
        (6, r"has shape \[2, 2097152\]"),
    ],
)
def test_an_output_that_breaks_the_config_fails_its_request_alone(
    http: th.InferenceServerClient, grpc: tg.InferenceServerClient, mode: int, problem: str
) -> None:
    bad = np.full((2, 4), mode, np.float32)
    good = np.full((1, 4), 0.5, np.float32)
    with ThreadPoolExecutor(2) as pool:  # batched together
        failing = pool.submit(http.infer, "wrong", [_input(th, "INPUT0", bad)])
        fine = pool.submit(grpc.infer, "wrong", [_input(tg, "INPUT0", good)])
        with pytest.raises(InferenceServerException, match=problem) as caught:
            failing.result(60)
        np.testing.assert_array_equal(fine.result(60).as_numpy("OUTPUT0"), 2 * good)
    assert caught.value.status() == "500"
    assert "model 'wrong' returned output" in str(caught.value)
    assert "FP32 [-1, 4]" in str(caught.value) or mode == 5  # what the config declares


def test_nan_outputs_are_numbers_and_pass(http: th.InferenceServerClient) -> None:
    x = np.full((2, 4), 4, np.float32)
    y = http.infer("wrong", [_input(th, "INPUT0", x)]).as_numpy("OUTPUT0")
    assert y is not None and y.shape == (2, 4) and np.isnan(y).all()


def test_a_batch_that_raises_fails_its_poison_request_alone(
    server: LocalServer, http: th.InferenceServerClient
) -> None:
    before = http.get_inference_statistics("fragile")["model_stats"][0]
    rows = [np.full((1, 4), v, np.float32) for v in (1.0, 2.0, -1.0, 3.0)]
    with ThreadPoolExecutor(len(rows)) as pool:  # within the model's 0.5 s batching delay
        outcomes = list(pool.map(lambda x: _fragile(server, x), rows))
    after = http.get_inference_statistics("fragile")["model_stats"][0]
    batches = int(after["execution_count"]) - int(before["execution_count"])
    assert batches < len(rows), "the requests were batched (the case under test)"
    for x, got in zip(rows, outcomes, strict=True):
        if x[0, 0] < 0:
            assert isinstance(got, str) and "negative input is not allowed" in got
        else:
            assert isinstance(got, np.ndarray)
            np.testing.assert_array_equal(got, x)


def _fragile(server: LocalServer, x: np.ndarray) -> np.ndarray | str:
    """fragile's OUTPUT0 for `x`, or the message of its error."""
    client = th.InferenceServerClient(server.http_url, network_timeout=120)
    try:
        return np.asarray(client.infer("fragile", [_input(th, "INPUT0", x)]).as_numpy("OUTPUT0"))
    except InferenceServerException as exc:
        return str(exc)
    finally:
        client.close()


def test_a_leaking_worker_is_restarted_and_the_model_keeps_serving(
    http: th.InferenceServerClient, caplog: pytest.LogCaptureFixture
) -> None:
    pids = set()
    with caplog.at_level(logging.WARNING, logger="dlscale.python"):
        for n in range(12):  # 64 MB kept per call, a bound of 300 MB
            x = np.full((1, 4), n, np.float32)
            answer = http.infer("leaky", [_input(th, "x", x)])
            np.testing.assert_array_equal(answer.as_numpy("y"), x)
            pids.add(int(answer.as_numpy("pid")[0, 0]))
    assert len(pids) >= 2, "the worker was replaced when it grew over its bound"
    assert any("over its bound of 300 MB" in r.getMessage() for r in caplog.records)


def test_a_hung_model_unloads_after_its_grace_and_loads_again(
    repo: Path, server: LocalServer, http: th.InferenceServerClient
) -> None:
    marker = repo / "fragile" / "sleeping"
    marker.unlink(missing_ok=True)
    http.load_model("fragile")  # a fresh worker, which has made no segment yet
    before = {p.name for p in SHM_DIR.glob(f"{RESERVED_PREFIX}{os.getpid()}.py*")}
    hung = np.full((1, 4), FOREVER, np.float32)
    ok = np.ones((1, 4), np.float32)
    http.infer("fragile", [_input(th, "INPUT0", ok)])  # each side has its segment now
    made = {p.name for p in SHM_DIR.glob(f"{RESERVED_PREFIX}{os.getpid()}.py*")} - before
    assert any(name.split(".")[2].endswith("w") for name in made), "the worker's own segment"
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(_fragile, server, hung)
        _wait_for(marker)
        queued = pool.submit(_fragile, server, ok)  # waits behind the hung batch
        batcher = server.server.manager.get("fragile").runner.batcher
        assert batcher is not None
        _wait_until(lambda: batcher.queued == 1)
        http.unload_model("fragile")  # answers once the grace is over
        assert "fragile" in str(running.result(60)) and "unloaded" in str(running.result(60))
        assert "unloaded" in str(queued.result(60))
    left = {p.name for p in SHM_DIR.glob(f"{RESERVED_PREFIX}{os.getpid()}.py*")}
    assert not (left - before), "the killed worker's segments are swept"
    http.load_model("fragile")
    answer = http.infer("fragile", [_input(th, "INPUT0", ok)])
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), ok)


def _wait_for(marker: Path) -> None:
    """Until the model touches `marker` (as its execute begins)."""
    _wait_until(marker.exists)


def _wait_until(condition: Callable[[], bool]) -> None:
    for _ in range(1200):  # a safety net only
        if condition():
            return
        threading.Event().wait(0.05)
    raise AssertionError("the server never came to the state the test waits for")
