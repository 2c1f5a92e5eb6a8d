"""The router in front of a fleet: HAProxy, fed with the live replicas over its runtime API.

Every request of a fleet (per-device workers on one host, or Ray replicas on many) crosses one
HAProxy process and then reaches a replica's own REST or gRPC port: no Python between the client
and the server that answers (docs/decisions.md says why HAProxy and not Ray Serve's proxy). The
fleet's owner calls `sync` with the replicas that live now; each takes a slot of a fixed
template (`set server ... addr/port`, then `state ready`), and a replica that left is put in
maintenance (its requests in flight finish; no new one is sent to it). Requests go by least
work (the replica where each request would finish first, scale/finish.py; weighted leastconn
until every replica is measured), except the generative requests of models that route by prefix or
session, which a consistent hash with bounded loads places (scale/prefix.py).

What the router promises (docs/scale.md):
- A replica that dies is out of rotation within a second: its first failed connection marks
  it down at once, and its health check (its REST /v2/health/ready, every second) after two
  failures in a row; a slow check is given 10 s and a connection 10 s, so a loaded host's
  replicas stay in rotation.
- A request whose replica died before answering anything (the connection failed or closed
  empty) is sent again to another replica: inference is safe to repeat, and the client had
  no answer. A request that cannot be repeated (its body is larger than HAProxy's buffer, or
  its answer had begun) gets a 503 with a JSON error and `Retry-After`; gRPC clients read the
  same as UNAVAILABLE.
- The sockets are bound here and handed to HAProxy by descriptor, so port 0 works and the
  ports are known before HAProxy starts.
- Each client address holds at most the fleet's --max-connections-per-peer connections per
  protocol, counted here (the replicas see only HAProxy's address); a replica is sent at most
  its --max-connections less room for checks, the rest wait here (scale/connections.py).
"""

from __future__ import annotations

import errno
import logging
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dlscale.errors import ConfigError, DlscaleError
from dlscale.frontends.sockets import bind
from dlscale.native import end_child, process_folder, spawn_dying_with_parent
from dlscale.scale import finish, prefix
from dlscale.scale.connections import ConnectionRules
from dlscale.scale.haproxy_config import (
    GRPC,
    REST,
    SLOTS,
    Control,
    admin_socket,
    render,
    routes_map,
    slots,
    write_errors,
)
from dlscale.scale.prefix import GRPC_HASHED, HASHED, Routing
from dlscale.scale.weights import MAX_WEIGHT

if TYPE_CHECKING:
    from dlscale.scale.child import Endpoint

log = logging.getLogger("dlscale.scale")
#: Seconds HAProxy gets to open its runtime socket.
START_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Member:
    """A live replica as the router sees it: where its REST and gRPC ports are."""

    #: Stable while the replica lives (a Ray replica id, a device worker's device).
    key: str
    host: str
    http_port: int
    grpc_port: int | None = None

    @classmethod
    def of(cls, key: str, endpoint: Endpoint) -> Member:
        """A replica's child, as the router sees it."""
        return cls(key, endpoint.host, endpoint.http_port, endpoint.grpc_port)


def haproxy_binary() -> str:
    """The haproxy executable, or a ConfigError saying how to install it."""
    found = shutil.which("haproxy")
    if found is None:
        raise ConfigError(
            "a fleet's router is HAProxy, and no `haproxy` is on PATH: install it "
            "(Debian/Ubuntu: apt-get install haproxy; `make test` does)"
        )
    return found


