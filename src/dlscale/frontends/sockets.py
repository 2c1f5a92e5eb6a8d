"""Sockets bound before the process that serves on them exists: port 0 picks a known port.

The REST workers share a port their owner holds (SO_REUSEPORT, not listening); a fleet's router
is handed listening sockets by descriptor. Both bind here, and say which port failed and why.
"""

from __future__ import annotations

import socket

from dlscale.errors import DlscaleError


def bind(host: str, port: int, what: str, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to (host, port); `what` names its use in the error when it fails."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEPORT if reuse_port else socket.SO_REUSEADDR, 1
        )
        sock.bind(address)
    except OSError as exc:
        raise DlscaleError(f"{what} cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock
