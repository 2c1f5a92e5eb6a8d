"""A fleet's replica on Ray Serve: a whole `dlscale serve` in a child process, on its own ports.

Ray Serve places, health-checks, restarts and rolls out these replicas (one deployment,
application `dlscale`); no request goes through Ray: each replica starts a ServerChild (the
single-host server, with its batcher, shared memory, streams and OpenAI routes) bound to its
node's address, tells the fleet's router actor where it listens (router_actor.py), replays the
repository's loads and unloads, and from then on is routed to by HAProxy. Its health check
fails when its child died or stopped being ready, so Ray replaces it. The child inherits the
actor's environment: CUDA_VISIBLE_DEVICES, set by Ray for a replica given GPUs, reaches it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from typing import Any

import httpx
import ray
from ray import serve

from dlscale.scale import control
from dlscale.scale.child import Endpoint, ServerChild
from dlscale.scale.connections import behind_router
from dlscale.scale.control import Entry
from dlscale.scale.figures_reader import FiguresReader
from dlscale.scale.registry import CHILD_START_S, HAND_OVER_MAX_S, HAND_OVER_S, HEARTBEAT_S
from dlscale.scale.router_actor import ROUTER_NAME, ROUTER_NAMESPACE

log = logging.getLogger("dlscale.scale")
#: Seconds a call to the router actor may take (it may be restarting) before trying again.
ROUTER_CALL_S = 10.0
#: Seconds the child's readiness may take to answer Ray's health check.
READY_CHECK_S = 20.0


class FleetReplica:
    """One replica: its child server, its registration with the router, its heartbeat."""

    # Ray Serve awaits an async constructor on the replica's event loop, where the heartbeat
    # then runs.
    async def __init__(self, settings: Any) -> None:  # type: ignore[misc]
        self.key = serve.get_replica_context().replica_id.unique_id
        self.node = ray.get_runtime_context().get_node_id()
        host = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        # The router holds each client to the per-peer cap; here it is the one peer.
        self.child = ServerChild(behind_router(settings).replace(host=host))
        self.repository = settings.repository
        self._stopping = threading.Event()
        self._leaving = asyncio.Event()
        self.figures: FiguresReader | None = None  # the autoscaler's, from Ray's first call
        self._reading: asyncio.Task[None] | None = None
        self._beat: asyncio.Task[None] | None = None  # from its join on
        self.router = ray.get_actor(ROUTER_NAME, namespace=ROUTER_NAMESPACE)
        # The replica it replaces, if any, keeps serving while this one starts (`_hand_over`).
        # The loads recorded so far are read by the child's start: its replay skips them.
        self.read_up_to: int = await self._tell("starting") or 0
        try:
            await self._start()
        except BaseException:  # no successor after all: the replica it replaces need not wait
            await self._leave()
            raise

    async def _start(self) -> None:
        """Start the child, join the router, replay the repository's loads and unloads, and
        say it is ready: into rotation. It beats from its join: a replica silent for long is
        dropped by the router, and one replaying loads is a successor the one it replaces
        waits for (`_hand_over`)."""
        self.endpoint: Endpoint = await asyncio.wrap_future(self._start_child())
        self.ready = False
        self.entries: list[Entry] = await self._call("join", self.key, self.node, self.endpoint)
        self._beat = asyncio.get_running_loop().create_task(self._heartbeat())
        failed = await control.replay(self.entries, self.endpoint, self.read_up_to)
        for why in failed:  # the model's own error: the repository index shows it
            log.warning("replica %s: replaying %s", self.key, why)
        await self._call("ready", self.key)
        self.ready = True

    def _start_child(self) -> concurrent.futures.Future[Endpoint]:
        """Start the child from a thread that lives as long as this replica.

        The child dies with its parent (PR_SET_PDEATHSIG), and Linux reads "parent" as the
        *thread* that started it: a child started from a pool's thread was killed when that
        thread ended (seen when a redeploy reached the replica).
        """
        started: concurrent.futures.Future[Endpoint] = concurrent.futures.Future()

        def run() -> None:
            try:
                started.set_result(self.child.start(CHILD_START_S))
            except BaseException as exc:  # said to the constructor, which raises it
                started.set_exception(exc)
                return
            self._stopping.wait()

        threading.Thread(target=run, name="dlscale-child", daemon=True).start()
        return started

    async def _call(self, method: str, *args: Any) -> Any:
        return await asyncio.wait_for(
            getattr(self.router, method).remote(*args), timeout=ROUTER_CALL_S
        )

    async def _tell(self, method: str) -> Any:
        """Tell the router what happens to this replica, if it hears (one restarting learns
        of it from the join or the heartbeats that follow); its answer, None if it did not."""
        with contextlib.suppress(Exception):
            return await self._call(method, self.key)
        return None

    async def _heartbeat(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._leaving.wait(), HEARTBEAT_S)
                return  # stopping: `__del__` waits for this beat before it leaves
            if not self.child.alive():
                await self._tell("leave")
                return  # Ray's next health check replaces this replica
            try:
                await self._beat_once()
            except Exception as exc:  # the router restarting: its next life hears the next one
                log.info("replica %s: heartbeat not heard (%s)", self.key, exc)

    async def _beat_once(self) -> None:
        mine = max((e.seq for e in self.entries), default=0)
        theirs = await self._call("heartbeat", self.key, self.node, self.endpoint, self.ready, mine)
        if theirs > mine:  # loads or unloads since this replica joined: keep the router's copy
            self.entries = await self._call("entries")
        elif theirs < mine:  # the router restarted and lost them: hand it this copy
            await self._call("adopt", self.entries)

    async def check_health(self) -> None:
        """Ray Serve's probe: a replica whose child died or is not ready is replaced."""
        if not self.child.alive():
            raise RuntimeError(f"replica {self.key}: its server process exited")
        url = f"http://{self.endpoint.host}:{self.endpoint.http_port}/v2/health/ready"
        async with httpx.AsyncClient(timeout=READY_CHECK_S) as client:
            ready = await client.get(url)
        if ready.status_code != 200:
            raise RuntimeError(f"replica {self.key}: its server is not ready ({ready.status_code})")

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """The autoscaler's figures (scale/autoscale.py), as last read (scale/figures_reader.py):
        Ray Serve's call never waits on the server. Ray calls it only on an autoscaled fleet:
        its first call starts the reading (a fixed fleet reads nothing), as does a call after
        the reading stopped for want of calls."""
        e = self.endpoint
        if e.metrics_port is None:  # refused with --autoscale (scale/commands.py)
            return {}
        if self.figures is None or self._reading is None or self._reading.done():
            self.figures = FiguresReader(
                f"http://{e.host}:{e.http_port}/v2/models/stats",
                f"http://{e.host}:{e.metrics_port}/metrics",
                self.repository,
            )
            self._reading = asyncio.get_running_loop().create_task(self.figures.run(self._leaving))
        return self.figures.latest()

    async def __del__(self) -> None:
        """Ray Serve's graceful stop: out of rotation, then the child finishes its requests."""
        await self.drain()
        await asyncio.to_thread(self.child.stop)
        self._stopping.set()

    async def _hand_over(self) -> None:
        """While this is the only replica in rotation and the fleet is not being deleted, keep
        serving until a successor is in rotation: for as long as the router says one may still
        come (`holds`: HAND_OVER_S while none said it starts, up to HAND_OVER_MAX_S once one
        did), or Ray Serve has one starting that cannot say so yet. A router that is gone lets
        it go at once; one slow to answer is asked again."""
        loop = asyncio.get_running_loop()
        began, bound, said, asked_ray, ray_starts = loop.time(), HAND_OVER_S, 0.0, 0.0, False
        while loop.time() - began < bound:
            try:
                bound = await self._call("holds", self.key)
            except TimeoutError:
                continue
            except Exception:  # the router actor died, and its HAProxy with it
                return
            if not bound:
                return
            if not ray_starts and loop.time() - asked_ray >= RAY_ASKED_S:
                asked_ray, ray_starts = loop.time(), await _ray_starts_a_replica()
            bound = max(bound, HAND_OVER_MAX_S) if ray_starts else bound
            if bound != said:
                said = bound
                log.info(
                    "replica %s: the only one in rotation, serving until its successor is "
                    "(at most %.0f s: %s)", self.key, bound,
                    "a successor is starting" if bound > HAND_OVER_S else "none started yet",
                )  # fmt: skip
            await asyncio.sleep(HEARTBEAT_S)
        log.warning(
            "replica %s: no successor in rotation after %.0f s, leaving",
            self.key, loop.time() - began,
        )  # fmt: skip

    async def drain(self) -> None:
        """Hand over if this is the last replica in rotation, then leave the router before the
        child stops."""
        if self._beat is not None:  # None when the constructor failed before its join
            await self._hand_over()
            await self._leave()

    async def _leave(self) -> None:
        """Leave the router. The router actor runs calls concurrently, so a heartbeat still on
        its way could be heard after `leave` and put this replica back in rotation: the
        heartbeat stops first, its last beat answered."""
        self._leaving.set()
        if self._beat is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._beat, ROUTER_CALL_S + HEARTBEAT_S)
        await self._tell("leave")


#: Seconds between two questions to Ray Serve's controller while a last replica waits.
RAY_ASKED_S = 5.0


async def _ray_starts_a_replica() -> bool:
    """Whether Ray Serve has a replica of this deployment STARTING that the cluster has room
    for: a successor Ray has not placed yet (waiting for a worker process, which took over 60 s
    on a loaded 2-core host, docs/testing.md) says nothing to the router until its constructor
    runs. One waiting for the resources this replica holds (a GPU each, one GPU) waits on it:
    the hold must not grow for that one."""
    context = serve.get_replica_context()
    held: dict[str, float] = ray.get_runtime_context().get_assigned_resources()  # type: ignore[no-untyped-call]
    try:
        status, free = await asyncio.gather(
            asyncio.to_thread(serve.status), asyncio.to_thread(ray.available_resources)
        )
        deployment = status.applications[context.app_name].deployments[context.deployment]
    except Exception:  # no answer from the controller: only the router's word counts
        return False
    room = all(free.get(name, 0.0) >= amount for name, amount in held.items())
    states = {getattr(k, "value", k): n for k, n in deployment.replica_states.items()}
    return room and states.get("STARTING", 0) > 0
