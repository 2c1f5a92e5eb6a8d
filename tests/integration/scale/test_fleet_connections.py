"""The per-client connection cap of a fleet is the router's: attacks on `dlscale serve
--device-workers` as users run it.

Behind HAProxy every connection reaches a replica from the router's address, so the replica's own
`--max-connections-per-peer` (256) capped the whole fleet's traffic and, once full, refused the
router's health check too (the replica went DOWN and its queue was lost). Now the router counts
each client address (scale/connections.py) and the replicas take its connections uncapped.
Clients of distinct addresses are made by binding their sockets to 127.0.0.2.. (the whole 127/8
is loopback on Linux); HAProxy's own view is read from its runtime socket, found under the
fleet's TMPDIR.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from tests.toolkit.models import write_null_model
from tests.toolkit.repositories import BATCHED, NULL_TENSORS
from tests.toolkit.server import free_port
from tests.toolkit.sources import (
    H2_HELLO,
    LIVE,
    answer_then_eof,
    client,
    closed_at_once,
    flood,
    held,
)
from tests.toolkit.waiting import until

from dlscale.frontends.limits import Limits

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy")
HOST = "127.0.0.1"
MODEL, WIDTH = "holder", 4
#: The fleet's per-client cap: the default, as the benchmark that found the fault ran it.
CAP = Limits().max_connections_per_peer
#: Starting a fleet on the shared 2 cores took 20 s under a load average of 16: a net.
START_PATIENCE_S = 300.0
#: Concurrent requests of the floods: more than CAP, each source under it.
SOURCES, PER_SOURCE = 5, 64


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A null echo whose batches (up to 512 rows, gathered for 0.5 s) hold it 1 s: requests
    sent together stay in flight together, each on a connection of its own."""
    root = tmp_path_factory.mktemp("fleet_connections")
    config = (
        BATCHED.format(max_batch=512, delay=500_000)
        + NULL_TENSORS.format(inp="x", out="y", width=WIDTH, out_width=WIDTH)
        + "[backend_options]\ndelay_us = 1000000\n"
    )
    write_null_model(root, MODEL, config)
    return root


@dataclass
class Fleet:
    """A running `dlscale serve --device-workers 1`, its router's ports and runtime socket."""

    process: subprocess.Popen[bytes]
    http: int
    grpc: int
    tmp: Path

    def rows(self) -> list[dict[str, str]]:
        """HAProxy's `show stat` rows of the REST backend, its own and its servers'."""
        (admin,) = self.tmp.glob("dlscale-router-*/admin.sock")
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(30)
            sock.connect(str(admin))
            sock.sendall(b"show stat\n")
            text = b"".join(iter(lambda: sock.recv(65536), b"")).decode()
        rows = text.splitlines()
        header = rows[0].lstrip("# ").split(",")
        found = [dict(zip(header, row.split(","), strict=False)) for row in rows[1:] if row]
        return [r for r in found if r["pxname"] == "rest"]

    def stats(self) -> list[dict[str, str]]:
        """The rows of the REST backend's live slots."""
        return [r for r in self.rows() if r["svname"].startswith("r") and r["status"] != "MAINT"]


@contextmanager
def running(repo: Path, tmp: Path, *flags: str) -> Iterator[Fleet]:
    """`dlscale serve REPO --device-workers 1 FLAGS` on free ports, ready through its router;
    its temporary files (HAProxy's runtime socket among them) under `tmp`."""
    http, grpc = free_port(), free_port()
    argv = [
        sys.executable, "-m", "dlscale", "serve", str(repo), "--device-workers", "1",
        "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", "-1",
        "--log-level", "warning", *flags,
    ]  # fmt: skip
    started = Fleet(subprocess.Popen(argv, env={**os.environ, "TMPDIR": str(tmp)}), http, grpc, tmp)
    try:
        until(lambda: _ready(started), START_PATIENCE_S)
        yield started
    finally:
        started.process.terminate()
        started.process.wait(60)


@pytest.fixture(scope="module")
def fleet(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One worker behind the router, the default caps."""
    with running(repo, tmp_path_factory.mktemp("fleet_tmp")) as started:
        yield started


def _ready(fleet: Fleet) -> bool:
    assert fleet.process.poll() is None, "the fleet exited"
    try:
        return httpx.get(f"http://{HOST}:{fleet.http}/v2/health/ready", timeout=5).is_success
    except httpx.HTTPError:  # the router is not listening yet
        return False


def _infer_url(fleet: Fleet) -> str:
    return f"http://{HOST}:{fleet.http}/v2/models/{MODEL}/infer"


def _body(value: float) -> dict[str, object]:
    data = [value] * WIDTH
    return {"inputs": [{"name": "x", "shape": [1, WIDTH], "datatype": "FP32", "data": data}]}


def test_one_client_past_the_cap_gets_503_while_another_is_served(fleet: Fleet) -> None:
    url = _infer_url(fleet)
    with held(fleet.http, "127.0.0.3", CAP, LIVE):
        with client("127.0.0.3") as flooder:
            refused = flooder.post(url, json=_body(1.0))
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        error = refused.json()["error"]  # the one server's shape: {"error": "..."}
        assert f"127.0.0.3) holds its maximum of {CAP} connections" in error, error
        assert answer_then_eof("127.0.0.3", fleet.http).startswith(b"HTTP/1.1 503")
        with client("127.0.0.2") as other:
            served = other.post(url, json=_body(2.0))
        assert served.status_code == 200, served.text
        assert served.json()["outputs"][0]["data"] == [2.0] * WIDTH
    # its connections closed, the first client is served again
    with client("127.0.0.3") as flooder:
        assert flooder.post(url, json=_body(3.0)).status_code == 200


def test_one_grpc_client_past_the_cap_is_closed_while_another_is_served(fleet: Fleet) -> None:
    with held(fleet.grpc, "127.0.0.4", CAP, H2_HELLO):
        assert closed_at_once("127.0.0.4", fleet.grpc), "served past the cap"
        grpc = tg.InferenceServerClient(f"{HOST}:{fleet.grpc}")  # from 127.0.0.1
        tensor = tg.InferInput("x", [1, WIDTH], "FP32")
        tensor.set_data_from_numpy(np.full((1, WIDTH), 5.0, np.float32))
        rows = grpc.infer(MODEL, [tensor], client_timeout=120).as_numpy("y")
        assert rows is not None and rows.tolist() == [[5.0] * WIDTH]
        grpc.close()


def test_more_than_256_connections_from_several_sources_are_all_served(fleet: Fleet) -> None:
    # Before, the replica saw them all from the router's address and refused past 256 (503).
    flooded = flood(_infer_url(fleet), _body(1.0), SOURCES, PER_SOURCE)
    assert flooded.answered == SOURCES * PER_SOURCE > CAP
    assert not flooded.refusals, flooded.refusals


def test_a_flooded_replica_stays_up_in_the_router(fleet: Fleet) -> None:
    # Before, the flood filled the replica's cap for the router's address, which its health
    # check shares: the check got 503, HAProxy marked it DOWN and a Ray fleet replaced it.
    before = fleet.stats()
    # "UP" or "UP 1/2" (one check slow on a loaded machine): in rotation either way
    assert [r["status"].split()[0] for r in before] == ["UP"], before
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.05):
            seen.extend(r["status"].split()[0] for r in fleet.stats())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        floods = [flood(_infer_url(fleet), _body(1.0), SOURCES, PER_SOURCE) for _ in range(2)]
    finally:
        stop.set()
        watcher.join(60)
    after = fleet.stats()
    assert seen and set(seen) == {"UP"}, sorted(set(seen))
    # no UP -> DOWN transition between two samples either
    assert [r["chkdown"] for r in after] == [r["chkdown"] for r in before]
    # The last check's result; "* " before it says one is running now (HAProxy's `show stat`).
    assert [r["check_status"].removeprefix("* ") for r in after] == ["L7OK"], after
    assert all(f.answered == SOURCES * PER_SOURCE and not f.refusals for f in floods), [
        f.refusals for f in floods
    ]


def test_requests_past_a_replicas_share_wait_in_the_router(
    repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Its own fleet: a worker holding 40 connections is sent 24 requests at once (16 kept for
    # checks); the 60 of this flood wait in HAProxy's queue for their turn. Before, HAProxy
    # sent all 60 and the worker answered 503 past its 40.
    with running(repo, tmp_path_factory.mktemp("small"), "--max-connections", "40") as small:
        flooded = flood(_infer_url(small), _body(1.0), sources=2, per_source=30)
        assert flooded.answered == 60 and not flooded.refusals, flooded.refusals
        assert max(int(r["qmax"] or 0) for r in small.rows()) > 0  # some did wait
        assert max(int(r["smax"] or 0) for r in small.stats()) <= 40 - 16
