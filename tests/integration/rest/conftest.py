"""A real REST server on 127.0.0.1 port 0 over small models, for tritonclient and httpx.

The server runs on an event loop of its own in a background thread (tests/toolkit/server.py).
Fixtures build on each other: repo -> server -> client (tritonclient) and http (httpx); a module
that needs other settings overrides `server`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.http as th
from tests.toolkit.repositories import rest_repository
from tests.toolkit.server import LocalServer, serving


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rest_repository(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo) as running:
        yield running


@pytest.fixture
def client(server: LocalServer) -> Iterator[th.InferenceServerClient]:
    """tritonclient's blocking REST client."""
    c = th.InferenceServerClient(server.http_url)
    yield c
    c.close()


@pytest.fixture
def http(server: LocalServer) -> Iterator[httpx.Client]:
    """A plain HTTP client, for requests tritonclient would never send."""
    with httpx.Client(base_url=f"http://{server.http_url}") as c:
        yield c
