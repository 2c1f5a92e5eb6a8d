"""The fleet's registry: which replicas live and where they listen, kept in step with HAProxy.

Replicas report themselves (`join`, then a heartbeat every HEARTBEAT_S); one whose heartbeats
stop for STALE_S (its actor died, its node went away) or that says it leaves is taken out of
HAProxy's rotation. A replica is routed to only once it said it is `ready` (its models are
loaded and it replayed the repository's loads and unloads, scale/control.py), but it receives
those loads and unloads from the moment it joins. No Ray here: the router actor (router_actor.py)
holds one, and its state is rebuilt from the next heartbeats when Ray restarts the actor.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from dlscale.scale.child import Endpoint
from dlscale.scale.haproxy import HaproxyRouter, Member
from dlscale.scale.weights import Weigher, read_each

log = logging.getLogger("dlscale.scale")

#: Seconds between two heartbeats of a replica.
HEARTBEAT_S = 0.5
#: Seconds without a heartbeat after which a replica is taken out of rotation (ten beats: a
#: busy event loop may delay a few; HAProxy's own check takes a dead server out sooner).
STALE_S = 5.0


@dataclass
class Replica:
    """A replica as the registry knows it."""

    key: str
    #: The Ray node it runs on (its id), for the fleet's view and the metrics' `node` label.
    node: str
    endpoint: Endpoint
    ready: bool = False
    seen: float = 0.0

    def member(self) -> Member:
        """The replica as HAProxy routes to it."""
        e = self.endpoint
        return Member(self.key, e.host, e.http_port, e.grpc_port)

    def view(self, state: str) -> dict[str, object]:
        """The replica in the fleet's JSON view."""
        e = self.endpoint
        return {
            "replica": self.key, "node": self.node, "host": e.host, "pid": e.pid,
            "http_port": e.http_port, "grpc_port": e.grpc_port, "metrics_port": e.metrics_port,
            "ready": self.ready, "router_state": state,
        }  # fmt: skip


class Registry:
    """The live replicas; every change is pushed to HAProxy at once (thread-safe)."""

    def __init__(self, router: HaproxyRouter) -> None:
        self.router = router
        self._replicas: dict[str, Replica] = {}
        self._lock = threading.Lock()
        self.weigher = Weigher()

    def join(self, key: str, node: str, endpoint: Endpoint) -> None:
        """A replica whose child serves: it gets loads and unloads from now on, no requests."""
        with self._lock:
            self._replicas[key] = Replica(key, node, endpoint, seen=time.monotonic())
        log.info("replica %s joined from %s:%d", key, endpoint.host, endpoint.http_port)

    def ready(self, key: str) -> None:
        """The replica serves the repository's models: into rotation."""
        with self._lock:
            if key in self._replicas:
                self._replicas[key].ready = True
                self._replicas[key].seen = time.monotonic()
            self._sync()

    def heartbeat(self, key: str, node: str, endpoint: Endpoint, ready: bool) -> None:
        """The replica lives; after a restart of the router, this is how it is known again."""
        with self._lock:
            replica = self._replicas.get(key)
            if replica is None or replica.endpoint != endpoint:
                replica = self._replicas[key] = Replica(key, node, endpoint, ready)
                log.info("replica %s known again from its heartbeat", key)
            replica.seen, changed = time.monotonic(), replica.ready != ready
            replica.ready = ready
            if changed or key not in self.router.members:
                self._sync()

    def leave(self, key: str) -> None:
        """The replica stops: out of rotation (its requests in flight finish)."""
        with self._lock:
            if self._replicas.pop(key, None) is not None:
                log.info("replica %s left", key)
            self._sync()

    def sweep(self) -> None:
        """Drop the replicas whose heartbeats stopped."""
        now = time.monotonic()
        with self._lock:
            stale = [k for k, r in self._replicas.items() if now - r.seen > STALE_S]
            for key in stale:
                log.warning("replica %s: no heartbeat for %.0f s, out of rotation", key, STALE_S)
                del self._replicas[key]
            if stale:
                self._sync()

    def endpoints(self) -> list[Endpoint]:
        """Where each joined replica listens (loads and unloads go to all of them)."""
        with self._lock:
            return [r.endpoint for r in self._replicas.values()]

    def replicas(self) -> list[Replica]:
        """A copy of the joined replicas."""
        with self._lock:
            return [Replica(**vars(r)) for r in self._replicas.values()]

    def view(self) -> list[dict[str, object]]:
        """Each joined replica and HAProxy's word on it (UP, DOWN, MAINT...)."""
        with self._lock:
            states = self.router.states()
            return [r.view(states.get(k, "")) for k, r in self._replicas.items()]

    def weigh(self) -> None:
        """Set each ready replica's weight from the work it measured (scale/weights.py)."""
        with self._lock:
            where = {
                k: (r.endpoint.host, r.endpoint.http_port)
                for k, r in self._replicas.items()
                if r.ready
            }
        readings = read_each(where)  # outside the lock: HTTP to each replica
        with self._lock:
            self.router.weigh(self.weigher.weights(readings), self.weigher.clocks())

    def _sync(self) -> None:
        self.router.sync([r.member() for r in self._replicas.values() if r.ready])
