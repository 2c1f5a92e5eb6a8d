"""A two-node Ray cluster on this machine, and the repository deployed on it by the command line.

Fixtures build on each other: cluster (ray.cluster_utils.Cluster: a head and a worker node, two
logical CPUs each, this process connected as a driver) -> repo (the zoo's small models, a null
model that waits 20 ms per batch, a broken one) -> deployed (`dlscale serve REPO --ray
--address ... --detach` run as a user runs it: a replica of the whole server, and the fleet's
router actor running HAProxy on the ports asked) -> http / grpc (tritonclient, through HAProxy).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tests.toolkit.generative import COLOURS, COLOURS_TOML, write_colours
from tests.toolkit.models import write_broken, write_null_model
from tests.toolkit.python_models import write_python_model
from tests.toolkit.repositories import BATCHED, NULL_TENSORS
from tests.toolkit.server import free_port
from tests.toolkit.streaming_models import TICKER, TICKER_TOML

from dlscale.cli import parse

if TYPE_CHECKING:
    from dlscale.scale.settings import ScaleSettings

#: Every test module here starts with this: without Ray, the module is skipped, saying why.
RAY_MISSING = "Ray Serve tests need the [ray] extra (ray[serve])"
HOST = "127.0.0.1"
#: The null model's stand-in for a device: every batch takes this long.
SLEEPER_DELAY_US = 20_000
#: The deploy's own limit, and each test's here (pytest-timeout counts the setup of the session
#: fixtures in the first test that asks for them): two nodes, a Serve controller, the router and
#: a replica start in well under a minute on 2 quiet cores, and the ingress design once took over
#: 240 s with two CPU-burning processes beside the suite. These are nets, not claims.
DEPLOY_TIMEOUT_S, TEST_TIMEOUT_S = 600, 900
#: Tries at starting the two nodes (`_start_nodes`).
CLUSTER_STARTS = 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The Ray tests get TEST_TIMEOUT_S instead of the suite's 300 s."""
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))


@dataclass(frozen=True)
class RayNodes:
    """The cluster's address and the Prometheus export port of each of its nodes."""

    address: str
    metrics_ports: tuple[int, ...]


@pytest.fixture(scope="session")
def cluster() -> Iterator[RayNodes]:
    """A head and one worker node with 2 logical CPUs each; metrics exported every second."""
    ray = pytest.importorskip("ray", reason=RAY_MISSING)
    from ray import serve
    from ray.cluster_utils import Cluster

    nodes, ports = _start_nodes(Cluster)
    try:
        # The driver is this pytest worker: Ray would print its actors' logs here as they
        # come, into whichever test runs next on the worker (a unit test that its command
        # wrote nothing to stderr failed on a replica's lines). They stay in Ray's log folder.
        ray.init(address=nodes.address, logging_level="WARNING", log_to_driver=False)
        yield RayNodes(nodes.address, ports)
    finally:
        _stop_fleet(ray)
        serve.shutdown()
        ray.shutdown()
        nodes.shutdown()


def _start_nodes(cluster_type: Any) -> tuple[Any, tuple[int, int]]:
    """A head and a worker node, and their metrics ports. Ray gives each process of a starting
    node a fixed time to show itself: 30 s for a raylet to register (`raylet_start_wait_time_s`
    in ray/_private/node.py, no setting), 30 s for the GCS to write its port. Beside two CPU
    burners on a fresh 2-core host, a minute into the suite, a worker node's raylet once and a
    head's GCS server once wrote not a line of their logs in that time. On the quiet host both
    nodes start in 4 s; 25 starts in a row beside the burners and three processes importing
    torch took 9-16 s each. A failed start is tried once more from scratch, with a warning."""
    for attempt in range(1, CLUSTER_STARTS):
        try:
            return _two_nodes(cluster_type)
        except Exception as error:
            # A warning, not a line on stderr: pytest shows a passing test's captured output
            # nowhere, but lists every warning in the run's summary, so each retry is seen.
            warnings.warn(
                f"Ray cluster start {attempt} failed, starting again: {error}", stacklevel=1
            )
    return _two_nodes(cluster_type)


def _two_nodes(cluster_type: Any) -> tuple[Any, tuple[int, int]]:
    """One start of the head and the worker node. A failed one shuts down the nodes that
    started; the processes of a node whose own start failed end with this process (Ray's
    exit handler)."""
    ports = (free_port(), free_port())
    nodes = cluster_type()
    try:
        nodes.add_node(
            num_cpus=2,
            include_dashboard=False,
            metrics_export_port=ports[0],
            _system_config={"metrics_report_interval_ms": 1000},
        )
        nodes.add_node(num_cpus=2, metrics_export_port=ports[1])
    except BaseException:
        nodes.shutdown()
        raise
    return nodes, ports


