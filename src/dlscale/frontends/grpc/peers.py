"""gRPC's per-client bounds: calls in flight and connections held by one client address.

grpc.aio shows a server neither its TCP accepts nor its connections, and its own connection
limit (`grpc.max_allowed_incoming_connections`) is server-wide: 1,000 idle channels from one
address made it close every other client's new connection. Two rules give gRPC REST's per-peer
cap (`max_connections_per_peer`):

- `PeerCalls`: the calls (unary calls and open streams) one address has in flight; one more is
  refused RESOURCE_EXHAUSTED before it runs. `context.peer()` names the address.
- `ConnectionTrimmer`: a thread that, once a second, lists this process's sockets accepted on
  the gRPC port (Linux: /proc/self/fd), groups them by client address and shuts down those of
  an address beyond its cap. gRPC sees the end of each and closes it, which frees its slot in
  the server-wide count. Each socket is examined through a duplicate of its descriptor, so a
  descriptor closed and reused meanwhile is examined afresh and never mistaken for another.

The trimmer acts after the fact: a client that opens connections faster than it trims can
still fill the server-wide limit for a moment; docs/limits.md says what to put in front then.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections import defaultdict

log = logging.getLogger("dlscale.grpc")
#: Seconds between two trims: a flood of idle connections is cut within about this long.
TRIM_INTERVAL_S = 1.0
_FDS = "/proc/self/fd"


def peer_address(peer: str) -> str:
    """The client address of a gRPC peer string: 'ipv4:127.0.0.1:5000' -> '127.0.0.1'."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rpartition(":")[0].strip("[]")
    return peer  # unix sockets and anything else: the whole string is the peer


class PeerCalls:
    """The calls each client address has in flight, held to `cap` (0: no limit)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._held: dict[str, int] = {}  # one event loop serves every call: no lock needed

    def enter(self, peer: str) -> str | None:
        """Count a call of `peer` in; the refusal's message when it holds its cap already."""
        held = self._held.get(peer, 0)
        if self.cap and held >= self.cap:
            return (
                f"this client ({peer}) has its maximum of {self.cap} gRPC calls and streams in "
                "flight (max_connections_per_peer); wait for one to end"
            )
        self._held[peer] = held + 1
        return None

    def leave(self, peer: str) -> None:
        """Count a call of `peer` out (it ended, however)."""
        left = self._held.pop(peer, 1) - 1
        if left > 0:
            self._held[peer] = left

    def held(self, peer: str) -> int:
        """Calls `peer` has in flight now."""
        return self._held.get(peer, 0)


class ConnectionTrimmer:
    """Shuts down the connections a client address holds on `port` beyond `cap`."""

    def __init__(self, port: int, cap: int, interval_s: float = TRIM_INTERVAL_S) -> None:
        self.port = port
        self.cap = cap
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dlscale-grpc-peers", daemon=True)

    @staticmethod
    def available() -> bool:
        """Whether this system lists a process's descriptors (Linux does)."""
        return os.path.isdir(_FDS)

    def start(self) -> None:
        """Trim in the background until `stop`."""
        self._thread.start()

    def stop(self) -> None:
        """End the background trims."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.trim()
            except Exception:  # a failed trim must not end the trims that follow
                log.exception("trimming gRPC connections failed")

    def trim(self) -> int:
        """One pass: how many connections it shut down."""
        by_peer = self._accepted()
        shut = 0
        try:
            for peer, held in by_peer.items():
                for sock in held[self.cap :]:
                    shut += _shut(sock)
                if len(held) > self.cap:
                    log.warning(
                        "gRPC client %s held %d connections; closed those beyond its "
                        "max_connections_per_peer of %d",
                        peer,
                        len(held),
                        self.cap,
                    )
        finally:
            for held in by_peer.values():
                for sock in held:
                    sock.close()  # the duplicate only: gRPC's descriptor stays its own
        return shut

    def _accepted(self) -> dict[str, list[socket.socket]]:
        """Duplicates of the connections accepted on the port, by client address, oldest
        descriptor number first (the lowest numbers were mostly taken first)."""
        by_peer: dict[str, list[socket.socket]] = defaultdict(list)
        for name in sorted(os.listdir(_FDS), key=int):
            sock = _duplicate(int(name))
            if sock is None:
                continue
            peer = self._peer_of(sock)
            if peer is None:
                sock.close()
            else:
                by_peer[peer].append(sock)
        return by_peer

    def _peer_of(self, sock: socket.socket) -> str | None:
        try:
            local, remote = sock.getsockname(), sock.getpeername()
        except OSError:
            return None  # the listening socket, or one already gone
        if not isinstance(local, tuple) or local[1] != self.port:
            return None  # another port's, or this process's own client side
        return str(remote[0])


def _duplicate(fd: int) -> socket.socket | None:
    """A socket object on a duplicate of `fd`, or None when `fd` is no TCP socket (now)."""
    try:
        if not os.readlink(f"{_FDS}/{fd}").startswith("socket:"):
            return None
        copy = os.dup(fd)
    except OSError:
        return None
    try:
        sock = socket.socket(fileno=copy)
    except OSError:
        os.close(copy)
        return None
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        sock.close()
        return None
    return sock


def _shut(sock: socket.socket) -> int:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        return 0  # it ended meanwhile
    return 1
