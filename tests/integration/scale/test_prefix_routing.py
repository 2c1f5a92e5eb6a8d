"""Prefix and session routing through the fleet's router (HAProxy) over two real servers.

Two `dlscale serve` children serve the colours model (a generative Python model) twice: as
`tenanted`, whose config routes by prefix (64 bytes), and as `plain`, which keeps least work.
Where each request went is read from each child's own statistics (successes per model), never
from timing. The hash is HAProxy's, so which replica a tenant lands on is found, not assumed;
what is asserted is that it stays there, spreads, is bounded, and moves when its replica dies.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc
from tests.toolkit.generative import COLOURS, outcomes
from tests.toolkit.python_models import write_python_model
from tests.toolkit.server import free_port
from tests.toolkit.waiting import process_gone, until

from dlscale.scale.child import Endpoint, ServerChild
from dlscale.scale.haproxy import HaproxyRouter, Member
from dlscale.scale.haproxy_config import REST as REST_BACKEND
from dlscale.scale.prefix import GRPC_HASHED, HASHED, SESSION_HEADER, Routing, routes_of
from dlscale.server import ServerSettings
from dlscale.wire.generative import signature_toml

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy")
HOST = "127.0.0.1"
ROUTED, PLAIN = "tenanted", "plain"
FACTOR = 150
#: The colours model, with room for a flood's sequences at once.
CONFIG = "[backend_options]\nmax_num_seqs = 32\n" + signature_toml()
ROUTING = '[routing]\npolicy = "prefix"\nprefix_bytes = 64\n'
#: A fleet of two workers starting on a loaded 2-core machine: a net, not a claim.
START_PATIENCE_S = 300.0


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prefix_routing")
    write_python_model(root, ROUTED, COLOURS, ROUTING + CONFIG)
    write_python_model(root, PLAIN, COLOURS, CONFIG)
    return root


@dataclass
class Fleet:
    """The router, its two children and their endpoints."""

    router: HaproxyRouter
    children: list[ServerChild]
    endpoints: list[Endpoint]

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.router.ports['http']}"

    def served(self, model: str) -> list[int]:
        """Each child's successes of `model` (its own statistics)."""
        return [outcomes(f"{HOST}:{e.http_port}", model)[0] for e in self.endpoints]

    def where(self, model: str, send: Callable[[], None]) -> list[int]:
        """Which children's counts of `model` rose while `send` ran, and by how much."""
        before = self.served(model)
        send()
        return [a - b for a, b in zip(self.served(model), before, strict=True)]


@contextmanager
def started(repo: Path) -> Iterator[Fleet]:
    """Two children behind a router that hashes the repository's routed models."""
    settings = ServerSettings.build(
        repo, host=HOST, http_port=0, grpc_port=0, metrics_port=None, log_level="warning"
    )
    children = [ServerChild(settings) for _ in range(2)]
    router = HaproxyRouter(HOST, 0, 0, routing=Routing(FACTOR, routes_of(repo)))
    try:
        endpoints = [child.start() for child in children]
        router.start()
        router.sync(
            [Member(f"child{i}", e.host, e.http_port, e.grpc_port) for i, e in enumerate(endpoints)]
        )
        until(lambda: set(router.states().values()) == {"UP"})
        yield Fleet(router, children, endpoints)
    finally:
        router.stop()
        for child in children:
            child.stop(5.0)


@pytest.fixture(scope="module")
def fleet(repo: Path) -> Iterator[Fleet]:
    with started(repo) as running:
        yield running


def system(tenant: str) -> str:
    """A tenant's long system prompt: one word (the colours model counts words), 600 bytes."""
    return f"tenant-{tenant}-" + "x" * 600


def chat(
    url: str, model: str, tenant: str, turn: str = "hi", headers: dict[str, str] | None = None,
    max_tokens: int = 2, **extra: object,
) -> httpx.Response:  # fmt: skip
    messages = [{"role": "system", "content": system(tenant)}, {"role": "user", "content": turn}]
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)


def answered(response: httpx.Response) -> None:
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]


def haproxy_rows(router: HaproxyRouter, backend: str) -> list[dict[str, str]]:
    """HAProxy's own statistics (`show stat`) of `backend`: its servers and its BACKEND row."""
    rows = router.command("show stat").splitlines()
    header = rows[0].lstrip("# ").split(",")
    fields = [dict(zip(header, row.split(","), strict=False)) for row in rows[1:]]
    return [f for f in fields if f.get("pxname") == backend]


def server_stats(fleet: Fleet, backend: str, column: str) -> list[int]:
    """One column of HAProxy's statistics for each replica of `backend` (r0, r1, ...)."""
    return [
        int(f[column] or 0) for f in haproxy_rows(fleet.router, backend) if f["svname"][0] == "r"
    ]


def settled(fleet: Fleet) -> None:
    """Wait until HAProxy holds no request of a hashed backend in flight. Its bounded-load hash
    counts requests in flight, and with one in flight (150% of it rounds up to 3 slots, split 1
    and 2 between two equal weights) the first replica is full: the previous request's stream,
    if HAProxy had not yet closed it when its answer arrived, sends the next one to the other
    replica. Six gRPC calls of one session split 5 and 1 once on a loaded host (84cdadc)."""
    until(
        lambda: (
            sum(server_stats(fleet, HASHED, "scur") + server_stats(fleet, GRPC_HASHED, "scur")) == 0
        )
    )


def tenant_spread(fleet: Fleet, model: str, tenant: str, count: int = 4) -> list[int]:
    """Where `count` turns of one tenant went, one after another."""

    def send() -> None:
        for turn in range(count):
            settled(fleet)
            answered(chat(fleet.url, model, tenant, turn=f"turn {turn}"))

    return fleet.where(model, send)


def test_each_tenant_stays_on_one_replica_and_tenants_spread_over_both(fleet: Fleet) -> None:
    homes = {}
    for tenant in "abcdefgh":
        spread = tenant_spread(fleet, ROUTED, tenant)
        assert sorted(spread) == [0, 4], (tenant, spread)  # every turn on one replica
        homes[tenant] = spread.index(4)
    assert set(homes.values()) == {0, 1}, homes  # eight tenants use both replicas


def test_a_model_that_keeps_least_work_spreads_one_tenant(fleet: Fleet) -> None:
    spread = tenant_spread(fleet, PLAIN, "a", count=8)
    assert sum(spread) == 8 and min(spread) > 0, spread


def test_oip_generate_of_a_routed_model_stays_on_one_replica(fleet: Fleet) -> None:
    def send() -> None:
        for turn in range(4):
            settled(fleet)
            body = {"text_input": system("oip") + f" turn {turn}", "parameters": {"max_tokens": 2}}
            answer = httpx.post(f"{fleet.url}/v2/models/{ROUTED}/generate", json=body, timeout=120)
            assert answer.status_code == 200, answer.text

    assert sorted(fleet.where(ROUTED, send)) == [0, 4]


@pytest.mark.parametrize("how", ["user", "header"])
def test_a_session_pins_requests_whatever_their_prompts(fleet: Fleet, how: str) -> None:
    def send() -> None:
        for turn in range(6):
            settled(fleet)
            tenant = f"{how}-{turn}"  # a new prompt each time: only the session is shared
            if how == "user":
                answered(chat(fleet.url, ROUTED, tenant, user="alice"))
            else:
                answered(chat(fleet.url, ROUTED, tenant, headers={SESSION_HEADER: "s-42"}))

    assert sorted(fleet.where(ROUTED, send)) == [0, 6]


def grpc_generate(fleet: Fleet, model: str, session: str | None) -> None:
    """One colours answer over gRPC through the router, with `session` as its metadata, sent
    once the router is `settled`."""
    settled(fleet)
    with tritonclient.grpc.InferenceServerClient(f"{HOST}:{fleet.router.ports['grpc']}") as client:
        prompt = tritonclient.grpc.InferInput("text_input", [1], "BYTES")
        prompt.set_data_from_numpy(np.array([b"red green"], dtype=object))
        headers = {SESSION_HEADER: session} if session is not None else None
        answer = client.infer(model, [prompt], headers=headers, client_timeout=120)
    assert answer.as_numpy("text_output") is not None


