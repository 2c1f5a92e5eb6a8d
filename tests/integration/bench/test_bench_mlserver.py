"""`dlscale bench` against another server: Seldon MLServer, over REST and gRPC.

MLServer is installed once into its own environment (.bench/mlserver-venv, as `make bench`
does; about 400 MB and a minute), so these tests carry the `peers` marker and run with
`make test-peers`, not in the default suite; where MLServer cannot be installed (no package
index), they skip and say why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.toolkit.benchmarks import ROOT

from dlscale.cli import main

pytestmark = pytest.mark.peers
CANNOT_INSTALL = 3  # benchmarks/serve_mlserver.py's exit code when MLServer cannot be installed


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, Path]]:
    """MLServer serving identity, started by `python -m benchmarks.serve_mlserver` (which builds
    the model and lays out MLServer's folder); (HTTP port, gRPC port, identity's model file)."""
    folder = tmp_path_factory.mktemp("mlserver")
    paths = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    log = folder / "serve_mlserver.log"  # a file, not a pipe: pip may write much while installing
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.serve_mlserver", str(folder)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        assert proc.stdout is not None
        # Other lines come first when MLServer is installed now ("installing MLServer ...").
        line = ""
        for line in proc.stdout:
            if line.startswith("LISTENING"):
                break
        if not line.startswith("LISTENING"):
            code = proc.wait(60)
            if code == CANNOT_INSTALL:
                pytest.skip(log.read_text().strip().splitlines()[-1])
            raise AssertionError(f"MLServer did not start ({code}): {log.read_text()}")
        _, http_port, grpc_port, model_file = line.split()
        yield int(http_port), int(grpc_port), Path(model_file)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_bench_measures_mlserver(
    mlserver: tuple[int, int, Path], tmp_path: Path, scheme: str
) -> None:
    port = mlserver[0] if scheme == "http" else mlserver[1]
    out = tmp_path / scheme
    # MLServer's metadata lists no tensors unless model-settings.json declares them: the bench
    # reads them from the model file it is given, and checks the answers against it too.
    argv = [
        "bench", f"{scheme}://127.0.0.1:{port}", "--model", "identity",
        "--reference", str(mlserver[2]), "--accuracy",
        "--scenario", "offline", "--duration", "1s", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    run = report["scenarios"][0]["result"]
    assert run["valid"] is True, run
    assert run["errors"]["count"] == 0 and run["completed"] == run["issued"] > 0
    assert report["targets"][0]["label"].startswith(f"{scheme}://127.0.0.1:{port}")
    assert run["accuracy"]["ok"] is True and run["accuracy"]["checked"] > 0, run["accuracy"]


def test_a_server_without_tensor_metadata_needs_a_model_file(
    mlserver: tuple[int, int, Path],
) -> None:
    argv = ["bench", f"http://127.0.0.1:{mlserver[0]}", "--model", "identity"]
    assert main(argv) == 1
