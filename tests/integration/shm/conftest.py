"""A real server with client shared memory allowed, and tritonclient's regions to register.

Fixtures build on each other: repo -> server -> client (tritonclient HTTP or gRPC, the
`protocol` parameter) and regions (system shared-memory objects made with
tritonclient.utils.shared_memory, destroyed after the test; every region still registered is
unregistered too, so that each test starts from an empty registry).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
import tritonclient.utils.shared_memory as shm
from tests.toolkit.repositories import shm_repository
from tests.toolkit.server import LocalServer, serving

_counter = itertools.count()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shm_repository(tmp_path_factory.mktemp("shm_repo"))


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo, allow_client_shm=True, max_shm_regions=16) as running:
        yield running


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def client(server: LocalServer, protocol: str) -> Iterator[Any]:
    """tritonclient's blocking client of `protocol`; what it registered is gone afterwards."""
    c: Any = (
        th.InferenceServerClient(server.http_url)
        if protocol == "http"
        else tg.InferenceServerClient(server.grpc_url)
    )
    yield c
    c.unregister_system_shared_memory()
    c.close()


Region = Callable[[int], tuple[str, str, Any]]


@pytest.fixture
def region() -> Iterator[Region]:
    """Makes system shared-memory objects: (name, key, tritonclient handle) of `byte_size`."""
    made: list[Any] = []

    def make(byte_size: int) -> tuple[str, str, Any]:
        n = next(_counter)
        name, key = f"r{n}", f"/dlscale-test-{os.getpid()}-{n}"
        handle = shm.create_shared_memory_region(name, key, byte_size)
        made.append(handle)
        return name, key, handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def module(protocol: str) -> Any:
    """tritonclient.http or tritonclient.grpc."""
    return th if protocol == "http" else tg


def system_status(client: Any, protocol: str) -> dict[str, dict[str, Any]]:
    """The system regions by name, whichever protocol asked."""
    if protocol == "http":
        return {r["name"]: r for r in client.get_system_shared_memory_status()}
    answer = client.get_system_shared_memory_status(as_json=True)
    return {
        name: {k: int(v) if k in ("offset", "byte_size") else v for k, v in region.items()}
        for name, region in answer.get("regions", {}).items()
    }
