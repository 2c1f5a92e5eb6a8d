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

from benchmarks.harness.servers import HOST, announce
from dlscale.frontends.rest.api import RestApi
from dlscale.server import Server, ServerSettings

STACKS = ("protocol", "uvicorn", "granian")


async def serve(repo: Path, stack: str, port: int) -> None:
    """Serve every model on `port` with `stack`, stop on a signal.

    The server is built as `dlscale serve` builds it; `protocol` is its own REST frontend, the
    other stacks run the same routes (RestApi) over the server's DataPlane.
    """
    own = stack == "protocol"
    settings = ServerSettings.build(
        repo,
        host=HOST,
        http_port=port if own else None,
        grpc_port=None,
        metrics_port=None,
    )
    server = Server(settings)
    if own:
        await server.serve_forever(on_ready=lambda s: announce(s.ports["http"]))
        return
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    await server.wait_loaded()
    api = RestApi(server.dataplane, settings.limits)
    if stack == "uvicorn":
        await _uvicorn(api, port, stop)
    else:
        await _granian(api, port, stop)
    await server.stop()


async def _uvicorn(api: RestApi, port: int, stop: asyncio.Event) -> None:
    import uvicorn

    from benchmarks.harness.stacks import asgi_app

    config = uvicorn.Config(
        asgi_app(api),
        host=HOST,
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
    announce(server.servers[0].sockets[0].getsockname()[1])
    await stop.wait()
    server.should_exit = True
    await task


async def _granian(api: RestApi, port: int, stop: asyncio.Event) -> None:
    from granian.constants import Interfaces
    from granian.server.embed import Server as Granian

    from benchmarks.harness.stacks import rsgi_app

    if port == 0:
        raise SystemExit("granian needs a fixed port")
    server = Granian(rsgi_app(api), HOST, port, interface=Interfaces.RSGI, log_enabled=False)
    task = asyncio.create_task(server.serve())
    await _wait_port(port)
    announce(port)
    await stop.wait()
    server.signal_handler_interrupt()
    await task


async def _wait_port(port: int) -> None:
    while True:
        try:
            _, writer = await asyncio.open_connection(HOST, port)
        except OSError:
            await asyncio.sleep(0.02)
            continue
        writer.close()
        return


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
