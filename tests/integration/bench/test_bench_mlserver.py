"""`dlscale bench` against another server: Seldon MLServer, over REST and gRPC.

MLServer is installed once into its own environment (.bench/mlserver-venv, as `make bench`
does); where it cannot be installed (no package index), these tests skip and say why.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from benchmarks import peers
from benchmarks.harness import ServerProcess, free_port, start_mlserver
from benchmarks.models import IDENTITY, build_identity

from dlscale.cli import main


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    build_identity(root)
    return root


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory, source: Path) -> Iterator[tuple[int, int]]:
    try:
        peers.ensure_mlserver()
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"MLServer could not be installed into {peers.VENV}: {exc}")
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    folder = peers.mlserver_repository(
        tmp_path_factory.mktemp("mlserver") / "repo",
        source,
        [IDENTITY],
        http_port,
        grpc_port,
        metrics_port,
    )
    server: ServerProcess = start_mlserver(folder, http_port, [IDENTITY.name])
    try:
        yield http_port, grpc_port
    finally:
        server.stop()


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_bench_measures_mlserver(
    mlserver: tuple[int, int], source: Path, tmp_path: Path, scheme: str
) -> None:
    port = mlserver[0] if scheme == "http" else mlserver[1]
    out = tmp_path / scheme
    # MLServer's metadata lists no tensors unless model-settings.json declares them: the bench
    # reads them from the model file it is given, and checks the answers against it too.
    argv = [
        "bench", f"{scheme}://127.0.0.1:{port}", "--model", "identity",
        "--reference", str(IDENTITY.path(source)), "--accuracy",
        "--scenario", "offline", "--duration", "1s", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    run = report["scenarios"][0]["result"]
    assert run["valid"] is True, run
    assert run["errors"]["count"] == 0 and run["completed"] == run["issued"] > 0
    assert report["targets"][0]["label"].startswith(f"{scheme}://127.0.0.1:{port}")
    assert run["accuracy"]["ok"] is True and run["accuracy"]["checked"] > 0, run["accuracy"]


def test_a_server_without_tensor_metadata_needs_a_model_file(mlserver: tuple[int, int]) -> None:
    argv = ["bench", f"http://127.0.0.1:{mlserver[0]}", "--model", "identity"]
    assert main(argv) == 1
