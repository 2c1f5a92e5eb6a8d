"""HAProxy's configuration for a fleet's router: frontends, per-client caps, the replicas' backends
(weighted, and hashed by prefix or session), the control backend, and HAProxy's own error answers.

The text only: scale/haproxy.py runs the process and drives it over its runtime API.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

from dlscale.scale import finish, prefix
from dlscale.scale.connections import QUEUE_TIMEOUT_S, TABLE_SIZE, ConnectionRules
from dlscale.server_settings import DEFAULT_BALANCE_FACTOR

#: The most replicas one router holds (slots of the server template, per protocol).
SLOTS = 64
# A replica that died refuses connections: its first refused connection takes it out of
# rotation at once (`observe layer4`). The other failures these bound were, in every case seen,
# a starved host's and not a dead replica's; on a host that is up the kernel makes a connection
# at once, so a connection "timed out" is HAProxy itself not run for a while. Beside six
# CPU-burning processes, floods of 320 requests on a one-replica Ray fleet lost the replica to
# 40 requests' connections counted as timed out at once (at 2 s), and failed checks whose
# connection took over 250 ms (HAProxy waits for a check's connection at most the interval
# between checks); the slowest check that passed took 3.5 s (docs/scale.md, "Routing by work").
#: Milliseconds between two health checks of a replica, and the most one waits to connect.
CHECK_INTER_MS = 1000
#: Seconds a replica's health check may take once connected before it counts as failed (two in
#: a row take it out of rotation): a hung replica leaves within about 20 s, before Ray Serve's
#: own check (30 s, scale/deploy.py) replaces it. At 2 s, 23 of 2,560 requests of eight floods
#: beside four burners met "no replica is ready to serve".
CHECK_TIMEOUT_S = 10.0
#: Seconds a request's connection to a replica may take before it counts as failed.
CONNECT_TIMEOUT_S = 10.0
REST, GRPC = "rest", "grpc"


@dataclass(frozen=True)
class Control:
    """The fleet's control endpoint: it takes the repository API's load and unload (and the
    fleet's own view) and applies them to every replica, so that all serve the same models."""

    host: str
    http_port: int
    grpc_port: int | None = None


#: REST paths the control endpoint answers: a model's load and unload, and the fleet's view.
CONTROL_PATH = r"^/v2/repository/models/[^/]+/(load|unload)$"
FLEET_PATH = "/dlscale/fleet"
#: gRPC methods the control endpoint answers (HTTP/2's :path of each call).
CONTROL_RPCS = (
    "/inference.GRPCInferenceService/RepositoryModelLoad",
    "/inference.GRPCInferenceService/RepositoryModelUnload",
)


def admin_socket(workdir: Path) -> Path:
    """Where HAProxy's runtime API listens."""
    return workdir / "admin.sock"


def routes_map(workdir: Path) -> Path:
    """Where the router's map of routed models lives (scale/prefix.py)."""
    return workdir / "routes.map"


def render(
    fds: dict[str, int],
    workdir: Path,
    control: Control | None = None,
    balance_factor: int = DEFAULT_BALANCE_FACTOR,
    rules: ConnectionRules | None = None,
    *,
    ipv6: bool = False,
) -> str:
    """HAProxy's configuration: a frontend per bound socket, a backend of SLOTS servers each,
    the hashed backends (scale/prefix.py), and the control backend where one is given."""
    rules = rules or ConnectionRules()
    lines = [
        "global",
        f"  stats socket {admin_socket(workdir)} mode 600 level admin",
        f"  maxconn {_max_connections()}",
        *finish.global_lines(workdir),
        "defaults",
        "  mode http",
        f"  timeout connect {CONNECT_TIMEOUT_S:g}s",
        # A replica slow to answer its check (a loaded host) is not dead: CHECK_TIMEOUT_S.
        f"  timeout check {CHECK_TIMEOUT_S:g}s",
        # Inference may be long (a generative stream, a large batch): the replica's own
        # deadlines bound a request, not the router.
        "  timeout client 1h",
        "  timeout server 1h",
        "  timeout http-keep-alive 60s",
        # A request head that does not come is not waited for an hour (a refused connection
        # holds its 503 until the client asks): the replicas' own head timeout.
        f"  timeout http-request {rules.head_timeout_s:g}s",
        # A request waits here while every replica has its `maxconn` (scale/connections.py).
        f"  timeout queue {QUEUE_TIMEOUT_S:g}s",
        "  option http-keep-alive",
        "  retries 2",
        "  option redispatch 1",
        # Safe to repeat: the replica closed without a byte of answer (it died or refused).
        "  retry-on conn-failure empty-response",
        *(f"  errorfile {code} {workdir / f'{code}.http'}" for code in _ERRORS),
    ]
    for proto, fd in fds.items():
        bind = f"fd@{fd}" + (" proto h2" if proto == GRPC else "")
        lines += [f"frontend {proto}", f"  bind {bind}", *_client_cap(proto, rules, ipv6)]
        if proto == REST:  # its http-request rules come before any use_backend
            lines += prefix.frontend_rules(routes_map(workdir))
        lines += _control_rules(proto, control)
        if proto == GRPC:  # after the control rules: a load carrying a session is still one
            lines += prefix.grpc_frontend_rules()
        lines.append(f"  default_backend {proto}")
    # Every replica's REST port is checked (its /v2/health/ready), and its gRPC server follows
    # that check (`track`): one meaning of "up" for both protocols.
    lines += [
        f"backend {REST}",
        *_BALANCE,
        *finish.backend_lines(),
        "  option httpchk GET /v2/health/ready",
        "  http-check expect status 200",
        f"  default-server check inter {CHECK_INTER_MS} fall 2 rise 1 "
        f"observe layer4 error-limit 1 on-error mark-down maxconn {rules.per_replica}",
        f"  server-template r 1-{SLOTS} 127.0.0.1:9 disabled",
        f"backend {GRPC}",
        *_BALANCE,
        *finish.backend_lines(),
        f"  default-server maxconn {rules.per_replica}",
        *(f"  server r{i} 127.0.0.1:9 disabled proto h2 track {REST}/r{i}" for i in slots()),
        *prefix.backend(balance_factor, slots(), REST, rules.per_replica),
        *(
            prefix.backend(balance_factor, slots(), REST, rules.per_replica, grpc=True)
            if GRPC in fds
            else []
        ),
    ]
    return "\n".join(lines + _control_backends(control)) + "\n"


def _client_cap(proto: str, rules: ConnectionRules, ipv6: bool) -> list[str]:
    """A frontend's per-client rule: each source address's open connections are counted
    (HAProxy 2.6's configuration.txt: 4.2 "stick-table" and "tcp-request connection", 7.3.3
    "sc0_conn_cur"), and one past the cap is refused: a REST client's request gets the one
    server's 503 JSON (4.2 "http-request deny"; its connection is then closed), a gRPC
    connection is closed at once."""
    cap = rules.per_client
    if not cap:
        return []
    lines = [
        f"  stick-table type {'ipv6' if ipv6 else 'ip'} size {TABLE_SIZE} expire 60s "
        "store conn_cur",
        "  tcp-request connection track-sc0 src",
    ]
    over = f"{{ sc0_conn_cur gt {cap} }}"
    if proto == GRPC:  # an HTTP/2 refusal would be per call; the connection is what is capped
        return [*lines, f"  tcp-request connection reject if {over}"]
    why = (
        f"this client (%[src]) holds its maximum of {cap} connections "
        "(max_connections_per_peer, at the fleet router); reuse or close one; try again later"
    )
    return [
        *lines,
        # Before every other rule: a refused request goes nowhere. Single quotes: HAProxy reads
        # `$` in double quotes as an environment variable, and the JSON holds double quotes.
        f"  http-request deny status 503 content-type application/json lf-string "
        f'\'{{"error": "{why}"}}\' hdr retry-after 1 hdr connection close if {over}',
    ]


def _max_connections() -> int:
    """Connections HAProxy may hold: each takes two descriptors (client and replica side)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit = hard if hard != resource.RLIM_INFINITY else 1 << 20
    return max(256, min(20000, limit // 2 - 200))


#: How each backend picks a replica when the finish-first rule does not (scale/finish.py): the
#: fewest requests in flight, divided by the weights (scale/weights.py).
_BALANCE = ("  balance leastconn", "  http-reuse always")


def slots() -> range:
    return range(1, SLOTS + 1)


#: HAProxy's own answers, as the Open Inference Protocol's error shape; all retryable.
_ERRORS = {
    502: "no replica answered this request",
    503: "no replica is ready to serve",
    504: "the replica did not answer in time",
}


def write_errors(workdir: Path) -> None:
    """HAProxy's own answers (the `errorfile`s `render` names), written where it reads them."""
    for code, why in _ERRORS.items():
        body = f'{{"error": "{why}: retry"}}'
        # A 502 from a replica that died is retryable, so every one is a 503 with Retry-After.
        (workdir / f"{code}.http").write_text(
            "HTTP/1.1 503 Service Unavailable\r\n"
            "content-type: application/json\r\n"
            "retry-after: 1\r\n"
            f"content-length: {len(body)}\r\n"
            "connection: close\r\n"
            "\r\n"
            f"{body}"
        )


def _control_rules(proto: str, control: Control | None) -> list[str]:
    """A frontend's rules sending the control requests to the control backend."""
    if control is None or (proto == GRPC and control.grpc_port is None):
        return []
    if proto == REST:
        return [
            # Single quotes: HAProxy reads `$` in double quotes as an environment variable.
            f"  acl control path_reg '{CONTROL_PATH}'",
            f"  acl control path {FLEET_PATH}",
            "  use_backend control_rest if control",
        ]
    return [f"  acl control path {' '.join(CONTROL_RPCS)}", "  use_backend control_grpc if control"]


def _control_backends(control: Control | None) -> list[str]:
    """One backend per protocol, of the control endpoint alone (no retry: a load is not
    repeated behind the client's back)."""
    if control is None:
        return []
    lines = [
        "backend control_rest",
        "  retries 0",
        f"  server c {control.host}:{control.http_port}",
    ]
    if control.grpc_port is not None:
        lines += [
            "backend control_grpc",
            "  retries 0",
            f"  server c {control.host}:{control.grpc_port} proto h2",
        ]
    return lines
