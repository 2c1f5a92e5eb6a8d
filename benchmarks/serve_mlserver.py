"""MLServer serving the benchmark's identity model, until SIGTERM: a peer for tests and by hand.

    python -m benchmarks.serve_mlserver FOLDER

Builds identity (benchmarks/harness/models.py) under FOLDER/models, lays out FOLDER/mlserver as
the REST benchmark does, installs MLServer once (.bench/mlserver-venv) and starts it; then prints
`LISTENING <http port> <grpc port> <identity's model file>` and serves until SIGTERM or SIGINT,
when it stops MLServer. Exits with 3 when MLServer cannot be installed (no package index).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import peers
from benchmarks.harness.models import IDENTITY, build_identity
from benchmarks.harness.servers import free_port, start_mlserver

CANNOT_INSTALL = 3


def main(argv: list[str] | None = None) -> int:
    """Serve until a signal; 0 when stopped, 3 when MLServer cannot be installed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    try:
        peers.ensure_mlserver()
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"MLServer could not be installed into {peers.VENV}: {exc}", file=sys.stderr)
        return CANNOT_INSTALL
    source = args.folder / "models"
    source.mkdir(parents=True, exist_ok=True)
    build_identity(source)
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    folder = peers.mlserver_repository(
        args.folder / "mlserver", source, [IDENTITY], http_port, grpc_port, metrics_port
    )
    stopped: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):  # a handler: MLServer's processes keep defaults
        signal.signal(sig, lambda number, _: stopped.append(number))
    server = start_mlserver(folder, http_port, [IDENTITY.name])
    try:
        print(f"LISTENING {http_port} {grpc_port} {IDENTITY.path(source)}", flush=True)
        while not stopped:
            signal.pause()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
