"""`dlscale serve` and `models check` facing what users get wrong: a busy port, a config that
asks for no instances. A message, an exit code, and the rest still served; never a traceback."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from tests.toolkit.cli import run_cli, served
from tests.toolkit.models import write_null_model
from tests.toolkit.repositories import NULL_TENSORS

ECHO = "max_batch_size = 8\n" + NULL_TENSORS.format(inp="x", out="y", width=4, out_width=4)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """echo (a null model) and empty (the same, but `instances = []`)."""
    root = tmp_path_factory.mktemp("serve-errors")
    write_null_model(root, "echo", ECHO)
    # Top-level keys go before the tables that ECHO opens.
    write_null_model(root, "empty", "instances = []\n" + ECHO)
    return root


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port some other program listens on."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


@pytest.mark.parametrize(("flag", "what"), [
    ("--grpc-port", "gRPC"), ("--http-port", "REST"), ("--metrics-port", "metrics"),
])  # fmt: skip
def test_a_busy_port_is_a_message_and_exit_code_1(
    repo: Path, busy_port: int, flag: str, what: str
) -> None:
    ports = {"--http-port": "0", "--grpc-port": "0", "--metrics-port": "0", flag: str(busy_port)}
    done = run_cli("serve", str(repo), *(x for item in ports.items() for x in item), timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dlscale serve: error: {what} cannot listen on 127.0.0.1:{busy_port}")
    assert "Traceback" not in done.stderr


def test_models_check_refuses_a_config_without_instances(repo: Path) -> None:
    done = run_cli("models", "check", str(repo))
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert "ok     echo (versions [1])" in lines
    failed = next(line for line in lines if line.startswith("FAILED empty: "))
    assert "instances: give at least one {count, device}" in failed


def test_serve_leaves_a_model_without_instances_unavailable_and_serves_the_rest(
    repo: Path,
) -> None:
    with served(repo) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("echo") and not client.is_model_ready("empty")
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["echo"]["state"] == "READY"
        assert index["empty"]["state"] == "UNAVAILABLE"
        assert "instances: give at least one" in index["empty"]["reason"]
