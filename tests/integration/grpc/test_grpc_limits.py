"""gRPC under the same connection limit as REST: more connections are refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tests.toolkit.server import LocalServer, serving

LIVE = "/inference.GRPCInferenceService/ServerLive"


@pytest.fixture(scope="module")
def capped(repo: Path) -> Iterator[LocalServer]:
    with serving(repo, http_port=None, max_connections=2) as running:
        yield running


def _live(url: str, opened: list[grpc.Channel]) -> grpc.StatusCode:
    # A channel of its own subchannel pool opens a connection of its own.
    channel = grpc.insecure_channel(url, options=[("grpc.use_local_subchannel_pool", 1)])
    call = channel.unary_unary(LIVE, request_serializer=bytes, response_deserializer=bytes)
    try:
        call(b"", timeout=5)
    except grpc.RpcError as exc:
        channel.close()
        return exc.code()
    opened.append(channel)
    return grpc.StatusCode.OK


def test_connections_beyond_the_maximum_are_refused(capped: LocalServer) -> None:
    opened: list[grpc.Channel] = []
    try:
        assert [_live(capped.grpc_url, opened) for _ in range(2)] == [grpc.StatusCode.OK] * 2
        assert _live(capped.grpc_url, opened) == grpc.StatusCode.UNAVAILABLE
    finally:
        for channel in opened:
            channel.close()
