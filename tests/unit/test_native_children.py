"""Children dlscale starts beside itself: they end with the thread that started them, and
starting them forks nothing in a process that runs gRPC (native.py says why that matters)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tests.toolkit.waiting import process_gone, until

from dlscale.native import spawn_dying_with_parent

#: A process running a gRPC server starts five children one way or the other; gRPC's fork
#: handlers say so on stderr each time they run.
_GRPC_PARENT = """
import asyncio, subprocess, sys, grpc
from dlscale.native import die_with_parent, spawn_dying_with_parent
async def main():
    server = grpc.aio.server()
    server.add_insecure_port("127.0.0.1:0")
    await server.start()
    for _ in range(5):
        if sys.argv[1] == "fork":
            subprocess.Popen(["true"], preexec_fn=die_with_parent).wait()
        else:
            spawn_dying_with_parent(["true"]).wait()
    await server.stop(0)
asyncio.run(main())
"""


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def test_a_child_ends_with_the_thread_that_started_it() -> None:
    started: list[subprocess.Popen[bytes]] = []

    def spawn() -> None:
        started.append(spawn_dying_with_parent(["sleep", "600"]))
        # The signal is asked for just before `sleep` runs (by setpriv, after the spawn).
        until(lambda: _comm(started[0].pid) == "sleep")

    spawner = threading.Thread(target=spawn)
    spawner.start()
    spawner.join()
    child = started[0]
    until(lambda: child.poll() is not None)
    assert child.returncode == -15  # SIGTERM
    assert process_gone(child.pid)


def _fork_handler_lines(how: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _GRPC_PARENT, how], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stderr.splitlines() if "fork" in line]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv: children are forked")
def test_starting_a_child_beside_grpc_runs_no_fork_handlers() -> None:
    assert _fork_handler_lines("fork"), "gRPC no longer says when its fork handlers run"
    assert _fork_handler_lines("spawn") == []
