"""The fleet's registry: which replicas live and where they listen, kept in step with HAProxy.

Replicas report themselves (`join`, then a heartbeat every HEARTBEAT_S). One that says it
leaves, or whose heartbeats stop for STALE_S while HAProxy's health checks fail it too (its
actor died and its server with it, its node went away), is taken out of HAProxy's rotation. A
replica whose server still answers those checks stays in rotation until ANSWERING_STALE_S: a
starved host delays the Ray calls that carry heartbeats long before it stops a server answering
(a CI run beside two CPU burners lost its only replica for such a gap, and answered 503s).
A replica is routed to only once it said it is `ready` (its models are loaded and it replayed
the repository's loads and unloads, scale/control.py), but it receives those loads and unloads
from the moment it joins. No Ray here: the router actor (router_actor.py) holds one, and its
state is rebuilt from the next heartbeats when Ray restarts the actor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dlscale.scale.child import Endpoint
from dlscale.scale.haproxy import HaproxyRouter, Member
from dlscale.scale.weights import Weigher, read_each

log = logging.getLogger("dlscale.scale")

#: Seconds between two heartbeats of a replica.
HEARTBEAT_S = 0.5
#: Seconds a replica's child gets to start and load its models (scale/fleet.py).
CHILD_START_S = 600.0
#: The most seconds a stopping replica, the only one in rotation, keeps serving while no
#: successor has said it is starting (scale/fleet.py `_hand_over`): Ray places the successor's
#: actor while the old one stops, and it says so before it starts its child (its constructor
#: ran 0.6 s after the old one began to stop, beside two CPU burners on a 2-core host).
HAND_OVER_S = 60.0
#: The most seconds that replica keeps serving once a successor said it is starting: as long as
#: the successor's start may take (its child's CHILD_START_S, then its join and replay). Beside
#: two CPU burners a successor took 39 s in one run and about 113 s in another, and the fixed
#: 60 s bound of before let its clients meet 503s for the rest (docs/testing.md).
HAND_OVER_MAX_S = CHILD_START_S + HAND_OVER_S
#: Seconds without a heartbeat after which a replica HAProxy does not see UP is taken out of
#: rotation (ten beats: a busy event loop may delay a few; HAProxy's own check takes a dead
#: server out sooner, and it is forgotten here).
STALE_S = 5.0
#: Seconds without a heartbeat after which a replica is taken out even while its server answers
#: HAProxy's checks: its actor is gone or hung, and the repository's loads no longer reach it.
ANSWERING_STALE_S = 30.0


@dataclass
class Replica:
    """A replica as the registry knows it."""

    key: str
    #: The Ray node it runs on (its id), for the fleet's view and the metrics' `node` label.
    node: str
    endpoint: Endpoint
    ready: bool = False
    seen: float = 0.0

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

    def __init__(self, router: HaproxyRouter, clock: Callable[[], float] = time.monotonic) -> None:
        self.router = router
        self.clock = clock
        self._replicas: dict[str, Replica] = {}
        #: Replicas that said they are starting and have not joined yet, and since when.
        self._starting: dict[str, float] = {}
        self._lock = threading.Lock()
        self.weigher = Weigher()

    def starting(self, key: str) -> None:
        """A replica's actor runs and is starting its child: a successor on its way."""
        with self._lock:
            self._starting[key] = self.clock()

    def join(self, key: str, node: str, endpoint: Endpoint) -> None:
        """A replica whose child serves: it gets loads and unloads from now on, no requests."""
        with self._lock:
            self._starting.pop(key, None)
            self._replicas[key] = Replica(key, node, endpoint, seen=self.clock())
        log.info("replica %s joined from %s:%d", key, endpoint.host, endpoint.http_port)

    def ready(self, key: str) -> None:
        """The replica serves the repository's models: into rotation."""
        with self._lock:
            if key in self._replicas:
                self._replicas[key].ready = True
                self._replicas[key].seen = self.clock()
            self._sync()

    def heartbeat(self, key: str, node: str, endpoint: Endpoint, ready: bool) -> None:
        """The replica lives; after a restart of the router, this is how it is known again."""
        with self._lock:
            replica = self._replicas.get(key)
            if replica is None or replica.endpoint != endpoint:
                replica = self._replicas[key] = Replica(key, node, endpoint, ready)
                log.info("replica %s known again from its heartbeat", key)
            # A beat sent before its `ready` call may be heard after it: ready stays ready.
            ready = replica.ready or ready
            replica.seen, changed = self.clock(), replica.ready != ready
            replica.ready = ready
            if changed or key not in self.router.members:
                self._sync()

    def leave(self, key: str) -> None:
        """The replica stops, or failed to start: out of rotation (its requests in flight
        finish)."""
        with self._lock:
            self._starting.pop(key, None)
            if self._replicas.pop(key, None) is not None:
                log.info("replica %s left", key)
            self._sync()

    def sweep(self) -> None:
        """Drop the replicas whose heartbeats stopped: at STALE_S where HAProxy's checks fail
        them too, at ANSWERING_STALE_S where their servers still answer or where they are not
        ready yet (out of rotation all the same, a replica replaying loads is a successor that
        the replica it replaces waits for: `hand_over`)."""
        now = self.clock()
        with self._lock:
            late = {k: now - r.seen for k, r in self._replicas.items() if now - r.seen > STALE_S}
            if not late:
                return
            states = self.router.states()  # HAProxy's own checks (a call to its admin socket)
            dropped = False
            for key, silent in late.items():
                answering = _up(states.get(key, ""))
                if (answering or not self._replicas[key].ready) and silent <= ANSWERING_STALE_S:
                    continue  # its heartbeats are late, its server is not, or it is starting
                dropped = True
                log.warning(
                    "replica %s: no heartbeat for %.0f s%s, out of rotation",
                    key, silent, " (its server answers HAProxy's checks)" if answering else "",
                )  # fmt: skip
                del self._replicas[key]
            if dropped:
                self._sync()

    def endpoints(self) -> list[Endpoint]:
        """Where each joined replica listens (loads and unloads go to all of them)."""
        with self._lock:
            return [r.endpoint for r in self._replicas.values()]

    def replicas(self) -> list[Replica]:
        """A copy of the joined replicas."""
        with self._lock:
            return [Replica(**vars(r)) for r in self._replicas.values()]

    def in_rotation(self) -> set[str]:
        """The replicas HAProxy routes to: ready, and UP by its own checks."""
        with self._lock:
            states = self.router.states()
            return {k for k, r in self._replicas.items() if r.ready and _up(states.get(k, ""))}

    def hand_over(self, key: str) -> float:
        """How long the stopping replica `key` may keep serving, from when it began to stop:
        0 when it is not the only replica in rotation; HAND_OVER_MAX_S while another replica
        is on its way (said it is starting, or joined and not in rotation yet); else
        HAND_OVER_S, for Ray to place a successor."""
        rotation = self.in_rotation()
        if rotation != {key}:
            return 0.0
        with self._lock:
            now = self.clock()
            for other, since in list(self._starting.items()):
                if now - since > HAND_OVER_MAX_S:  # its start failed without a word
                    del self._starting[other]
            coming = set(self._starting) | (set(self._replicas) - rotation)
        return HAND_OVER_MAX_S if coming - {key} else HAND_OVER_S

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
        self.router.sync([Member.of(k, r.endpoint) for k, r in self._replicas.items() if r.ready])


def _up(state: str) -> bool:
    """Whether HAProxy's state of a server routes to it: "UP", or "UP 1/2" (one failed check of
    the two that take it down, which a loaded host sees)."""
    return state.startswith("UP")
