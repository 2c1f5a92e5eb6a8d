"""A fleet's connection rules: the per-client cap at its router, none at its replicas.

Behind the router every connection reaches a replica from HAProxy's address, so a replica's own
`max_connections_per_peer` would cap the whole fleet's traffic to it, and would refuse its
health check (which comes from the same address) once clients filled it. The rule therefore
moves to where the client's address is known: HAProxy's frontends count each source address's
connections (a stick-table, `conn_cur`) and refuse those past the cap; the replicas take the
router's connections uncapped, and HAProxy sends each replica fewer requests at once than its
`max_connections`, so that excess requests queue in the router (bounded in time) and the
health checks keep connections of their own (docs/scale.md, "Connections in a fleet").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlscale.frontends.limits import Limits

if TYPE_CHECKING:
    from dlscale.server_settings import ServerSettings

#: Connections to a replica HAProxy never takes for requests: its health check (one at a time),
#: Ray's probe, the fleet's scrapes of metrics and stats.
CHECK_ROOM = 16
#: Seconds a request waits in the router for a replica under its cap before a 503.
QUEUE_TIMEOUT_S = 30.0
#: Source addresses a frontend's table holds (about 60 bytes each); beyond, new ones go uncounted.
TABLE_SIZE = 1_000_000


@dataclass(frozen=True)
class ConnectionRules:
    """What the router holds clients and replicas to (from the fleet's --max-connections*)."""

    #: Open connections one client address may hold, per protocol (0: no cap).
    per_client: int = Limits().max_connections_per_peer
    #: The replicas' own --max-connections (each protocol's).
    replica_connections: int = Limits().max_connections
    #: Seconds a client's request head may take (the replicas' --head-timeout-s).
    head_timeout_s: float = Limits().head_timeout_s

    @classmethod
    def of(cls, settings: ServerSettings | None) -> ConnectionRules:
        """The rules of a fleet whose replicas are given `settings` (None: the defaults)."""
        if settings is None:
            return cls()
        limits = settings.limits
        return cls(limits.max_connections_per_peer, limits.max_connections, limits.head_timeout_s)

    @property
    def per_replica(self) -> int:
        """Requests HAProxy sends one replica at once (`maxconn`): its connections less the
        room kept for checks, so neither a request nor a check is ever refused by it."""
        room = min(CHECK_ROOM, self.replica_connections // 2)
        return max(1, self.replica_connections - room)


def behind_router(settings: ServerSettings) -> ServerSettings:
    """A replica's settings: no per-peer cap (the router is its one peer, and holds each client
    to the cap itself)."""
    return settings.replace(max_connections_per_peer=0)
