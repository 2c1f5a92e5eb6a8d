"""gRPC's per-client bounds (frontends/grpc/peers.py): addresses, call counts, the kernel's
table of connections read as the trimmer reads it, on real loopback sockets."""

from __future__ import annotations

import socket

import pytest

from dlscale.frontends.grpc.peers import ConnectionTrimmer, PeerCalls, established, peer_address


def test_a_peer_is_its_address_without_the_port() -> None:
    assert peer_address("ipv4:127.0.0.1:50123") == "127.0.0.1"
    assert peer_address("ipv6:[::1]:50123") == "::1"
    assert peer_address("unix:/tmp/s") == "unix:/tmp/s"


def test_calls_beyond_the_cap_are_refused_per_address() -> None:
    calls = PeerCalls(2)
    assert calls.enter("a") is None and calls.enter("a") is None
    refusal = calls.enter("a")
    assert refusal is not None and "max_connections_per_peer" in refusal and "(a)" in refusal
    assert calls.enter("b") is None  # another address has its own share
    calls.leave("a")
    assert calls.enter("a") is None and calls.held("a") == 2
    assert PeerCalls(0).enter("a") is None  # 0: no limit


@pytest.mark.parametrize(
    ("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
)
def test_established_connections_are_counted_by_client_address(family: int, host: str) -> None:
    try:
        listener = socket.create_server((host, 0), family=family)
    except OSError:
        pytest.skip(f"no {host} on this host")
    if not ConnectionTrimmer.available():
        pytest.skip("no /proc")
    port = listener.getsockname()[1]
    with listener:
        clients = [socket.create_connection((host, port)) for _ in range(3)]
        accepted = [listener.accept()[0] for _ in clients]
        found = established(port)
        assert list(found) == [host] and len(found[host]) == 3
        assert ConnectionTrimmer(port, 1).trim() == 2
        assert sum(_shut_down(s) for s in accepted) == 2  # the server's end of two, not three
        for sock in clients + accepted:
            sock.close()


def _shut_down(sock: socket.socket) -> bool:
    """Whether this end was shut down (sending fails at once, without waiting on the peer)."""
    try:
        sock.send(b"x")
    except OSError:
        return True
    return False
