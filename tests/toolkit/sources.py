"""Clients of distinct addresses against one server or router: held connections and floods.

The whole 127/8 is loopback on Linux, so binding a client's socket to 127.0.0.2, 127.0.0.3...
makes it another client address to a server listening on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import httpx

HOST = "127.0.0.1"
#: A REST request any server answers (liveness).
LIVE = b"GET /v2/health/live HTTP/1.1\r\nhost: fleet\r\n\r\n"
#: HTTP/2's connection preface and an empty SETTINGS frame: a server answers with its SETTINGS.
H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def client(source: str) -> httpx.Client:
    """An httpx client whose connections come from `source`."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=120)


@contextmanager
def held(port: int, source: str, count: int, hello: bytes) -> Iterator[list[socket.socket]]:
    """`count` connections from `source`, each open and answered once (so the server has
    accepted and counted it), held until the block ends."""
    with ExitStack() as stack:
        socks = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket())
            sock.settimeout(60)
            sock.bind((source, 0))
            sock.connect((HOST, port))
            sock.sendall(hello)
            assert sock.recv(65536), "a connection within the cap was closed"
            socks.append(sock)
        yield socks


def answer_then_eof(source: str, port: int) -> bytes:
    """What the server writes on one new connection from `source` to LIVE, up to its close (a
    refused connection is closed after its answer, not kept alive)."""
    with socket.socket() as sock:
        sock.settimeout(60)
        sock.bind((source, 0))
        sock.connect((HOST, port))
        sock.sendall(LIVE)
        return b"".join(iter(lambda: sock.recv(65536), b""))


def closed_at_once(source: str, port: int) -> bool:
    """Whether a new HTTP/2 connection from `source` is closed before any answer."""
    with socket.socket() as sock:
        sock.settimeout(60)
        sock.bind((source, 0))
        try:  # the close may reach the client as early as its connect
            sock.connect((HOST, port))
            sock.sendall(H2_HELLO)
            return sock.recv(65536) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True


@dataclass(frozen=True)
class Flooded:
    """What a flood got back: how many requests were answered, and the answers that were not
    a 200 by status and body (what a failed assertion shows: whose refusal it was)."""

    answered: int
    refusals: Counter[str]


def flood(url: str, body: dict[str, object], sources: int, per_source: int) -> Flooded:
    """`per_source` POSTs of `body` at once from each of `sources` addresses (127.0.0.10 and
    up)."""
    answers = asyncio.run(_flood(url, body, sources, per_source))
    refusals = Counter(f"{status} {text}" for status, text in answers if status != 200)
    return Flooded(len(answers), refusals)


async def _flood(
    url: str, body: dict[str, object], sources: int, per_source: int
) -> list[tuple[int, str]]:
    async def one(client: httpx.AsyncClient) -> tuple[int, str]:
        answer = await client.post(url, json=body)
        return answer.status_code, answer.text[:300] if answer.status_code != 200 else ""

    clients = [
        httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(local_address=f"127.0.0.{10 + s}"),
            limits=httpx.Limits(max_connections=per_source),
            timeout=120,
        )
        for s in range(sources)
    ]
    try:
        return list(await asyncio.gather(*(one(c) for c in clients for _ in range(per_source))))
    finally:
        for each in clients:
            await each.aclose()
