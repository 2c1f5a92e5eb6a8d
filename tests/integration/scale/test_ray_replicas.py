"""The fleet on Ray: scaled from 1 to 2 replicas, a replica's server killed under load, the router
actor killed, the fleet's metrics and view.

Each replica is a whole `dlscale serve` in a child process on its own ports; the router actor
runs HAProxy and is told by the replicas where they listen. Ray replaces a replica whose child
died (its health check fails) and restarts the router actor.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.integration.scale.conftest import RAY_MISSING, Deployed, RayNodes
from tests.toolkit.models import write_null_model
from tests.toolkit.repositories import NULL_TENSORS
from tests.toolkit.slow import slow_only

ray = pytest.importorskip("ray", reason=RAY_MISSING)

import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from dlscale.cli import parse  # noqa: E402
from dlscale.errors import ConfigError  # noqa: E402
from dlscale.scale.router_actor import ROUTER_NAME, ROUTER_NAMESPACE  # noqa: E402

MODEL = "sleeper"
CLIENTS = 8


def _until(condition: Callable[[], bool], what: str, attempts: int = 240) -> None:
    for _ in range(attempts):
        try:
            if condition():
                return
        except OSError:  # the router restarting
            pass
        time.sleep(0.5)
    raise AssertionError(f"gave up waiting: {what}")


def _fleet(deployed: Deployed) -> dict[str, Any]:
    """The fleet's view, read through the router's REST port as a user reads it."""
    url = f"http://{deployed.http_url}/dlscale/fleet"
    with urllib.request.urlopen(url, timeout=30) as page:
        return dict(json.loads(page.read()))


def _up(deployed: Deployed) -> dict[str, dict[str, Any]]:
    """The replicas in rotation (ready, and UP in HAProxy), by key."""
    replicas = _fleet(deployed)["replicas"]
    return {r["replica"]: r for r in replicas if r["ready"] and r["router_state"] == "UP"}


def _replica_client(replica: dict[str, Any]) -> httpclient.InferenceServerClient:
    """A client of one replica's own server (not through the router)."""
    return httpclient.InferenceServerClient(f"{replica['host']}:{replica['http_port']}")


@pytest.fixture(scope="module")
def two_replicas(deployed: Deployed) -> Iterator[dict[str, dict[str, Any]]]:
    """`digits` unloaded through the router, then the fleet scaled from 1 to 2 replicas, as a
    second deploy with `--replicas 2` does it; back to 1 after (the other modules' statistics
    are those of the one replica that answers)."""
    from dlscale.scale.commands import deploy_fleet

    first = set(_up(deployed))
    assert len(first) == 1
    client = httpclient.InferenceServerClient(deployed.http_url, network_timeout=120)
    client.unload_model("digits")
    deploy_fleet(dataclasses.replace(deployed.settings, replicas=2))
    _until(lambda: len(_up(deployed)) == 2, "two replicas in rotation")
    assert first < set(_up(deployed))  # the running replica is kept: one is added
    yield _up(deployed)
    client.load_model("digits")
    deploy_fleet(deployed.settings)
    _until(lambda: len(_fleet(deployed)["replicas"]) == 1, "back to one replica")


def test_a_replica_started_later_serves_the_models_loaded_and_unloaded_before(
    deployed: Deployed, two_replicas: dict[str, dict[str, Any]]
) -> None:
    for replica in two_replicas.values():
        own = _replica_client(replica)
        assert own.is_model_ready("identity") and not own.is_model_ready("digits")
    assert _fleet(deployed)["models"]["digits"] == "unload"
    httpclient.InferenceServerClient(deployed.http_url, network_timeout=120).load_model("digits")
    for replica in two_replicas.values():  # a load reaches every replica
        assert _replica_client(replica).is_model_ready("digits")


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


def _served(replica: dict[str, Any]) -> int:
    stats = _replica_client(replica).get_inference_statistics(MODEL)
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


def test_a_replicas_server_killed_under_load_loses_no_request(
    deployed: Deployed, two_replicas: dict[str, dict[str, Any]]
) -> None:
    victim, survivor = sorted(_up(deployed).values(), key=lambda r: str(r["replica"]))
    with Load(deployed.http_url) as load:
        _until(lambda: len(load.outcomes) >= 50, "answers before the kill")
        before = len(load.outcomes)
        os.kill(victim["pid"], signal.SIGKILL)
        _until(lambda: len(load.outcomes) >= before + 200, "answers after the kill")
    # HAProxy sent each request the dead server held to the other one: each has its own answer.
    assert set(load.outcomes) == {"ok"}, [o for o in load.outcomes if o != "ok"][:5]
    # Ray's health check replaces the replica; the new one joins the router's rotation.
    _until(lambda: len(_up(deployed)) == 2 and victim["replica"] not in _up(deployed), "a new one")
    (fresh,) = [r for k, r in _up(deployed).items() if k != survivor["replica"]]
    before_fresh = _served(fresh)
    client = httpclient.InferenceServerClient(deployed.http_url, network_timeout=60)
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    for request in [client.async_infer(MODEL, [tensor]) for _ in range(40)]:
        request.get_result()
    assert _served(fresh) > before_fresh  # the router routes to the new replica