class HaproxyRouter:
    """One HAProxy process routing REST and gRPC over the members it is given."""

    def __init__(
        self,
        host: str,
        http_port: int,
        grpc_port: int | None,
        control: Control | None = None,
        routing: Routing | None = None,
        rules: ConnectionRules | None = None,
    ) -> None:
        self.host = host
        #: The per-client cap and each replica's share (scale/connections.py).
        self.rules = rules or ConnectionRules()
        #: Where the repository API's load and unload go instead of a replica (None: a replica).
        self.control = control
        #: Which models' generative requests are hashed, and the bound (scale/prefix.py).
        self.routing = routing or Routing()
        self._asked = {REST: http_port, GRPC: grpc_port}
        self._sockets: dict[str, socket.socket] = {}
        #: HAProxy's folder: its configuration, error pages, map and runtime socket.
        self.workdir = _workdir()
        self._process: subprocess.Popen[bytes] | None = None
        #: Slot number (1-based) of each member's key, and the members themselves.
        self._slots: dict[str, int] = {}
        self.members: dict[str, Member] = {}
        #: The weight set on each member (scale/weights.py); HAProxy's default until set.
        self.weights: dict[str, int] = {}
        #: The batch clock in the finish-first map, by server name (scale/finish.py).
        self.clocks: dict[str, str] = {}

    @property
    def ports(self) -> dict[str, int]:
        """The ports the router listens on, by protocol (http, grpc)."""
        names = {REST: "http", GRPC: "grpc"}
        return {names[p]: int(s.getsockname()[1]) for p, s in self._sockets.items()}

    def start(self, bind_patience_s: float = 0.0) -> None:
        """Bind the ports, write the configuration and start HAProxy; returns once it answers.

        `bind_patience_s`: how long a port still in use is tried again (a restarted router,
        whose predecessor's HAProxy is still closing the same ports). A start that fails
        leaves nothing behind: no socket, no process, no folder.
        """
        try:
            self._start(bind_patience_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, bind_patience_s: float) -> None:
        binary = haproxy_binary()
        for proto, port in self._asked.items():
            if port is not None:
                self._sockets[proto] = _listen(self.host, port, proto, bind_patience_s)
        fds = {p: s.fileno() for p, s in self._sockets.items()}
        config = self.workdir / "haproxy.cfg"
        prefix.write_map(routes_map(self.workdir), self.routing.routes)
        config.write_text(
            render(
                fds,
                self.workdir,
                self.control,
                self.routing.balance_factor,
                self.rules,
                ipv6=":" in self.host,
            )
        )
        write_errors(self.workdir)
        finish.write(self.workdir)
        self._process = spawn_dying_with_parent(
            [binary, "-db", "-f", str(config)], pass_fds=tuple(fds.values())
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise DlscaleError("HAProxy did not start (see its log above)")
            time.sleep(0.02)

    def _answers(self) -> bool:
        """Whether the runtime API accepts a connection. Its socket's file can be there
        before HAProxy accepts on it: the first command, sent as soon as the file appeared, was
        refused (ECONNREFUSED) on a loaded host (tests/integration/scale/test_fleet_router.py
        in a whole-suite run, the finish-first Lua script loading at start)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as admin:
            try:
                admin.connect(str(admin_socket(self.workdir)))
            except (FileNotFoundError, ConnectionRefusedError):
                return False
        return True

    def route(self, routes: Mapping[str, int]) -> None:
        """Hash the generative requests of exactly the models of `routes` (scale/prefix.py)."""
        commands = prefix.map_commands(routes_map(self.workdir), self.routing.routes, routes)
        if commands:
            self.command(*commands)
            self.routing = Routing(self.routing.balance_factor, dict(routes))
            log.info("router: by prefix or session: %s", ", ".join(sorted(routes)) or "none")

    def sync(self, members: Sequence[Member]) -> None:
        """Route to exactly `members`: new ones take a free slot, those gone are put in
        maintenance (requests on them finish; none is sent to them)."""
        wanted = {m.key: m for m in members}
        commands = []
        clocks: dict[str, str | None] = {}
        for key in [k for k in self.members if k not in wanted]:
            slot = self._slots.pop(key)
            del self.members[key]
            self.weights.pop(key, None)
            clocks[f"r{slot}"] = None
            commands += [f"set server {p}/r{slot} state maint" for p in _backends(self._sockets)]
            log.info("router: replica %s out of rotation", key)
        for key, member in wanted.items():
            if self.members.get(key) == member:
                continue
            slot = self._slots.get(key) or self._free_slot()
            self._slots[key] = slot
            self.members[key] = member
            self.weights.pop(key, None)  # _enable starts it at the most again
            clocks[f"r{slot}"] = finish.UNMEASURED  # leastconn routes until it is measured
            commands += _enable(slot, member, self._sockets)
            log.info("router: replica %s at %s:%d", key, member.host, member.http_port)
        commands += finish.map_commands(finish.map_path(self.workdir), self.clocks, clocks)
        if commands:
            self.command(*commands)
        self._note(clocks)

    def weigh(
        self, weights: Mapping[str, int], clocks: Mapping[str, tuple[float, int]] | None = None
    ) -> None:
        """Set members' weights (1-256; scale/weights.py): leastconn divides by them; and
        their batch clocks (seconds per batch, rows per batch) that finish-first routing reads
        (scale/finish.py). Members not named keep theirs."""
        changed = {
            key: weight
            for key, weight in weights.items()
            if key in self._slots and self.weights.get(key) != weight
        }
        commands = [
            f"set server {proto}/r{self._slots[key]} weight {weight}"
            for key, weight in changed.items()
            for proto in self._sockets
        ]
        timed: dict[str, str | None] = {
            f"r{self._slots[key]}": finish.clock(*clock)
            for key, clock in (clocks or {}).items()
            if key in self._slots
        }
        commands += finish.map_commands(finish.map_path(self.workdir), self.clocks, timed)
        if commands:
            self.command(*commands)
            self.weights.update(changed)
            self._note(timed)

    def _note(self, clocks: Mapping[str, str | None]) -> None:
        """The finish-first map as `clocks` left it (by server name; None: taken out)."""
        for name, value in clocks.items():
            if value is None:
                self.clocks.pop(name, None)
            else:
                self.clocks[name] = value

    def _free_slot(self) -> int:
        taken = set(self._slots.values())
        for slot in slots():
            if slot not in taken:
                return slot
        raise DlscaleError(f"the router holds at most {SLOTS} replicas")

    def command(self, *commands: str) -> str:
        """Run runtime-API commands (one connection; HAProxy answers each in turn)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as admin:
            admin.settimeout(5.0)
            admin.connect(str(admin_socket(self.workdir)))
            admin.sendall(("; ".join(commands) + "\n").encode())
            chunks = []
            while chunk := admin.recv(65536):
                chunks.append(chunk)
        answer = b"".join(chunks).decode(errors="replace")
        refused = [line for line in answer.splitlines() if _is_refusal(line)]
        if refused:
            raise DlscaleError(f"HAProxy refused {commands!r}: {refused[0]}")
        return answer

    def states(self) -> dict[str, str]:
        """Each member's state in the REST backend as HAProxy sees it (UP, DOWN, MAINT...)."""
        rows = self.command("show stat").splitlines()
        header = rows[0].lstrip("# ").split(",") if rows else []
        by_slot = {}
        for row in rows[1:]:
            fields = dict(zip(header, row.split(","), strict=False))
            if fields.get("pxname") == REST and fields.get("svname", "").startswith("r"):
                by_slot[fields["svname"]] = fields.get("status", "")
        return {key: by_slot.get(f"r{slot}", "") for key, slot in self._slots.items()}

    def stop(self) -> None:
        """Stop HAProxy (connections close) and release the ports."""
        end_child(self._process, 5.0)
        for sock in self._sockets.values():
            sock.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


#: The longest runtime socket path HAProxy 2.6 takes ("socket path ... too long (max 97)").
_MAX_SOCKET_PATH = 97


#: The router's folder in the temporary directory (dlscale.native.process_folder).
FOLDER_PREFIX = "dlscale-router-"


def _workdir() -> Path:
    """HAProxy's folder, in TMPDIR; under /tmp when TMPDIR is so deep that the runtime socket's
    path would pass HAProxy's limit (it would refuse to start)."""
    made = process_folder(FOLDER_PREFIX)
    if len(str(admin_socket(made))) <= _MAX_SOCKET_PATH:
        return made
    made.rmdir()
    return process_folder(FOLDER_PREFIX, "/tmp")


def _is_refusal(line: str) -> bool:
    # The runtime API answers nothing, or a sentence, to a command that worked; these to one
    # that did not.
    low = line.lower()
    return low.startswith(("unknown command", "no such", "require", "invalid")) or (
        "doesn't exist" in low or "not found" in low
    )


def _enable(slot: int, member: Member, sockets: dict[str, socket.socket]) -> list[str]:
    """The commands pointing slot `slot` of each backend at `member` and putting it in service."""
    commands = []
    for proto in _backends(sockets):
        port = member.grpc_port if proto in (GRPC, GRPC_HASHED) else member.http_port
        server = f"{proto}/r{slot}"
        if port is None:  # this replica has no gRPC port: its slot stays in maintenance
            commands.append(f"set server {server} state maint")
            continue
        commands.append(f"set server {server} addr {member.host} port {port}")
        # A slot keeps its last weight: a new replica starts at the most, to be measured. The
        # hashed backend's stay equal: a weight moves keys, and with them the caches they hit.
        if proto not in (HASHED, GRPC_HASHED):
            commands.append(f"set server {server} weight {MAX_WEIGHT}")
        commands.append(f"set server {server} state ready")
    return commands


def _backends(sockets: Mapping[str, socket.socket]) -> list[str]:
    """The backends whose slots follow the members: one per protocol, and its hashed one."""
    hashed = {REST: HASHED, GRPC: GRPC_HASHED}
    return [*sockets, *(hashed[p] for p in sockets)]


def _listen(host: str, port: int, proto: str, patience_s: float) -> socket.socket:
    """A listening socket for HAProxy to inherit (bound here, so port 0 picks a known port)."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            sock = bind(host, port, f"the router's {proto} frontend")
            break
        except DlscaleError as exc:
            in_use = isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EADDRINUSE
            if not in_use or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    sock.listen(4096)
    sock.set_inheritable(True)
    return sock
