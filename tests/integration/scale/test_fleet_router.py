"""The fleet's router (HAProxy) over two `dlscale serve` children, without Ray.

Each child is a whole server on its own ports (scale/child.py); the router is fed the live ones.
A child killed by its pid leaves rotation within a second and no request through the router is
lost: the ones it held are sent again to the other child (nothing of theirs had been answered).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tests.toolkit.models import write_null_model
from tests.toolkit.repositories import BATCHED, NULL_TENSORS
from tests.toolkit.waiting import process_gone, until

from dlscale.errors import DlscaleError
from dlscale.scale.child import Endpoint, ServerChild
from dlscale.scale.haproxy import HaproxyRouter, Member
from dlscale.scale.registry import (
    ANSWERING_STALE_S,
    HAND_OVER_MAX_S,
    HAND_OVER_S,
    STALE_S,
    Registry,
)
from dlscale.scale.weights import read_work
from dlscale.server import ServerSettings

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy")
HOST = "127.0.0.1"


def _settings(repo: Path) -> ServerSettings:
    return ServerSettings.build(
        repo, host=HOST, http_port=0, grpc_port=0, metrics_port=None, log_level="warning"
    )


@pytest.fixture(scope="module")
def fleet(small_repo: Path) -> Iterator[tuple[HaproxyRouter, list[ServerChild], list[Endpoint]]]:
    children = [ServerChild(_settings(small_repo)) for _ in range(2)]
    router = HaproxyRouter(HOST, 0, 0)
    try:
        endpoints = [child.start() for child in children]
        router.start()
        router.sync([_member(i, e) for i, e in enumerate(endpoints)])
        until(lambda: set(router.states().values()) == {"UP"})
        yield router, children, endpoints
    finally:
        router.stop()
        for child in children:
            child.stop(5.0)


def _member(index: int, endpoint: Endpoint) -> Member:
    return Member(f"child{index}", endpoint.host, endpoint.http_port, endpoint.grpc_port)


def _rest_infer(port: int, value: float) -> np.ndarray:
    x = np.full((1, 16), value, np.float32)
    tensor = th.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(x)
    # Closed in the thread that made it: collected later in another thread, tritonclient's
    # `__del__` cannot reach its gevent hub (an unraisable exception pytest reports).
    with th.InferenceServerClient(f"{HOST}:{port}", network_timeout=30) as client:
        return client.infer("identity", [tensor]).as_numpy("output")


def test_both_protocols_reach_the_children_through_one_address(fleet) -> None:  # type: ignore[no-untyped-def]
    router, _, _ = fleet
    assert _rest_infer(router.ports["http"], 3.0)[0, 0] == 3.0
    grpc = tg.InferenceServerClient(f"{HOST}:{router.ports['grpc']}")
    tensor = tg.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.full((1, 16), 5.0, np.float32))
    assert grpc.infer("identity", [tensor], client_timeout=30).as_numpy("output")[0, 0] == 5.0
    assert grpc.is_server_ready(client_timeout=30)


def test_the_router_spreads_requests_over_the_children(fleet) -> None:  # type: ignore[no-untyped-def]
    router, _, endpoints = fleet

    def load() -> None:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: _rest_infer(router.ports["http"], float(i)), range(64)))

    served = _served(endpoints, load)
    assert sum(served) == 64 and min(served) > 0, served


def test_a_killed_child_leaves_rotation_and_loses_no_request(small_repo: Path) -> None:
    """Its own fleet: this test kills one child under load."""
    children = [ServerChild(_settings(small_repo)) for _ in range(2)]
    router = HaproxyRouter(HOST, 0, None)
    try:
        endpoints = [child.start() for child in children]
        router.start()
        router.sync([_member(i, e) for i, e in enumerate(endpoints)])
        until(lambda: set(router.states().values()) == {"UP"})
        port = router.ports["http"]
        with ThreadPoolExecutor(8) as pool:
            answers = [pool.submit(_rest_infer, port, float(i)) for i in range(400)]
            until(lambda: sum(a.done() for a in answers) >= 50)
            assert children[0].process is not None
            children[0].process.send_signal(signal.SIGKILL)
            values = [a.result()[0, 0] for a in answers]  # none raises: none lost
        assert values == [float(i) for i in range(400)]  # each its own answer, none mixed up
        until(lambda: router.states()["child0"] == "DOWN")
        router.sync([_member(1, endpoints[1])])
        assert list(router.states()) == ["child1"]
    finally:
        router.stop()
        for child in children:
            child.stop(5.0)


@contextlib.contextmanager
def _clocked_fleet(
    small_repo: Path,
) -> Iterator[tuple[list[ServerChild], HaproxyRouter, Registry, list[Endpoint], list[float]]]:
    """Two started children, a started router, and a registry over it whose clock is `now[0]`
    (moved by the test); the children are not joined yet."""
    children = [ServerChild(_settings(small_repo)) for _ in range(2)]
    router = HaproxyRouter(HOST, 0, None)
    now = [1000.0]
    try:
        endpoints = [child.start() for child in children]
        router.start()
        yield children, router, Registry(router, clock=lambda: now[0]), endpoints, now
    finally:
        router.stop()
        for child in children:
            child.stop(5.0)


def test_late_heartbeats_drop_a_replica_only_once_its_server_stops_answering(
    small_repo: Path,
) -> None:
    """A replica's heartbeats are Ray calls, which a starved host delays (a CI run beside two
    CPU burners lost its only replica to a 5 s gap, and answered 503s). Late beyond STALE_S, a
    replica whose server answers HAProxy's checks stays in rotation and answers; one whose
    server stopped is dropped at the next sweep; one late beyond ANSWERING_STALE_S is dropped
    even while its server answers (its actor is gone: loads no longer reach it)."""
    with _clocked_fleet(small_repo) as (children, router, registry, endpoints, now):
        for i, endpoint in enumerate(endpoints):
            registry.join(f"child{i}", "node", endpoint)
            registry.ready(f"child{i}")
        until(lambda: set(router.states().values()) == {"UP"})
        now[0] += STALE_S + 1  # neither replica's beats heard
        registry.sweep()
        assert sorted(router.members) == ["child0", "child1"]  # both answer: kept
        assert _rest_infer(router.ports["http"], 2.0)[0, 0] == 2.0
        children[0].stop(5.0)
        until(lambda: not router.states()["child0"].startswith("UP"))
        registry.sweep()
        assert list(router.members) == ["child1"]  # its server gone: dropped
        assert [e.http_port for e in registry.endpoints()] == [endpoints[1].http_port]
        now[0] += ANSWERING_STALE_S  # child1 still answers, and has been silent too long
        registry.sweep()
        assert not router.members and not registry.endpoints()


def test_the_last_replica_holds_while_its_successor_starts(small_repo: Path) -> None:
    """Ray stops a one-replica fleet's replica while its successor starts. The old one keeps
    serving: HAND_OVER_S while no successor said it starts, as long as a start may take once
    one did (a run beside two CPU burners lost requests to a successor that took 113 s), and
    not at all once the successor is in rotation or is not the only one."""
    with _clocked_fleet(small_repo) as (_, router, registry, endpoints, now):
        registry.join("old", "node", endpoints[0])
        registry.ready("old")
        until(lambda: registry.in_rotation() == {"old"})
        assert registry.hand_over("old") == HAND_OVER_S  # no successor heard of yet
        registry.starting("new")  # its actor runs; its child starts
        assert registry.hand_over("old") == HAND_OVER_MAX_S
        now[0] += HAND_OVER_MAX_S + 1  # it never joined: its start failed without a word
        assert registry.hand_over("old") == HAND_OVER_S
        registry.starting("new")
        registry.leave("new")  # its start failed and it said so
        assert registry.hand_over("old") == HAND_OVER_S
        registry.starting("new")
        registry.join("new", "node", endpoints[1])  # replaying the loads, not ready yet
        assert registry.hand_over("old") == HAND_OVER_MAX_S
        assert registry.hand_over("new") == 0.0  # not in rotation: nothing to hand over
        now[0] += STALE_S + 1  # its beats late: a replica still starting is kept longer
        registry.heartbeat("old", "node", endpoints[0], True)
        registry.sweep()
        assert registry.hand_over("old") == HAND_OVER_MAX_S
        registry.heartbeat("new", "node", endpoints[1], False)
        registry.ready("new")
        until(lambda: registry.in_rotation() == {"old", "new"})
        assert registry.hand_over("old") == 0.0  # the successor serves: the old one goes
        assert _rest_infer(router.ports["http"], 3.0)[0, 0] == 3.0


def test_with_no_child_alive_a_request_gets_a_retryable_503(small_repo: Path) -> None:
    router = HaproxyRouter(HOST, 0, None)
    router.start()
    try:
        with pytest.raises(Exception) as caught:
            _rest_infer(router.ports["http"], 1.0)
        assert "503" in str(caught.value) and "retry" in str(caught.value)
    finally:
        router.stop()


def test_a_router_restarted_on_its_ports_waits_for_them_only_when_told() -> None:
    """A restarted router binds the ports its predecessor's HAProxy may still be closing."""
    held = socket.socket()
    held.bind((HOST, 0))
    held.listen()
    port = held.getsockname()[1]
    refused = HaproxyRouter(HOST, port, None)
    with pytest.raises(DlscaleError, match="cannot listen"):
        refused.start()  # a first start: in use is an error at once
    assert not refused.workdir.exists()  # a failed start leaves no folder
    threading.Timer(0.5, held.close).start()
    router = HaproxyRouter(HOST, port, None)
    router.start(bind_patience_s=30.0)
    try:
        assert router.ports["http"] == port
    finally:
        router.stop()