def test_a_grpc_session_pins_its_calls_and_sessions_spread(fleet: Fleet) -> None:
    """gRPC's model is in its protobuf body, which HAProxy does not read: a call carrying a
    session is hashed by it, whatever its model (here one that keeps least work over REST)."""
    downs = server_stats(fleet, REST_BACKEND, "chkdown")
    pinned = fleet.where(PLAIN, lambda: [grpc_generate(fleet, PLAIN, "g-7") for _ in range(6)])
    # A replica whose health check failed meanwhile (a starved host) leaves the ring: say so.
    assert sorted(pinned) == [0, 6], (pinned, downs, server_stats(fleet, REST_BACKEND, "chkdown"))
    homes = set()
    for session in "abcdefgh":
        spread = fleet.where(PLAIN, functools.partial(grpc_generate, fleet, PLAIN, f"g-{session}"))
        homes.add(spread.index(1))
    assert homes == {0, 1}, homes  # eight sessions use both replicas
    # Without a session, calls keep least work: one after another, both replicas answer.
    free = fleet.where(PLAIN, lambda: [grpc_generate(fleet, PLAIN, None) for _ in range(8)])
    assert sum(free) == 8 and min(free) > 0, free


def test_one_tenant_flooding_is_bounded_by_the_factor(fleet: Fleet) -> None:
    """Sixteen long requests of one tenant at once: its replica takes no more than the factor
    allows (150% of the mean load in flight), the other the rest."""
    count = 16

    def send() -> None:
        with ThreadPoolExecutor(count) as pool:
            # "forever": the model sleeps 10 ms a token, so each request is long in flight.
            turns = [
                pool.submit(chat, fleet.url, ROUTED, "flood", "forever", max_tokens=150)
                for _ in range(count)
            ]
            for turn in turns:
                answered(turn.result())

    spread = fleet.where(ROUTED, send)
    # HAProxy admits a replica below ceil((in flight + 1) x factor / 100 / replicas).
    most = -(-(count + 1) * FACTOR // 200)
    assert sum(spread) == count and max(spread) <= most and min(spread) > 0, spread


def test_huge_and_broken_bodies_are_answered_or_refused_without_a_5xx(fleet: Fleet) -> None:
    url = f"{fleet.url}/v1/chat/completions"
    broken = httpx.post(url, content=b'{"model": "tenanted", "messages": [', timeout=60)
    assert 400 <= broken.status_code < 500, broken.text
    not_json = httpx.post(url, content=b"\xff\xfe not json", timeout=60)
    assert 400 <= not_json.status_code < 500, not_json.text
    # Larger than HAProxy's buffer: the JSON cannot be read there, so least work routes it.
    huge = chat(fleet.url, ROUTED, "huge" + "y" * 200_000)
    answered(huge)
    content = httpx.post(url, content=json.dumps({"model": ROUTED, "messages": "x"}), timeout=60)
    assert 400 <= content.status_code < 500, content.text


def test_a_killed_replicas_tenant_moves_to_the_other_and_is_answered(repo: Path) -> None:
    with started(repo) as fleet:
        home = tenant_spread(fleet, ROUTED, "moving", count=2).index(2)
        victim = fleet.children[home].process
        assert victim is not None
        victim.send_signal(signal.SIGKILL)
        until(lambda: process_gone(victim.pid))
        # At once, before any health check: the first failed connection marks it down, and
        # the request goes again to the other replica.
        other = fleet.endpoints[1 - home]
        before = outcomes(f"{HOST}:{other.http_port}", ROUTED)[0]
        for turn in range(4):
            answered(chat(fleet.url, ROUTED, "moving", turn=f"after {turn}"))
        assert outcomes(f"{HOST}:{other.http_port}", ROUTED)[0] - before == 4


def test_dlscale_serve_device_workers_routes_a_tenant_to_one_worker(repo: Path) -> None:
    """As users run it: `dlscale serve REPO --device-workers 2` reads the repository's
    [routing] for its router; where requests went is read from the fleet's merged metrics."""
    http, metrics = free_port(), free_port()
    argv = [
        sys.executable, "-m", "dlscale", "serve", str(repo), "--device-workers", "2",
        "--http-port", str(http), "--grpc-port", "-1", "--metrics-port", str(metrics),
        "--route-balance-factor", "125", "--log-level", "warning",
    ]  # fmt: skip
    process = subprocess.Popen(argv)
    url = f"http://{HOST}:{http}"
    try:
        until(lambda: _ready(process, url), START_PATIENCE_S)
        before = _by_device(metrics, ROUTED)
        for turn in range(4):
            answered(chat(url, ROUTED, "cli", turn=f"turn {turn}"))
        until(lambda: sum(_by_device(metrics, ROUTED).values()) - sum(before.values()) == 4)
        after = _by_device(metrics, ROUTED)
        spread = sorted(after[d] - before.get(d, 0.0) for d in after)
        assert spread in ([0.0, 4.0], [4.0]), spread  # one worker took every turn
    finally:
        process.terminate()
        process.wait(60)


def _ready(process: subprocess.Popen[Any], url: str, model: str = ROUTED) -> bool:
    assert process.poll() is None, "the fleet exited"
    try:
        return httpx.get(f"{url}/v2/models/{model}/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _by_device(port: int, model: str) -> dict[str, float]:
    """Each worker's successes of `model` in the fleet's merged metrics."""
    text = httpx.get(f"http://{HOST}:{port}/metrics", timeout=30).text
    found = {}
    pattern = rf'^nv_inference_request_success\{{(.*model="{model}".*)\}} (\S+)$'
    for labels, value in re.findall(pattern, text, re.M):
        device = re.search(r'device="([^"]+)"', labels)
        assert device is not None, labels
        found[device.group(1)] = float(value)
    return found


def test_with_no_replica_up_a_hashed_request_gets_the_retryable_503() -> None:
    router = HaproxyRouter(HOST, 0, None, routing=Routing(FACTOR, {ROUTED: 64}))
    router.start()
    try:
        url = f"http://{HOST}:{router.ports['http']}"
        answer = chat(url, ROUTED, "alone", headers={SESSION_HEADER: "s-1"})
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1", answer.text
        assert "retry" in answer.json()["error"]
        assert _backend_requests(router, HASHED) == 1  # it was the hashed backend's to answer
    finally:
        router.stop()


def _backend_requests(router: HaproxyRouter, backend: str) -> int:
    """Requests a backend took, from HAProxy's own statistics."""
    totals = [int(f["stot"]) for f in haproxy_rows(router, backend) if f["svname"] == "BACKEND"]
    assert totals, f"no backend {backend} in HAProxy's statistics"
    return totals[0]


def test_a_polling_fleet_follows_a_routed_model_added_to_the_repository(
    tmp_path: Path,
) -> None:
    """`--model-control poll`: a model added later, with [routing], is loaded by the workers
    and hashed by the router (which says so in its log) without a restart."""
    write_python_model(tmp_path, PLAIN, COLOURS, CONFIG)
    http, metrics = free_port(), free_port()
    argv = [
        sys.executable, "-m", "dlscale", "serve", str(tmp_path), "--device-workers", "2",
        "--http-port", str(http), "--grpc-port", "-1", "--metrics-port", str(metrics),
        "--model-control", "poll", "--poll-interval", "0.5", "--log-level", "info",
    ]  # fmt: skip
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    assert process.stderr is not None
    reader = threading.Thread(target=lambda: said.extend(process.stderr or ()), daemon=True)
    reader.start()
    url = f"http://{HOST}:{http}"
    try:
        until(lambda: _ready(process, url, PLAIN), START_PATIENCE_S)
        write_python_model(tmp_path, ROUTED, COLOURS, ROUTING + CONFIG)
        until(lambda: any(f"by prefix or session: {ROUTED}" in line for line in said))
        until(lambda: _ready(process, url, ROUTED), START_PATIENCE_S)
        before = _by_device(metrics, ROUTED)
        for turn in range(4):
            answered(chat(url, ROUTED, "late", turn=f"turn {turn}"))
        after = _by_device(metrics, ROUTED)
        spread = sorted(after[d] - before.get(d, 0.0) for d in after)
        assert spread in ([0.0, 4.0], [4.0]), spread
    finally:
        process.terminate()
        process.wait(60)
