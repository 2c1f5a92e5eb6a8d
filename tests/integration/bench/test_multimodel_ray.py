"""The Ray Serve peer of benchmarks/multimodel_ray.py (benchmarks/harness/multiplex_app.py), run
as the benchmark runs it, on a real local Ray cluster of its own: it answers each model id with
that model's own outputs (ONNX Runtime in this process on the same file), holds at most its cap
of models, the least recently used evicted, and answers bad requests with a 4xx, so the
benchmark's peer is a fair, working one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from tests.toolkit.benchmarks import ROOT
from tests.toolkit.models import Mlp, save_onnx
from tests.toolkit.server import free_port
from tests.toolkit.slow import slow_only

pytestmark = [
    pytest.mark.slow,
    slow_only("a Ray cluster and Serve started for the peer, about a minute on 2 cores"),
]

#: Three models of one shape and different weights: an answer from the wrong one shows.
MODELS = {f"m{i}": Mlp.seeded(i, (16, 32, 4)) for i in range(3)}
CAP = 2
HEADER = "serve_multiplexed_model_id"
X = np.random.default_rng(5).standard_normal((2, 16)).astype(np.float32)
BODY = {"inputs": [{"name": "x", "shape": [2, 16], "datatype": "FP32", "data": X.ravel().tolist()}]}
#: A net for Ray's start on a busy machine, not a claim.
START_S = 400


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """REPO/<name>/1/model.onnx for each model, as the benchmark's copies lie."""
    root = tmp_path_factory.mktemp("multiplex-repo")
    for name, mlp in MODELS.items():
        save_onnx(mlp.graph(), root / name / "1" / "model.onnx")
    return root


@pytest.fixture(scope="module")
def peer(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """The peer with a cap of 2 models, in a process (and Ray cluster) of its own."""
    pytest.importorskip("ray", reason="the peer is a Ray Serve application (ray[serve])")
    port = free_port()
    argv = ["-m", "benchmarks.harness.multiplex_app", "--repo", str(repo), "--port", str(port),
            "--max-models", str(CAP)]  # fmt: skip
    paths = [str(ROOT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    log = tmp_path_factory.mktemp("multiplex-log") / "peer.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, *argv], cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            _wait_serving(client, proc, log)
            yield client
    finally:
        _stop(proc)


def _wait_serving(client: httpx.Client, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if client.post("/v2/repository/index", json={}).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"the peer did not serve (exit {proc.poll()}):\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the peer shuts Serve and its own Ray cluster down), then its group is killed."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def infer(client: httpx.Client, model: str, body: object = BODY) -> httpx.Response:
    return client.post(f"/v2/models/{model}/infer", json=body, headers={HEADER: model})


def ready(client: httpx.Client) -> set[str]:
    rows = client.post("/v2/repository/index", json={}).json()
    assert {r["name"] for r in rows} == set(MODELS)
    return {r["name"] for r in rows if r["state"] == "READY"}


def in_process(repo: Path, name: str) -> np.ndarray:
    """The model's output from ONNX Runtime in this process, on the peer's file."""
    session = ort.InferenceSession(str(repo / name / "1" / "model.onnx"))
    return np.asarray(session.run(["y"], {"x": X})[0])


def test_each_model_id_is_answered_by_its_own_model(peer: httpx.Client, repo: Path) -> None:
    answers = {}
    for name in MODELS:
        answer = infer(peer, name)
        assert answer.status_code == 200, answer.text
        (out,) = answer.json()["outputs"]
        assert (out["name"], out["shape"], out["datatype"]) == ("y", [2, 4], "FP32")
        answers[name] = np.asarray(out["data"], dtype=np.float32).reshape(2, 4)
        np.testing.assert_allclose(answers[name], in_process(repo, name), rtol=1e-5, atol=1e-5)
    # The models differ, so the answers above came from the model each id names.
    assert not np.allclose(answers["m0"], answers["m1"])
    assert not np.allclose(answers["m1"], answers["m2"])


def test_the_peer_holds_its_cap_and_evicts_the_least_recently_used(peer: httpx.Client) -> None:
    for name in ("m0", "m1", "m2"):
        assert infer(peer, name).status_code == 200
    assert ready(peer) == {"m1", "m2"}  # m0 went: the cap is 2
    assert infer(peer, "m1").status_code == 200  # m1 used last: m2 is now the oldest
    assert infer(peer, "m0").status_code == 200
    assert ready(peer) == {"m1", "m0"}


def test_bad_requests_get_a_4xx_and_the_peer_keeps_serving(peer: httpx.Client) -> None:
    headerless = peer.post("/v2/models/m0/infer", json=BODY)
    assert headerless.status_code == 400 and HEADER in headerless.json()["error"]
    unknown = infer(peer, "nope")
    assert unknown.status_code == 404 and "'nope'" in unknown.json()["error"]
    garbled = peer.post("/v2/models/m0/infer", content=b"{", headers={HEADER: "m0"})
    assert garbled.status_code == 400
    wrong = json.loads(json.dumps(BODY))
    wrong["inputs"][0]["name"] = "z"
    misnamed = infer(peer, "m0", wrong)
    assert misnamed.status_code == 400 and "'m0'" in misnamed.json()["error"]
    assert infer(peer, "m0").status_code == 200