def test_a_child_that_cannot_start_says_so(tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.toml").write_text("this is not toml [")
    settings = _settings(tmp_path).replace(exit_on_error=True)
    with pytest.raises(DlscaleError, match="exited with"):
        ServerChild(settings).start(timeout_s=120)


def test_a_child_ends_with_its_supervisor(small_repo: Path) -> None:
    """The child is told (PR_SET_PDEATHSIG) to stop when the process that started it dies."""
    import subprocess
    import sys

    script = (
        "import sys, time; from pathlib import Path\n"
        "from dlscale.scale.child import ServerChild\n"
        "from dlscale.server import ServerSettings\n"
        f"s = ServerSettings.build(Path({str(small_repo)!r}), http_port=0, grpc_port=None,"
        " metrics_port=None, log_level='warning')\n"
        "print(ServerChild(s).start().pid, flush=True); time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    until(lambda: process_gone(pid))
    assert process_gone(pid)


def _sleeper_repo(root: Path, delay_us: int) -> Path:
    """A null model that holds its (simulated) device `delay_us` per batch of up to 4 rows."""
    config = (
        BATCHED.format(max_batch=4, delay=0)
        + NULL_TENSORS.format(inp="input", out="output", width=16, out_width=16)
        + f'[backend_options]\ndelay_us = {delay_us}\nsimulated_device = "sim0"\n'
    )
    write_null_model(root, "sleeper", config)
    return root


def _sleeper_infer(port: int, value: float) -> float:
    tensor = th.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.full((1, 16), value, np.float32))
    with th.InferenceServerClient(f"{HOST}:{port}", network_timeout=60) as client:  # as above
        return float(client.infer("sleeper", [tensor]).as_numpy("output")[0, 0])


def test_weights_from_measured_work_send_the_faster_replica_more(tmp_path: Path) -> None:
    """Two replicas whose devices take 10 ms and 40 ms a batch: weighed by the compute time
    each measured per row, the router sends the slow one less of the same load than before."""
    repos = [_sleeper_repo(tmp_path / "fast", 10_000), _sleeper_repo(tmp_path / "slow", 40_000)]
    children = [ServerChild(_settings(repo)) for repo in repos]
    router = HaproxyRouter(HOST, 0, None)
    try:
        endpoints = [child.start() for child in children]
        router.start()
        registry = Registry(router)  # what the Ray router actor holds
        for i, endpoint in enumerate(endpoints):
            registry.join(f"child{i}", "node", endpoint)
            registry.ready(f"child{i}")
        until(lambda: set(router.states().values()) == {"UP"})
        registry.weigh()  # the first reading: nothing measured, every weight the most
        port = router.ports["http"]
        unweighted = _served(endpoints, lambda: _load(port, 160))  # each replica measured
        registry.weigh()
        weights = dict(router.weights)
        assert weights["child0"] > 2 * weights["child1"], weights  # 4x slower: about a quarter
        weighted = _served(endpoints, lambda: _load(port, 160))
        # Fewest requests in flight alone already favours the fast replica (the slow one holds
        # its requests longer); divided by the weights, the slow one is sent fewer still.
        assert sum(unweighted) == sum(weighted) == 160
        assert weighted[1] < unweighted[1], (unweighted, weighted, weights)
    finally:
        router.stop()
        for child in children:
            child.stop(5.0)


@pytest.fixture(scope="module")
def unequal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, list[Endpoint]]]:
    """Two replicas whose devices take 40 ms and 160 ms a batch of up to 4 (1x and 4x), behind
    a router fed as the Ray router actor feeds it; nothing measured yet."""
    root = tmp_path_factory.mktemp("unequal")
    repos = [_sleeper_repo(root / "fast", 40_000), _sleeper_repo(root / "slow", 160_000)]
    children = [ServerChild(_settings(repo)) for repo in repos]
    router = HaproxyRouter(HOST, 0, None)
    try:
        endpoints = [child.start() for child in children]
        router.start()
        registry = Registry(router)
        for i, endpoint in enumerate(endpoints):
            registry.join(f"child{i}", "node", endpoint)
            registry.ready(f"child{i}")
        until(lambda: set(router.states().values()) == {"UP"})
        registry.weigh()  # the first reading: nothing measured
        yield registry, endpoints
    finally:
        router.stop()
        for child in children:
            child.stop(5.0)


