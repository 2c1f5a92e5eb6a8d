"""A whole `dlscale serve` in a process of its own: one replica of a fleet, on its own ports.

A fleet (per-device workers on one host, or Ray replicas) is made of these: each child is the
single-host server with its whole data path (batcher, shared memory, streams, OpenAI routes),
bound to port 0 on the host it is told, and a router in front spreads requests over them
(scale/haproxy.py). The parent hands the child its ServerSettings on stdin (pickled: parent and
child are the same installation, and nothing from a client travels this way) and reads back
one line on the child's stdout once the models are loaded: the ports it bound, as JSON. The
child's stdout carries nothing else (fd 1 is pointed at stderr), so a chatty library cannot
fill the pipe; its logs go to stderr, which it shares with the parent.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from dlscale.errors import DlscaleError
from dlscale.native import end_child, spawn_dying_with_parent

log = logging.getLogger("dlscale.scale")


@dataclass(frozen=True)
class Endpoint:
    """Where a child serves: its host and the ports it bound (None where turned off)."""

    host: str
    pid: int
    http_port: int
    grpc_port: int | None
    metrics_port: int | None


class ServerChild:
    """One `dlscale serve` process: start it, learn its ports, watch it, stop it."""

    def __init__(self, settings: object, env: Mapping[str, str] | None = None) -> None:
        #: A ServerSettings (typed `object`: this module is imported by Ray replicas that must
        #: not import the server before their process is set up).
        self.settings = settings
        self.env = dict(os.environ if env is None else env)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 300.0) -> Endpoint:
        """Start the child and return once its models are loaded (or raise with why not)."""
        self.spawn()
        return self.ready(timeout_s)

    def spawn(self) -> None:
        """Start the child's process and hand it its settings; `ready` waits for it.

        The child stops when the *thread* that spawned it ends (PR_SET_PDEATHSIG follows the
        thread), so a supervisor spawns from a thread that lives as long as it does, and may
        wait for readiness in another.
        """
        self.process = spawn_dying_with_parent(
            [sys.executable, "-m", "dlscale.scale.child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(pickle.dumps(self.settings))
        self.process.stdin.close()

    def ready(self, timeout_s: float = 300.0) -> Endpoint:
        """Wait for the spawned child's ports (its models loaded), or stop it and raise."""
        assert self.process is not None and self.process.stdout is not None
        line = _read_line(self.process.stdout, timeout_s)
        if not line:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(2.0)  # an EOF comes just before the exit status
            code = self.process.poll()
            self.stop(0.0)
            why = f"exited with {code}" if code is not None else f"not ready in {timeout_s:g} s"
            raise DlscaleError(f"the server process {why} (see its log above)")
        ports = json.loads(line)
        return Endpoint(
            ports["host"], self.process.pid, ports["http"], ports.get("grpc"), ports.get("metrics")
        )

    @property
    def pid(self) -> int | None:
        """The child's process id, once started."""
        return None if self.process is None else self.process.pid

    def alive(self) -> bool:
        """Whether the child runs."""
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM (the server finishes its requests within its grace), SIGKILL when late."""
        if end_child(self.process, grace_s + 5.0):
            log.warning("server process %d outlived its grace: killed", self.pid)


def _read_line(stream: object, timeout_s: float) -> bytes:
    """The first line of `stream`, or b"" at EOF or after `timeout_s` (read in a thread)."""
    got: list[bytes] = []
    reader = threading.Thread(
        target=lambda: got.append(stream.readline()),  # type: ignore[attr-defined]
        daemon=True,
    )
    reader.start()
    reader.join(timeout_s)
    return got[0] if got else b""


def main() -> int:
    """The child: read the settings, serve, and say the ports on the saved stdout once ready."""
    from dlscale.server import Server, ServerSettings, serve_settings

    settings = pickle.loads(sys.stdin.buffer.read())
    if not isinstance(settings, ServerSettings):
        raise SystemExit("dlscale.scale.child: stdin must hold a pickled ServerSettings")
    report = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # print() and chatty libraries write to stderr from here on

    def ready(server: Server) -> None:
        line = {"host": settings.network.host, **server.ports}
        report.write(json.dumps(line) + "\n")
        report.flush()

    return serve_settings(settings, ready)


if __name__ == "__main__":
    raise SystemExit(main())
