"""One hostile REST client against the others (issue 28): connection caps per peer, idle
connections reaped for a new client, and a model's 429s given before the body is read.

Other clients are other loopback addresses (127.0.0.2, ...), which Linux routes to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as th
from tests.toolkit.clients import RawHttp
from tests.toolkit.repositories import tenants_repository
from tests.toolkit.server import LocalServer, serving

LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
PER_PEER = 4
CONNECTIONS = 8
REAP_IDLE_S = 0.2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    repo = tenants_repository(tmp_path_factory.mktemp("tenants"), rate_limit=0.01)
    with serving(
        repo,
        max_connections=CONNECTIONS,
        max_connections_per_peer=PER_PEER,
        reap_idle_s=REAP_IDLE_S,
    ) as running:
        yield running


def _held(server: LocalServer, source: str, count: int) -> list[RawHttp]:
    """`count` connections from `source`, each answered once (so the server has counted it)."""
    held = [RawHttp(server.http.port, source=source) for _ in range(count)]
    for conn in held:
        conn.send(LIVE)
        assert conn.response()[0] == 200
    return held


def _answers(conn: RawHttp) -> bool:
    try:
        conn.send(LIVE)
        return conn.response()[0] == 200
    except (AssertionError, ConnectionError):
        return False


def _status(server: LocalServer, source: str, wire: bytes = LIVE) -> tuple[int, str]:
    with RawHttp(server.http.port, source=source) as conn:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.send(wire)
        status, _, body = conn.response()
    return status, body.decode()


def _infer_wire(model: str, body: bytes, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    head = f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n"
    return head.encode() + body


ROW = np.arange(4, dtype=np.float32).reshape(1, 4)
INFER = json.dumps(
    {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": ROW.ravel().tolist()}]}
).encode()


def _close(conns: list[RawHttp]) -> None:
    for conn in conns:
        conn.close()
    time.sleep(0.1)  # the server learns of the closes as its loop reads them


def test_a_peer_over_its_cap_is_refused_while_another_is_served(server: LocalServer) -> None:
    held = _held(server, "127.0.0.2", PER_PEER)
    try:
        status, body = _status(server, "127.0.0.2")
        assert status == 503 and "max_connections_per_peer" in body
        assert _status(server, "127.0.0.3")[0] == 200  # another client is served
        held[0].send(LIVE)  # and the capped client's own connections still are
        assert held[0].response()[0] == 200
    finally:
        _close(held)


def test_idle_connections_are_reaped_so_that_a_new_client_is_served(server: LocalServer) -> None:
    held = _held(server, "127.0.0.2", PER_PEER) + _held(server, "127.0.0.3", PER_PEER)
    try:
        time.sleep(REAP_IDLE_S * 2)  # every held connection is idle long enough to be reaped
        assert _status(server, "127.0.0.4")[0] == 200
        assert sum(not _answers(conn) for conn in held) == 1  # the longest idle one was closed
    finally:
        _close(held)


def _spend_the_burst(server: LocalServer) -> None:
    for _ in range(3):  # rate_burst = 2: the third is refused at the latest
        if _status(server, "127.0.0.5", _infer_wire("neighbor", INFER))[0] == 429:
            return
    raise AssertionError("the neighbor's rate limit did not refuse")


def test_a_refused_body_is_not_read(server: LocalServer) -> None:
    _spend_the_burst(server)
    with RawHttp(server.http.port) as conn:
        # 4 MB declared and none sent: the 429 comes all the same, without waiting for them.
        conn.send(_infer_wire("neighbor", b"", length=4_000_000))
        status, headers, body = conn.response()
        assert status == 429 and "rate limit" in json.loads(body)["error"]
        assert headers["connection"] == "close"
    with RawHttp(server.http.port) as conn:
        # A small body is skipped as it passes, and the connection kept.
        conn.send(_infer_wire("neighbor", INFER))
        assert conn.response()[0] == 429
        conn.send(LIVE)
        assert conn.response()[0] == 200


def _flood(port: int, stop: threading.Event, refused: list[int]) -> None:
    with RawHttp(port, source="127.0.0.6") as conn:
        for _ in range(300):  # bounded: stops by itself
            if stop.is_set():
                return
            conn.send(_infer_wire("neighbor", INFER))
            status, _, _ = conn.response()
            refused.append(status)


def test_a_flood_refused_on_one_model_leaves_the_other_answered(server: LocalServer) -> None:
    _spend_the_burst(server)
    stop, refused = threading.Event(), []
    floods = [
        threading.Thread(target=_flood, args=(server.http.port, stop, refused)) for _ in range(3)
    ]
    for flood in floods:
        flood.start()
    client = th.InferenceServerClient(server.http_url)
    try:
        for i in range(20):
            inputs = [th.InferInput("x", [1, 4], "FP32")]
            inputs[0].set_data_from_numpy(ROW + i)
            answer = client.infer("protected", inputs).as_numpy("y")
            assert answer is not None and np.array_equal(answer, ROW + i)
    finally:
        stop.set()
        for flood in floods:
            flood.join()
        client.close()
    assert refused and set(refused) == {429}