def test_measured_batch_clocks_send_each_request_where_it_finishes_first(unequal) -> None:  # type: ignore[no-untyped-def]
    """Two clients at a time: the fast replica holds at most two requests, so each finishes
    there within two of its batches, sooner than alone on the slow one. Leastconn (before the
    replicas are measured) sends the second to the slow replica whenever it is idle; once
    their batch clocks are known, none goes there."""
    registry, endpoints = unequal
    port = registry.router.ports["http"]
    assert set(registry.router.clocks.values()) == {"-"}  # unmeasured: leastconn routes
    by_count = _served(endpoints, lambda: _load(port, 80, clients=2))
    assert by_count[1] > 0, by_count
    registry.weigh()
    clocks = registry.router.clocks
    assert "-" not in clocks.values(), clocks
    by_finish = _served(endpoints, lambda: _load(port, 80, clients=2))
    assert by_finish == [80, 0], (by_count, by_finish, clocks)


def test_a_queue_deeper_than_the_slow_batch_spills_to_the_slow_replica(unequal) -> None:  # type: ignore[no-untyped-def]
    """Twenty-four clients at a time: twelve waiting on the fast replica take as long as one on
    the idle slow one, so some requests go there, and most still to the fast one."""
    registry, endpoints = unequal
    registry.weigh()
    assert "-" not in registry.router.clocks.values(), registry.router.clocks
    served = _served(endpoints, lambda: _load(registry.router.ports["http"], 240, clients=24))
    assert 0 < served[1] < served[0], served


