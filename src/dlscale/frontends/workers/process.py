"""A REST worker process: HTTP parsed and requests decoded here, answered by the model process.

Started by `HttpWorkers` (workers.py) as `python -m dlscale.frontends.workers.process CALLS REQUESTS
CONFIG`: two inherited socket descriptors to the owner and the pickled `WorkerConfig`. It listens
on the server's port beside its siblings (SO_REUSEPORT), receives large bodies into shared
memory, and serves the Open Inference Protocol routes over a `RemotePlane`. It stops on SIGTERM
(gracefully) and when the owner goes away; SIGINT is the owner's to act on.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import pickle
import signal
import socket
import sys
from dataclasses import dataclass

from dlscale.frontends.access import Access
from dlscale.frontends.limits import Limits
from dlscale.frontends.loop import new_event_loop
from dlscale.frontends.rest.body import BodyBuffers
from dlscale.frontends.rest.transport import HttpFrontend
from dlscale.frontends.tls import TlsFiles
from dlscale.frontends.workers.remote import Calls, RemotePlane
from dlscale.native import die_with_parent
from dlscale.wire.segments import Segments

log = logging.getLogger("dlscale.http")


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """What one worker needs of the server's settings."""

    host: str
    port: int
    limits: Limits
    tls: TlsFiles | None
    #: Who may call what: the API key and restricted groups, as the owner's REST has them.
    access: Access
    allow_shm: bool
    max_shm_regions: int
    grace_s: float
    #: (logger name, level) as the owner had them at start; "" is the root logger.
    log_levels: tuple[tuple[str, int], ...]
    #: Names of this worker's shared-memory segments start with it (the pool sets it per worker).
    segment_prefix: str = ""

    def encoded(self) -> str:
        """The config as one command-line argument."""
        return base64.b64encode(pickle.dumps(self)).decode()


async def serve(config: WorkerConfig, calls: socket.socket, requests: socket.socket) -> None:
    """Listen and serve until SIGTERM or until the owner is gone."""
    segments = Segments(config.segment_prefix)
    plane = RemotePlane(Calls(calls), segments, config.allow_shm, config.max_shm_regions)
    await plane.connect(requests)
    frontend = HttpFrontend(
        plane.as_plane(),
        config.host,
        config.port,
        limits=config.limits,
        tls=config.tls.server_context() if config.tls else None,
        access=config.access,
        bodies=BodyBuffers(allocate=segments.allocate),
        reuse_port=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await frontend.start()
        await plane.announce(frontend.port)
        gone = loop.create_task(plane.gone.wait())
        await asyncio.wait([gone, loop.create_task(stop.wait())], return_when="FIRST_COMPLETED")
        await frontend.stop(0.0 if plane.gone.is_set() else config.grace_s)
    finally:
        await plane.close()
        segments.close()


def main(argv: list[str]) -> int:
    """Run one worker from its command line."""
    calls_fd, requests_fd, encoded = int(argv[0]), int(argv[1]), argv[2]
    config: WorkerConfig = pickle.loads(base64.b64decode(encoded))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()  # the channel's EOF is the other net
    logging.basicConfig(format=f"%(asctime)s worker {os.getpid()} %(message)s")
    for name, level in config.log_levels:
        logging.getLogger(name or None).setLevel(level)
    calls = socket.socket(fileno=calls_fd)
    requests = socket.socket(fileno=requests_fd)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(serve(config, calls, requests))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