@slow_only("twenty replacements of a Ray replica under load take minutes on 2 cores")
def test_twenty_replica_kills_under_load_lose_no_request(
    deployed: Deployed, two_replicas: dict[str, dict[str, Any]]
) -> None:
    """The issue's fault target on Ray: a replica's server is killed twenty times in turn (the
    older of the two each time) while clients keep sending; every request has its own answer."""
    with Load(deployed.http_url) as load:
        for kill in range(20):
            _until(lambda: len(_up(deployed)) == 2, f"two replicas up before kill {kill + 1}")
            victim = min(_up(deployed).values(), key=lambda r: str(r["replica"]))
            before = len(load.outcomes)
            os.kill(victim["pid"], signal.SIGKILL)
            _until(lambda n=before: len(load.outcomes) >= n + 20, f"answers after kill {kill + 1}")
            gone = victim["replica"]
            _until(lambda g=gone: g not in _up(deployed), "the victim out of rotation")
    assert len(load.outcomes) > 400
    assert set(load.outcomes) == {"ok"}, [o for o in load.outcomes if o != "ok"][:5]


def test_the_router_actor_killed_is_restarted_and_serves_again(
    deployed: Deployed, two_replicas: dict[str, dict[str, Any]]
) -> None:
    before = _fleet(deployed)
    wanted, pid = before["models"], before["router"]["pid"]
    ray.kill(ray.get_actor(ROUTER_NAME, namespace=ROUTER_NAMESPACE), no_restart=False)
    # Ray starts it again on the same ports; the replicas' heartbeats tell it the fleet again,
    # and the loads and unloads it had recorded.
    _until(lambda: _fleet(deployed)["router"]["pid"] != pid, "a new router process")
    _until(lambda: len(_up(deployed)) == 2, "the restarted router routing to both replicas")
    _until(lambda: _fleet(deployed)["models"] == wanted, "the wanted models handed back")
    x = np.full((1, 4), 7.0, np.float32)
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(x)
    client = httpclient.InferenceServerClient(deployed.http_url, network_timeout=60)
    np.testing.assert_array_equal(client.infer(MODEL, [tensor]).as_numpy("y"), x)


def _successes_by_replica(text: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        if line.startswith("nv_inference_request_success{") and f'model="{MODEL}"' in line:
            assert 'node="' in line, line
            replica = line.split('replica="', 1)[1].split('"', 1)[0]
            found[replica] = float(line.rsplit(" ", 1)[1])
    return found


def test_one_metrics_page_shows_each_replica_under_dlscales_names(
    deployed: Deployed, two_replicas: dict[str, dict[str, Any]]
) -> None:
    client = httpclient.InferenceServerClient(deployed.http_url, network_timeout=60)
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    for request in [client.async_infer(MODEL, [tensor]) for _ in range(40)]:
        request.get_result()

    def page() -> str:
        url = f"http://{deployed.metrics_url}/metrics"
        with urllib.request.urlopen(url, timeout=30) as answer:
            return str(answer.read().decode())

    counts = _successes_by_replica(page())
    assert set(counts) == set(_up(deployed)) and all(v > 0 for v in counts.values()), counts
    text = page()
    for name in ("nv_inference_count{", "# TYPE nv_inference_count counter"):
        assert name in text, name
    assert text.count("# TYPE nv_inference_count counter") == 1  # one family, every replica


def test_more_models_than_cpus_fit_the_cluster_they_are_given(
    cluster: RayNodes, tmp_path: Path
) -> None:
    # Ten models asking one CPU each in a replica, on this four-CPU cluster: it asks 0.4 of that.
    from dlscale.scale.commands import fit_to_cluster, settings_from

    for i in range(10):
        write_null_model(
            tmp_path, f"m{i}", NULL_TENSORS.format(inp="x", out="y", width=4, out_width=4)
        )
    settings = settings_from(parse(["serve", str(tmp_path), "--ray", "--address", cluster.address]))
    fitted = fit_to_cluster(settings, [f"m{i}" for i in range(10)])
    assert fitted.cpu_share == pytest.approx(0.4)
    argv = ["serve", str(tmp_path), "--ray", "--cpus-per-replica", "3", "--replicas", "2"]
    fixed = settings_from(parse([*argv, "--address", "x"]))
    with pytest.raises(ConfigError, match="6 CPUs asked, 4 in the cluster"):
        fit_to_cluster(fixed, [f"m{i}" for i in range(10)])


def test_the_router_asks_ray_whether_it_was_restarted_without_a_warning(
    cluster: RayNodes,
) -> None:
    # Ray 2.60's `was_current_actor_reconstructed` reads its own deprecated `actor_id`: the
    # warning went into every `dlscale serve --ray`'s log. In this actor warnings are errors.
    @ray.remote(num_cpus=0)
    class Asker:
        def ask(self) -> bool:
            import warnings

            from dlscale.scale.router_actor import was_restarted

            with warnings.catch_warnings():
                warnings.simplefilter("error")
                return was_restarted()

    asker = Asker.remote()  # type: ignore[attr-defined]
    try:
        assert ray.get(asker.ask.remote(), timeout=120) is False
    finally:
        ray.kill(asker)
