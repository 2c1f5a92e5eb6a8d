"""Serve a repository over REST with one HTTP stack, in its own process, for the benchmarks.

    python -m benchmarks.serve_http REPO --stack protocol|uvicorn|granian [--port 0]

Prints `LISTENING <port>` once it accepts connections; stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

import uvloop

from dlscale.frontends.rest import HttpFrontend
from dlscale.frontends.rest.api import RestApi
from dlscale.models.repository import ModelRepository
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager

STACKS = ("protocol", "uvicorn", "granian")


async def serve(repo: Path, stack: str, port: int) -> None:
    """Load every model, serve on `port` with `stack`, stop on a signal."""
    manager = ModelManager(ModelRepository(repo))
    await manager.load_all()
    dataplane = DataPlane(manager)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if stack == "protocol":
        frontend = HttpFrontend(dataplane, "127.0.0.1", port)
        await frontend.start()
        _announce(frontend.port)
        await stop.wait()
        await frontend.stop()
    elif stack == "uvicorn":
        await _uvicorn(RestApi(dataplane), port, stop)
    else:
        await _granian(RestApi(dataplane), port, stop)
    await manager.close()


async def _uvicorn(api: RestApi, port: int, stop: asyncio.Event) -> None:
    import uvicorn

    from benchmarks.stacks import asgi_app

    config = uvicorn.Config(
        asgi_app(api),
        host="127.0.0.1",
        port=port,
        loop="none",  # run on this (uvloop) loop, next to the DataPlane
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    _announce(server.servers[0].sockets[0].getsockname()[1])
    await stop.wait()
    server.should_exit = True
    await task


async def _granian(api: RestApi, port: int, stop: asyncio.Event) -> None:
    from granian.constants import Interfaces
    from granian.server.embed import Server

    from benchmarks.stacks import rsgi_app

    if port == 0:
        raise SystemExit("granian needs a fixed port")
    server = Server(rsgi_app(api), "127.0.0.1", port, interface=Interfaces.RSGI, log_enabled=False)
    task = asyncio.create_task(server.serve())
    await _wait_port(port)
    _announce(port)
    await stop.wait()
    server.signal_handler_interrupt()
    await task


async def _wait_port(port: int) -> None:
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.02)
            continue
        writer.close()
        return


def _announce(port: int) -> None:
    print(f"LISTENING {port}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path)
    parser.add_argument("--stack", choices=STACKS, default="protocol")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args()
    coro = serve(args.repo, args.stack, args.port)
    if args.loop == "uvloop":
        uvloop.run(coro)
    else:
        asyncio.run(coro)
    sys.exit(0)


if __name__ == "__main__":
    main()
