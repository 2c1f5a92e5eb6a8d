"""Replicas on Ray Serve: scaled from 1 to 2, one killed under load, Ray's metrics export."""

from __future__ import annotations

import dataclasses
import re
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from tests.integration.scale.conftest import RAY_MISSING, Deployed, RayNodes
from tests.toolkit.models import write_null_model
from tests.toolkit.repositories import NULL_TENSORS

ray = pytest.importorskip("ray", reason=RAY_MISSING)

import tritonclient.http as httpclient  # noqa: E402
from ray import serve  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from dlscale.cli import parse  # noqa: E402
from dlscale.errors import ConfigError  # noqa: E402
from dlscale.scale import deploy  # noqa: E402

MODEL = "sleeper"
CLIENTS = 8


def _until(condition: Callable[[], bool], what: str, attempts: int = 120) -> None:
    for _ in range(attempts):
        if condition():
            return
        time.sleep(0.5)
    raise AssertionError(f"gave up waiting: {what}")


def _running_replicas() -> int:
    app = serve.status().applications[deploy.model_app(MODEL)]
    return int(app.deployments[MODEL].replica_states.get("RUNNING", 0))


def _replica_names(attempts: int = 40) -> set[str]:
    """The replicas that answer `describe` (Ray Serve spreads the calls over them)."""
    handle = serve.get_deployment_handle(MODEL, deploy.model_app(MODEL))
    return {handle.describe.remote().result(timeout_s=30).replica for _ in range(attempts)}


@pytest.fixture(scope="module")
def two_replicas(deployed: Deployed) -> set[str]:
    """The sleeper scaled from 1 to 2 replicas, as a second `--replicas 2` deploy does it."""
    assert _running_replicas() == 1
    deploy.deploy_model(dataclasses.replace(deployed.settings, replicas=2), MODEL)
    assert _running_replicas() == 2
    names = _replica_names()
    assert len(names) == 2
    return names


class Load:
    """Closed-loop clients sending random rows to the sleeper; every outcome is kept."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.outcomes: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(k,)) for k in range(CLIENTS)]

    def _client(self, seed: int) -> None:
        # A request that hangs would end in this timeout, an outcome the test refuses.
        client = httpclient.InferenceServerClient(self.url, network_timeout=90)
        rng = np.random.default_rng(seed)
        while not self._stop.is_set():
            x = rng.random((1, 4), dtype=np.float32)
            tensor = httpclient.InferInput("x", [1, 4], "FP32")
            tensor.set_data_from_numpy(x)
            try:
                y = client.infer(MODEL, [tensor]).as_numpy("y")
                self.outcomes.append("ok" if np.array_equal(y, x) else "WRONG ANSWER")
            except InferenceServerException as exc:
                self.outcomes.append(f"{exc.status()} {exc.message()}")
            except Exception as exc:  # a timeout or a dropped connection
                self.outcomes.append(f"no answer: {exc!r}")
        client.close()

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def test_a_replica_killed_under_load_loses_no_answer(
    deployed: Deployed, two_replicas: set[str]
) -> None:
    victim = sorted(two_replicas)[0]
    with Load(deployed.http_url) as load:
        _until(lambda: len(load.outcomes) >= 50, "answers before the kill")
        before = len(load.outcomes)
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=False)
        _until(lambda: len(load.outcomes) >= before + 200, "answers after the kill")
    unclear = [o for o in load.outcomes if o != "ok" and not o.startswith("503 ")]
    assert not unclear, unclear[:5]
    assert load.outcomes.count("ok") >= len(load.outcomes) - CLIENTS  # at most one per client
    # Ray Serve starts a replica in the dead one's place, and it serves.
    # Serve's status and the actor list catch up at their own pace: wait for both.
    _until(lambda: _running_replicas() == 2 and len(_replica_names()) == 2, "a replacement")
    names = _replica_names()
    assert len(names) == 2 and victim not in names


def _ray_metrics(nodes: RayNodes) -> str:
    pages = []
    for port in nodes.metrics_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            pages.append(page.read().decode())
    return "\n".join(pages)


def _successes_by_replica(text: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        if line.startswith("ray_nv_inference_request_success{") and f'model="{MODEL}"' in line:
            replica = re.search(r'replica="([^"]+)"', line)
            assert replica is not None, line
            found[replica.group(1)] = float(line.rsplit(" ", 1)[1])
    return found


def test_each_replicas_metrics_reach_rays_export_under_dlscales_names(
    cluster: RayNodes, http: httpclient.InferenceServerClient, two_replicas: set[str]
) -> None:
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    pending = [http.async_infer(MODEL, [tensor]) for _ in range(40)]
    for request in pending:
        request.get_result()

    def two_replicas_counted() -> bool:
        counts = _successes_by_replica(_ray_metrics(cluster))
        return len([v for v in counts.values() if v > 0]) >= 2

    _until(two_replicas_counted, "both replicas' nv_inference_request_success in Ray's export")
    text = _ray_metrics(cluster)
    for name in ("ray_nv_inference_count", "ray_dlscale_batch_size_bucket"):
        assert f"{name}{{" in text, name


def test_more_models_than_cpus_fit_the_cluster_they_are_given(
    cluster: RayNodes, tmp_path: Path
) -> None:
    # Ten models asking one CPU each on this four-CPU cluster: each replica asks 0.4.
    from dlscale.scale.commands import fit_to_cluster, settings_from

    for i in range(10):
        write_null_model(
            tmp_path, f"m{i}", NULL_TENSORS.format(inp="x", out="y", width=4, out_width=4)
        )
    settings = settings_from(parse(["serve", str(tmp_path), "--ray", "--address", cluster.address]))
    fitted = fit_to_cluster(settings, [f"m{i}" for i in range(10)])
    assert fitted.cpu_share == pytest.approx(0.4)
    fixed = settings_from(
        parse(["serve", str(tmp_path), "--ray", "--cpus-per-replica", "1", "--address", "x"])
    )
    with pytest.raises(ConfigError, match="10 CPUs asked, 4 in the cluster"):
        fit_to_cluster(fixed, [f"m{i}" for i in range(10)])
