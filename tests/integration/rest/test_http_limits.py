"""What a REST client may send and hold: sizes, timeouts, connections, over raw sockets.

Each limit is set small here, so that going over it is cheap; the answer names the limit.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.toolkit.clients import RawHttp
from tests.toolkit.server import LocalServer, serving

LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
URL_LIMIT = 1024
LINE_LIMIT = 512
HEAD_LIMIT = 4096
CONNECTIONS = 4


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(
        repo,
        max_url_bytes=URL_LIMIT,
        max_header_bytes=LINE_LIMIT,
        max_head_bytes=HEAD_LIMIT,
        max_headers=20,
        head_timeout_s=0.5,
        body_timeout_s=0.5,
        max_keep_alive_requests=3,
        max_connections=CONNECTIONS,
    ) as running:
        yield running


def _error(body: bytes) -> str:
    return str(json.loads(body)["error"])


def _answer(server: LocalServer, wire: bytes) -> tuple[int, dict[str, str], str]:
    with RawHttp(server.http.port) as conn:
        # The server may refuse before it has read all we had to say.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.send(wire)
        status, headers, body = conn.response()
    return status, headers, _error(body)


def test_a_long_url_gets_414_and_is_not_kept(server: LocalServer) -> None:
    status, headers, error = _answer(
        server, b"GET /v2/models/" + b"a" * URL_LIMIT + b"/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert status == 414 and headers["connection"] == "close"
    assert "max_url_bytes" in error
    # Measured before: 60 distinct 8 MiB URLs grew the server by 1.2 GB, kept in the route cache.
    for n in range(3000):
        server.run(server.http.api.handle("GET", f"/v2/models/m{n}/ready", {}, b""))
        server.run(server.http.api.handle("GET", f"/v2/nothing/{n}", {}, b""))
    assert server.http.api.cached_routes <= 1024


def test_header_lines_and_heads_are_bounded(server: LocalServer) -> None:
    long_line = b"GET /v2/health/live HTTP/1.1\r\nX-Big: " + b"v" * LINE_LIMIT + b"\r\n\r\n"
    status, _, error = _answer(server, long_line)
    assert status == 431 and "'x-big'" in error.lower() and "max_header_bytes" in error
    many = b"".join(b"X-%d: v\r\n" % i for i in range(21))
    status, _, error = _answer(server, b"GET /v2/health/live HTTP/1.1\r\n" + many + b"\r\n")
    assert status == 431 and "max_headers" in error
    large = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 400) for i in range(15))
    status, _, error = _answer(server, b"GET /v2/health/live HTTP/1.1\r\n" + large + b"\r\n")
    assert status == 431 and "max_head_bytes" in error


def test_a_header_line_that_never_ends_is_refused_while_it_streams(server: LocalServer) -> None:
    with RawHttp(server.http.port) as conn:
        conn.send(b"GET /v2/health/live HTTP/1.1\r\nX-Endless: ")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(16):  # 4 MiB of one header line that has not ended
                conn.send(b"v" * 2**18)
        status, headers, body = conn.response()
    assert status == 431 and headers["connection"] == "close"
    assert "max_head_bytes" in _error(body)


def test_a_slow_head_gets_408_and_the_connection_closes(server: LocalServer) -> None:
    # Slowloris: a byte at a time kept 200 connections open forever.
    with RawHttp(server.http.port) as conn:
        conn.send(b"GET /v2/health/live HTTP/1.1\r\n")
        answered = b""
        for _ in range(200):
            conn.send(b"X")
            time.sleep(0.05)
            conn.sock.setblocking(False)
            try:
                answered = conn.sock.recv(4096)
            except BlockingIOError:
                continue
            finally:
                conn.sock.setblocking(True)
            break
    assert answered.startswith(b"HTTP/1.1 408"), answered
    assert b"head_timeout_s" in answered


def test_a_slow_body_gets_408(server: LocalServer) -> None:
    with RawHttp(server.http.port) as conn:
        conn.send(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        status, headers, body = conn.response()
    assert status == 408 and headers["connection"] == "close"
    assert "body_timeout_s" in _error(body)


def test_keep_alive_ends_after_its_requests(server: LocalServer) -> None:
    with RawHttp(server.http.port) as conn:
        for _ in range(2):
            conn.send(LIVE)
            status, headers, _ = conn.response()
            assert status == 200 and "connection" not in headers
        conn.send(LIVE)
        status, headers, _ = conn.response()
        assert status == 200 and headers["connection"] == "close"
        assert conn.closed_by_server()


def test_connections_beyond_the_maximum_get_503(server: LocalServer) -> None:
    held = [RawHttp(server.http.port) for _ in range(CONNECTIONS)]
    try:
        for conn in held:  # each answered once: the server has counted it
            conn.send(LIVE)
            assert conn.response()[0] == 200
        with RawHttp(server.http.port) as extra:
            extra.send(LIVE)
            status, headers, body = extra.response()
        assert status == 503 and headers["retry-after"] == "1"
        assert f"maximum of {CONNECTIONS} connections" in _error(body)
    finally:
        for conn in held:
            conn.close()
    for _ in range(100):  # the server learns of the closes as its loop reads them
        with RawHttp(server.http.port) as conn:
            conn.send(LIVE)
            if conn.response()[0] == 200:
                return
        time.sleep(0.05)
    raise AssertionError("connections were not counted back after they closed")


def _cap_under(soft: int, hard: int) -> str:
    code = (
        "import resource\n"
        "from dlscale.frontends.limits import connection_cap\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))\n"
        "print(connection_cap(1000), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_connection_cap_follows_the_open_file_limit() -> None:
    # With 1,024 open files, 1,030 idle connections made new clients fail with a reset.
    assert _cap_under(256, 256) == "128 256"
    assert _cap_under(256, 2048) == "1000 2048"  # the soft limit is raised to the hard one
