"""Other revisions of dlscale, checked out once under .bench/revisions and served from there."""

from __future__ import annotations

import subprocess
from pathlib import Path

from benchmarks.harness.servers import (
    WORK,
    ServerProcess,
    free_port,
    serve_argv,
    thread_env,
    wait_ready,
)

TREES = WORK / "revisions"


def checkout(revision: str) -> Path:
    """A worktree of `revision` under .bench/revisions (made once, reused)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short=12", f"{revision}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    tree = TREES / sha
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], check=True)
    return tree


def start_revision(tree: Path, repo: Path) -> tuple[ServerProcess, int, int]:
    """`dlscale serve` from `tree`; returns once it is ready, with its HTTP and gRPC ports."""
    http, grpc = free_port(), free_port()
    # Only the flags every revision knows: an older checkout may lack the newer ones.
    argv = serve_argv(repo.resolve(), http, grpc)
    env = thread_env(PYTHONPATH=str((tree / "src").resolve()))
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
    )
    server = ServerProcess(tree.name, proc, http)
    wait_ready(server, timeout_s=120, every_s=0.2)
    return server, http, grpc
