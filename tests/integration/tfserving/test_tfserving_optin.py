"""TensorFlow Serving's gRPC services are opt-in (--grpc-tfserving), since their stubs load
TensorFlow: without the flag, or without the package, the server does not import TensorFlow,
answers the gRPC services UNIMPLEMENTED, and still serves TensorFlow Serving's REST API.

Each check runs in a child process: this one has TensorFlow loaded by the package's server.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.toolkit.cli import child_env

#: A child that serves the repository (REST and gRPC), predicts over REST and calls gRPC Predict
#: as raw bytes (no stubs), then prints what it saw. `HIDE` makes the package look missing.
CHILD = """
import logging, sys
if HIDE:
    sys.modules["tensorflow_serving"] = None  # an import of it fails, as when not installed
import grpc, httpx
from tests.toolkit.server import serving
from tests.toolkit.tfserving import tfserving_repository
logging.basicConfig(level=logging.WARNING)
with serving(tfserving_repository(ROOT), grpc_tfserving=FLAG) as server:
    url = f"http://{server.http_url}/v1/models/add:predict"
    print("rest", httpx.post(url, json={"instances": [[1, 2, 3]]}).json())
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
        try:
            call(b"", timeout=30)
        except grpc.RpcError as exc:
            print("grpc", exc.code().name)
    print("served", server.grpc.tfserving_served)
print("tensorflow", "tensorflow" in sys.modules)
"""


def _run(root: Path, flag: bool, hide: bool) -> subprocess.CompletedProcess[str]:
    code = f"ROOT, FLAG, HIDE = __import__('pathlib').Path({str(root)!r}), {flag}, {hide}\n" + CHILD
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
        check=False,
    )


def test_without_the_flag_tensorflow_is_not_imported(tmp_path: Path) -> None:
    done = _run(tmp_path, flag=False, hide=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "rest {'predictions': [[2.0, 3.0, 4.0]]}" in lines
    assert "grpc UNIMPLEMENTED" in lines and "served False" in lines
    assert "tensorflow False" in lines


def test_without_the_package_the_services_are_not_registered_and_said_so_once(
    tmp_path: Path,
) -> None:
    done = _run(tmp_path, flag=True, hide=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "rest {'predictions': [[2.0, 3.0, 4.0]]}" in lines
    assert "grpc UNIMPLEMENTED" in lines and "served False" in lines
    assert done.stderr.count("TensorFlow Serving's gRPC services are not served") == 1
    assert "tensorflow False" in lines
