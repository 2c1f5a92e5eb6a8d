"""`dlscale serve --ray --address A` against a cluster it may not join: one line that says why.

The cluster is a real head node started by `ray start --head --block` with token
authentication on; the command runs without the token, as a user who missed Ray's token page
would. Ray takes about 20 s to give up.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.toolkit.models import write_null_model
from tests.toolkit.repositories import NULL_TENSORS
from tests.toolkit.server import free_port
from tests.toolkit.slow import slow_only
from tests.toolkit.waiting import until

pytest.importorskip("ray", reason="needs the [ray] extra")
pytestmark = [
    pytest.mark.slow,
    slow_only("a Ray head of its own, and Ray's 20 s before it gives up: 70 s in all"),
]
RAY = Path(sys.executable).with_name("ray")


@pytest.fixture
def token_head(tmp_path: Path) -> Iterator[str]:
    """A head node with token authentication, in a process group of its own (`ray stop` would
    stop every cluster on the host, the other tests' too)."""
    port, temp = free_port(), tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
    argv = [
        str(RAY), "start", "--head", "--block", "--port", str(port), "--num-cpus", "1",
        # Ray's fixed ports (workers 10002-19999, its client 10001) would meet `port`, or
        # another test's cluster: random ones.
        "--min-worker-port", "0", "--max-worker-port", "0",
        "--ray-client-server-port", str(free_port()),
        "--include-dashboard", "false", "--disable-usage-stats",
        # Short: Ray's socket paths under it must fit a Unix socket's 107 bytes.
        "--temp-dir", temp,
    ]  # fmt: skip
    head = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        until(lambda: _listening(port, head), 120.0)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(60)
        shutil.rmtree(temp, ignore_errors=True)


def _listening(port: int, head: subprocess.Popen[bytes]) -> bool:
    assert head.poll() is None, "`ray start --head` exited"
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy")
def test_a_cluster_that_refuses_the_command_is_one_line_not_a_traceback(
    token_head: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(tmp_path / "user")  # no token file of the head's
    repo = tmp_path / "models"
    write_null_model(repo, "m", NULL_TENSORS.format(inp="x", out="y", width=4, out_width=4))
    argv = [sys.executable, "-m", "dlscale", "serve", str(repo), "--ray", "--address", token_head]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("dlscale serve: error:")]
    assert len(said) == 1, done.stderr[-2000:]
    assert f"cannot join the Ray cluster at {token_head}" in said[0], said
    assert "token" in said[0].lower(), said  # Ray's own reason: the token is missing
