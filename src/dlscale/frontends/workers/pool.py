"""REST served by N worker processes on one port, answered by this process's Plane.

When one event loop is the limit (HTTP parsing and decoding of large bodies), `dlscale serve
--http-workers N` starts N processes (worker.py) that listen on the same port (SO_REUSEPORT; the
kernel spreads connections over them) and forward each request to the process that owns the
models (host.py), whose DataPlane validates, schedules and batches it like any other. This
process binds the port first (without listening) so that port 0 picks one port for all and a
restarted worker finds it again. A worker that dies is restarted; whatever shared memory it left
is removed; the others keep serving. `stop` stops them all gracefully, then removes every segment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field, replace

from dlscale.errors import DlscaleError
from dlscale.frontends import GRACE_S
from dlscale.frontends.plane import Plane
from dlscale.frontends.sockets import bind
from dlscale.frontends.workers.host import PlaneHost
from dlscale.frontends.workers.process import WorkerConfig
from dlscale.wire import segments

log = logging.getLogger("dlscale.http")
#: Seconds a worker gets to listen after it started.
START_TIMEOUT_S = 60.0
#: Seconds before a worker that died is started again.
RESTART_DELAY_S = 0.5


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen[bytes]
    host: PlaneHost
    task: asyncio.Task[None] = field(init=False)


class HttpWorkers:
    """The REST frontend as `count` worker processes (a Frontend to the Server)."""

    def __init__(self, plane: Plane, config: WorkerConfig, count: int) -> None:
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        self.plane = plane
        self.config = config
        self.count = count
        self.prefix = segments.scope_prefix(f"http{id(self):x}")
        self.workers: dict[int, _Worker] = {}
        self.restarts = 0
        self._reserved: socket.socket | None = None
        self._stopping = False

    async def start(self) -> None:
        """Reserve the port, start the workers and return once every one listens."""
        # Bound, not listening: it holds the port for the workers (SO_REUSEPORT).
        self._reserved = bind(self.config.host, self.config.port, "REST", reuse_port=True)
        self.config = replace(self.config, port=self._reserved.getsockname()[1])
        try:
            for index in range(self.count):
                worker = self._spawn(index)
                await self._listening(worker)
        except BaseException:
            await self.stop(0.0)
            raise
        log.info("REST served by %d worker processes on port %d", self.count, self.port)

    @property
    def port(self) -> int:
        """The port the workers share."""
        if self._reserved is None:
            raise RuntimeError("the HTTP workers are not started")
        return int(self._reserved.getsockname()[1])

    def _spawn(self, index: int) -> _Worker:
        prefix = f"{self.prefix}{index}."
        config = replace(self.config, segment_prefix=prefix)
        calls, calls_child = socket.socketpair()
        requests, requests_child = socket.socketpair()
        fds = (calls_child.fileno(), requests_child.fileno())
        command = [sys.executable, "-m", "dlscale.frontends.workers.process", *map(str, fds)]
        process = subprocess.Popen([*command, config.encoded()], pass_fds=fds)
        calls_child.close()
        requests_child.close()
        worker = _Worker(index, process, PlaneHost(self.plane))
        worker.task = asyncio.get_running_loop().create_task(self._run(worker, calls, requests))
        self.workers[index] = worker
        return worker

    async def _listening(self, worker: _Worker) -> None:
        waiting = asyncio.get_running_loop().create_task(worker.host.listening.wait())
        await asyncio.wait(
            [waiting, worker.task], timeout=START_TIMEOUT_S, return_when="FIRST_COMPLETED"
        )
        if not worker.host.listening.is_set():
            waiting.cancel()
            raise DlscaleError(f"REST worker {worker.index} did not start (see its log above)")

    async def _run(self, worker: _Worker, calls: socket.socket, requests: socket.socket) -> None:
        try:
            await worker.host.serve(calls, requests)
        finally:
            code = await asyncio.to_thread(worker.process.wait)
            segments.sweep(f"{self.prefix}{worker.index}.")
        if self._stopping:
            return
        log.error("REST worker %d exited with %s: starting it again", worker.index, code)
        self.restarts += 1
        await asyncio.sleep(RESTART_DELAY_S)
        if not self._stopping:
            self._spawn(worker.index)

    async def stop(self, grace_s: float = GRACE_S) -> None:
        """SIGTERM every worker; each finishes its requests within `grace_s`; kill the late."""
        self._stopping = True
        workers = list(self.workers.values())
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(signal.SIGTERM)
        tasks = [w.task for w in workers]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace_s + 5.0)
            for worker in workers:
                if worker.task in late:
                    log.warning("REST worker %d outlived the grace: killed", worker.index)
                    with contextlib.suppress(ProcessLookupError):
                        worker.process.kill()
            await asyncio.gather(*tasks, return_exceptions=True)
        segments.sweep(self.prefix)
        if self._reserved is not None:
            self._reserved.close()