def _stop_fleet(ray: Any) -> None:
    """Delete the replicas and stop the detached router actor (its HAProxy holds the test's
    ports), as `dlscale serve --ray` does when it ends."""
    from dlscale.scale.deploy import undeploy
    from dlscale.scale.router_actor import ROUTER_NAME, ROUTER_NAMESPACE

    try:
        router = ray.get_actor(ROUTER_NAME, namespace=ROUTER_NAMESPACE)
    except ValueError:  # no fleet was deployed
        return
    undeploy(router)


@pytest.fixture(scope="session")
def ray_repo(small_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """identity, mlp and digits from the zoo; `sleeper`, a null echo model standing in for a
    device with a 20 ms batch; `broken`, whose config is invalid; `ticker`, a Python model that
    streams, one sequence at a time; `colours`, a generative Python model."""
    root = tmp_path_factory.mktemp("ray_repo")
    for name in ("identity", "mlp", "digits"):
        shutil.copytree(small_repo / name, root / name)
    sleeper = (
        BATCHED.format(max_batch=8, delay=0)
        + NULL_TENSORS.format(inp="x", out="y", width=4, out_width=4)
        + f"[backend_options]\ndelay_us = {SLEEPER_DELAY_US}\n"
    )
    write_null_model(root, "sleeper", sleeper)
    write_broken(root)
    write_python_model(root, "ticker", TICKER, TICKER_TOML)  # streams (test_ray_streams.py)
    write_colours(root)  # a generative Python model (test_ray_openai.py)
    routed = '[routing]\npolicy = "prefix"\n' + COLOURS_TOML  # test_ray_prefix.py
    write_python_model(root, "colours-tenanted", COLOURS, routed)
    return root


@dataclass(frozen=True)
class Deployed:
    """The repository served on the cluster: its endpoints and the settings it was given."""

    settings: ScaleSettings
    http_url: str
    grpc_url: str
    #: The fleet's metrics page and its JSON view (`/dlscale/fleet`).
    metrics_url: str


@pytest.fixture(scope="session")
def deployed(cluster: RayNodes, ray_repo: Path) -> Deployed:
    """`dlscale serve REPO --ray --address ... --detach`, run as a user runs it."""
    if shutil.which("haproxy") is None:  # `make test` installs it where it can
        pytest.skip("the fleet's router is HAProxy, not installed (apt-get install haproxy)")
    from dlscale.scale.commands import settings_from

    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    argv = [
        "serve", str(ray_repo), "--ray", "--address", cluster.address,
        "--http-port", str(http_port), "--grpc-port", str(grpc_port),
        "--metrics-port", str(metrics_port),
        "--model-control", "explicit", "--load-model", "*",
        "--cpus-per-replica", "0.5", "--detach",
    ]  # fmt: skip
    command = [str(Path(sys.executable).parent / "dlscale"), *argv]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=DEPLOY_TIMEOUT_S,
        env={**os.environ},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout + done.stderr  # the ports as tests and benchmarks read them
    assert f"http listening on {HOST}:{http_port}" in said, said
    assert f"grpc listening on {HOST}:{grpc_port}" in said, said
    deployed = Deployed(
        settings_from(parse(argv)),
        f"{HOST}:{http_port}",
        f"{HOST}:{grpc_port}",
        f"{HOST}:{metrics_port}",
    )
    _wait_ready(deployed.http_url)
    return deployed


def _wait_ready(url: str, attempts: int = 120) -> None:
    client = httpclient.InferenceServerClient(url)
    for _ in range(attempts):
        try:
            if client.is_server_ready():
                return
        except Exception:  # the proxy may still be starting
            pass
        time.sleep(0.5)
    raise AssertionError(f"the fleet's router at {url} did not become ready")


@pytest.fixture
def http(deployed: Deployed) -> Iterator[httpclient.InferenceServerClient]:
    """tritonclient's REST client against the fleet, through its router (HAProxy)."""
    client = httpclient.InferenceServerClient(deployed.http_url, network_timeout=60)
    yield client
    client.close()


@pytest.fixture
def grpc(deployed: Deployed) -> Iterator[grpcclient.InferenceServerClient]:
    """tritonclient's gRPC client against the fleet, through its router (HAProxy)."""
    client = grpcclient.InferenceServerClient(deployed.grpc_url)
    yield client
    client.close()
