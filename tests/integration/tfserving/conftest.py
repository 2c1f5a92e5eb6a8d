"""One real server on 127.0.0.1 port 0 for the TensorFlow Serving tests: REST always, and gRPC's
TensorFlow Serving services (--grpc-tfserving) when `tensorflow-serving-api` is installed.

Fixtures build on each other: repo -> server -> http (httpx, TensorFlow Serving's REST API) and
triton (tritonclient, the Open Inference Protocol's, to compare with).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.http as th
from tests.toolkit.server import LocalServer, serving
from tests.toolkit.tfserving import tfserving_repository

#: Whether TensorFlow Serving's gRPC stubs are installed (the gRPC tests skip without them).
HAS_STUBS = importlib.util.find_spec("tensorflow_serving") is not None


@pytest.fixture(scope="package")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tfserving_repository(tmp_path_factory.mktemp("tfserving"))


@pytest.fixture(scope="package")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo, grpc_tfserving=HAS_STUBS) as running:
        yield running


@pytest.fixture
def http(server: LocalServer) -> Iterator[httpx.Client]:
    """A client of TensorFlow Serving's REST API, written from its document."""
    with httpx.Client(base_url=f"http://{server.http_url}/v1/models", timeout=60) as c:
        yield c


@pytest.fixture
def triton(server: LocalServer) -> Iterator[th.InferenceServerClient]:
    """tritonclient's REST client: the same model over the Open Inference Protocol."""
    c = th.InferenceServerClient(server.http_url)
    yield c
    c.close()
