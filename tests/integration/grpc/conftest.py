"""A real gRPC server on 127.0.0.1 port 0 over small models, for tritonclient to talk to.

The server runs on an event loop of its own in a background thread (tests/toolkit/server.py),
so that the blocking tritonclient.grpc client and the asyncio one (on pytest's loop) both reach
it over the network as any client would. Fixtures build on each other: repo -> server -> client.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc as triton
from tests.toolkit.repositories import SMALL_LIMIT, grpc_limit_repository, grpc_repository
from tests.toolkit.server import LocalServer, serving
from tritonclient.grpc import service_pb2_grpc


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return grpc_repository(tmp_path_factory.mktemp("grpc_repo"))


@pytest.fixture(scope="session")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo) as running:
        yield running


@pytest.fixture(scope="session")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """A second server whose gRPC message limit is SMALL_LIMIT, for the size-limit tests."""
    root = grpc_limit_repository(tmp_path_factory.mktemp("grpc_limit_repo"))
    with serving(root, http_port=None, max_grpc_message_bytes=SMALL_LIMIT) as running:
        yield running


@pytest.fixture
def client(server: LocalServer) -> Iterator[triton.InferenceServerClient]:
    """tritonclient's blocking client."""
    c = triton.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


@pytest.fixture
def stub(server: LocalServer) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    """tritonclient's own generated stub, for messages its high-level client never sends."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
