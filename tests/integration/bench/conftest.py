"""`dlscale bench` against in-process models and a live server on port 0.

Fixtures build on each other: repo -> server -> http_url and grpc_url (one server, both
protocols; tests/toolkit/server.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.toolkit.repositories import bench_repository
from tests.toolkit.server import LocalServer, serving


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """identity and broken (identity plus one), FP32 [batch, 4]."""
    return bench_repository(tmp_path_factory.mktemp("bench-repo"))


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo, model_control="none") as running:
        yield running


@pytest.fixture(scope="module")
def http_url(server: LocalServer) -> str:
    return f"http://{server.http_url}"


@pytest.fixture(scope="module")
def grpc_url(server: LocalServer) -> str:
    return f"grpc://{server.grpc_url}"