def test_a_replica_out_of_rotation_is_skipped_and_its_clock_dropped(unequal) -> None:  # type: ignore[no-untyped-def]
    """The fast replica leaves (maintenance, as a replica that drains or stops reporting): the
    finish-first rule places nothing on it, every request is answered by the slow one."""
    registry, endpoints = unequal
    router = registry.router
    registry.weigh()
    members = {m.key: m for m in router.members.values()}
    try:
        router.sync([members["child1"]])
        assert list(router.clocks) == ["r2"], router.clocks
        served = _served(endpoints, lambda: _load(router.ports["http"], 40, clients=4))
        assert served == [0, 40], served
    finally:
        router.sync(list(members.values()))
        until(lambda: set(router.states().values()) == {"UP"})


def test_the_batch_time_haproxy_sees_overrides_a_wrong_measured_one(unequal) -> None:  # type: ignore[no-untyped-def]
    """Both replicas said to take 80 ms a batch (a slow one measured on a quiet host, say): at
    first the second of two requests at a time goes to the idle slow replica; once HAProxy has
    seen batches end on both, it uses the times it saw (the slow one about four times the
    fast one's) and sends none there."""
    registry, endpoints = unequal
    router = registry.router
    port = router.ports["http"]
    members = list(router.members.values())
    try:
        router.sync([])  # every slot leaves the map ...
        router.sync(members)  # ... and comes back unmeasured
        until(lambda: set(router.states().values()) == {"UP"})
        _load(port, 4, clients=1)  # the rule sees them unmeasured: their clocks start over
        router.weigh({}, {m.key: (0.08, 4) for m in members})
        told = _served(endpoints, lambda: _load(port, 40, clients=2))
        seen = _served(endpoints, lambda: _load(port, 40, clients=2))
        assert seen == [40, 0], (told, seen)
    finally:
        registry.weigh()


def _served(endpoints: list[Endpoint], load: Callable[[], None]) -> list[int]:
    """The rows each replica computed while `load` ran."""
    before = [read_work(e.host, e.http_port).rows for e in endpoints]
    load()
    return [read_work(e.host, e.http_port).rows - b for e, b in zip(endpoints, before, strict=True)]


def _load(port: int, count: int, clients: int = 8) -> None:
    """`count` requests from `clients` closed-loop clients, each answered with its own rows."""
    with ThreadPoolExecutor(clients) as pool:
        values = list(pool.map(lambda i: _sleeper_infer(port, float(i)), range(count)))
    assert values == [float(i) for i in range(count)]
