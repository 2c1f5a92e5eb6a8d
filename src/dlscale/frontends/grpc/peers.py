"""gRPC's per-client bounds: calls in flight and connections held by one client address.

grpc.aio shows a server neither its TCP accepts nor its connections, and its own connection
limit (`grpc.max_allowed_incoming_connections`) is server-wide: 1,000 idle channels from one
address made it close every other client's new connection. Two rules give gRPC REST's per-peer
cap (`max_connections_per_peer`):

- `PeerCalls`: the calls (unary calls and open streams) one address has in flight; one more is
  refused RESOURCE_EXHAUSTED before it runs. `context.peer()` names the address. One connection
  takes as many calls at once (`grpc.max_concurrent_streams`, frontend.py), so a client on a
  single channel is held back by HTTP/2 and never reaches the refusal.
- `ConnectionTrimmer`: a thread that, once a second, reads the kernel's table of established
  TCP connections (/proc/net/tcp and tcp6: one read, no per-socket call), counts those on the
  gRPC port by client address and, only for an address beyond its cap, finds the newest of its
  sockets among this process's descriptors (/proc/self/fd) and shuts them down. gRPC sees the
  end of each and closes it, which frees its slot in the server-wide count. A socket is shut
  through a duplicate of its descriptor whose inode is checked first, so a descriptor closed
  and reused meanwhile is never mistaken for another.

The trimmer acts after the fact: a client that opens connections faster than it trims can
still fill the server-wide limit for a moment; docs/limits.md says what to put in front then.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
from collections import defaultdict

log = logging.getLogger("dlscale.grpc")
#: Seconds between two trims: a flood of idle connections is cut within about this long.
TRIM_INTERVAL_S = 1.0
_FDS = "/proc/self/fd"
#: The state column of an established connection in /proc/net/tcp.
_ESTABLISHED = "01"


def peer_address(peer: str) -> str:
    """The client address of a gRPC peer string: 'ipv4:127.0.0.1:5000' -> '127.0.0.1'."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rpartition(":")[0].strip("[]")
    return peer  # unix sockets and anything else: the whole string is the peer


#: Client addresses by gRPC peer string, so that each call does not parse its own; cleared
#: when full (each connection has a peer string of its own).
_ADDRESSES: dict[str, str] = {}
_MOST_ADDRESSES = 4096


def address_of(peer: str) -> str:
    """`peer_address`, remembered per peer string (asked on every call)."""
    address = _ADDRESSES.get(peer)
    if address is None:
        if len(_ADDRESSES) >= _MOST_ADDRESSES:
            _ADDRESSES.clear()
        address = _ADDRESSES[peer] = peer_address(peer)
    return address


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

    def __init__(self, port: int, cap: int) -> None:
        self.port = port
        self.cap = cap
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dlscale-grpc-peers", daemon=True)

    @staticmethod
    def available() -> bool:
        """Whether this system lists connections and descriptors as Linux does."""
        return os.path.isdir(_FDS) and os.path.exists("/proc/net/tcp")

    def start(self) -> None:
        """Trim in the background until `stop`."""
        self._thread.start()

    def stop(self) -> None:
        """End the background trims."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(TRIM_INTERVAL_S):
            try:
                self.trim()
            except Exception:  # a failed trim must not end the trims that follow
                log.exception("trimming gRPC connections failed")

    def trim(self) -> int:
        """One pass: how many connections it shut down."""
        if len(os.listdir(_FDS)) <= self.cap:
            return 0  # fewer descriptors than the cap: no address can hold more connections
        over = {
            peer: inodes[self.cap :]
            for peer, inodes in established(self.port).items()
            if len(inodes) > self.cap
        }
        if not over:
            return 0  # the common case: one read of the kernel's table
        for peer, extra in over.items():
            log.warning(
                "gRPC client %s held %d connections; closing those beyond its "
                "max_connections_per_peer of %d",
                peer,
                self.cap + len(extra),
                self.cap,
            )
        doomed = {inode for extra in over.values() for inode in extra}
        return sum(self._shut(fd, inode) for fd, inode in _descriptors_of(doomed))

    @staticmethod
    def _shut(fd: int, inode: int) -> int:
        try:
            copy = os.dup(fd)
        except OSError:
            return 0  # closed meanwhile
        try:
            if os.fstat(copy).st_ino != inode:
                return 0  # the descriptor was reused meanwhile: another socket or file
            with socket.socket(fileno=copy) as sock:  # closes the duplicate only
                copy = -1
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            return 0  # it ended meanwhile
        finally:
            if copy >= 0:
                os.close(copy)
        return 1


def established(port: int) -> dict[str, list[int]]:
    """The established TCP connections on local `port`, by client address: their socket
    inodes, oldest first (inodes are numbered as sockets are made)."""
    by_peer: dict[str, list[int]] = defaultdict(list)
    mark = f":{port:04X} "
    for table, decode in (("tcp", _ipv4), ("tcp6", _ipv6)):
        try:
            with open(f"/proc/net/{table}") as rows:
                next(rows, None)  # the heading
                for row in rows:
                    if mark not in row:
                        continue  # neither end on the port: not split, as most rows
                    fields = row.split()
                    local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
                    if state == _ESTABLISHED and int(local.rpartition(":")[2], 16) == port:
                        by_peer[decode(remote.rpartition(":")[0])].append(int(inode))
        except (OSError, IndexError, ValueError):
            continue  # no such table (no IPv6), or a row of another form
    return {peer: sorted(inodes) for peer, inodes in by_peer.items()}


def _descriptors_of(inodes: set[int]) -> list[tuple[int, int]]:
    """This process's descriptors of the sockets with these inodes, with their inodes."""
    found = []
    for name in os.listdir(_FDS):
        try:
            target = os.readlink(f"{_FDS}/{name}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:[") and int(target[8:-1]) in inodes:
            found.append((int(name), int(target[8:-1])))
    return found


def _ipv4(text: str) -> str:
    return socket.inet_ntop(socket.AF_INET, bytes.fromhex(text)[::-1])


def _ipv6(text: str) -> str:
    raw = bytes.fromhex(text)  # four 32-bit words, each in host (little-endian) order
    address = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
    return str(address.ipv4_mapped or address)
