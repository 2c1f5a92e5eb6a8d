"""What a REST connection may hold: a compressed body is bounded once inflated, and an idle
keep-alive connection is closed (never one whose request is still being answered).

Driven through public behaviour only, a plain HTTP client and raw sockets, so that these hold
whichever way the transport implements them.
"""

from __future__ import annotations

import gzip
import json
import socket
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from tests.toolkit.server import LocalServer, serving

BODY_LIMIT = 64 * 2**10
#: Seconds an idle connection stays open here: short, so that the test waits little.
KEEP_ALIVE_S = 0.2
#: The longest the test waits for the server to close an idle connection.
WAIT_S = 15.0
LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n"
COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {"gzip": gzip.compress, "deflate": zlib.compress}


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo, max_body_bytes=BODY_LIMIT, keep_alive_s=KEEP_ALIVE_S) as running:
        yield running


def _padded_request(size: int) -> bytes:
    """A valid request for `identity` (one row), padded with JSON whitespace to `size` bytes."""
    row = [float(i) for i in range(16)]
    tensor = {"name": "input", "shape": [1, 16], "datatype": "FP32", "data": row}
    body = json.dumps({"inputs": [tensor]}).encode()
    return body[:-1] + b" " * (size - len(body)) + b"}"


@pytest.mark.parametrize("encoding", sorted(COMPRESSORS))
def test_a_body_is_held_to_the_limit_once_decompressed(server: LocalServer, encoding: str) -> None:
    url = f"http://{server.http_url}/v2/models/identity/infer"
    headers = {"Content-Encoding": encoding}
    compress = COMPRESSORS[encoding]
    # Within the limit once inflated: served.
    fits = compress(_padded_request(BODY_LIMIT))
    answer = httpx.post(url, content=fits, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [float(i) for i in range(16)]
    # One byte more once inflated, though a few hundred bytes on the wire: refused, and said so.
    bomb = compress(_padded_request(BODY_LIMIT + 1))
    assert len(bomb) < BODY_LIMIT // 50
    answer = httpx.post(url, content=bomb, headers=headers)
    assert answer.status_code == 413
    error = answer.json()["error"]
    assert f"the decompressed body exceeds the limit of {BODY_LIMIT} bytes" in error


def _answered(sock: socket.socket) -> bytes:
    """One whole response to a GET (its head ends it: the body is 0 bytes or read with it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"closed before answering: {data!r}"
        data += chunk
    return data


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server ends the connection within WAIT_S (reads end) rather than leave it."""
    sock.settimeout(WAIT_S)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_an_idle_connection_is_closed_after_keep_alive(server: LocalServer) -> None:
    with socket.create_connection(("127.0.0.1", server.http.port), timeout=WAIT_S) as sock:
        # Back to back, the connection is kept for the next request ...
        for _ in range(2):
            sock.sendall(LIVE)
            assert _answered(sock).startswith(b"HTTP/1.1 200")
        # ... and closed once it has been idle past keep-alive.
        assert _closed_by_server(sock)


def test_a_request_taking_longer_than_keep_alive_is_answered(server: LocalServer) -> None:
    # The "queued" model holds a lone request 300 ms for company, past the 0.2 s keep-alive:
    # a sweep in the meantime must not take the connection from under it.
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    ).encode()
    head = (
        b"POST /v2/models/queued/infer HTTP/1.1\r\nHost: test\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    with socket.create_connection(("127.0.0.1", server.http.port), timeout=WAIT_S) as sock:
        sock.sendall(head + body)
        answer = _answered(sock)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert _closed_by_server(sock)
