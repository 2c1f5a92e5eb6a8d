"""Thousands of requests from many concurrent gRPC clients: every answer is its own, none lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import tritonclient.grpc.aio as triton_aio
from tests.toolkit.clients import infer_input
from tests.toolkit.repositories import MLP_B, MLP_W
from tests.toolkit.server import LocalServer

UNARY_CLIENTS = 24
REQUESTS_PER_CLIENT = 80
STREAM_CLIENTS = 4
REQUESTS_PER_STREAM = 60
MODELS = ("identity", "mlp")


def _request(client_id: int, n: int) -> tuple[str, str, np.ndarray]:
    """A request whose model, rows and values depend on who sends it and when."""
    rng = np.random.default_rng(client_id * 100_003 + n)
    model = MODELS[rng.integers(2)]
    rows = int(rng.integers(1, 9))
    x = rng.standard_normal((rows, 16)).astype(np.float32)
    x[:, 0] = client_id * 10_000 + n  # a tag that would show any mix-up at once
    return model, f"{client_id}-{n}", x


def _check(model: str, x: np.ndarray, y: np.ndarray) -> None:
    if model == "identity":
        np.testing.assert_array_equal(y, x)
    else:
        np.testing.assert_allclose(y, x @ MLP_W + MLP_B, rtol=1e-4, atol=1e-4)


async def _unary_client(url: str, client_id: int) -> int:
    async with triton_aio.InferenceServerClient(url) as client:
        for n in range(REQUESTS_PER_CLIENT):
            model, rid, x = _request(client_id, n)
            result = await client.infer(model, [infer_input("x", x)], request_id=rid)
            assert result.get_response().id == rid
            _check(model, x, result.as_numpy("y"))
    return REQUESTS_PER_CLIENT


async def _stream_client(url: str, client_id: int) -> int:
    sent: dict[str, tuple[str, np.ndarray]] = {}

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for n in range(REQUESTS_PER_STREAM):
            model, rid, x = _request(client_id, n)
            sent[rid] = (model, x)
            yield {"model_name": model, "inputs": [infer_input("x", x)], "request_id": rid}

    seen = set()
    async with triton_aio.InferenceServerClient(url) as client:
        async for result, error in client.stream_infer(requests()):
            assert error is None, error
            rid = result.get_response().id
            assert rid not in seen
            seen.add(rid)
            model, x = sent[rid]
            _check(model, x, result.as_numpy("y"))
            if len(seen) == REQUESTS_PER_STREAM:
                break
    assert seen == set(sent)
    return len(seen)


async def test_many_concurrent_clients(server: LocalServer) -> None:
    before = {m: server.dataplane.statistics(m)[0].inference_stats.success.count for m in MODELS}
    done = await asyncio.gather(
        *(_unary_client(server.grpc_url, c) for c in range(UNARY_CLIENTS)),
        *(_stream_client(server.grpc_url, 1000 + c) for c in range(STREAM_CLIENTS)),
    )
    total = sum(done)
    assert total == UNARY_CLIENTS * REQUESTS_PER_CLIENT + STREAM_CLIENTS * REQUESTS_PER_STREAM
    assert total >= 2000
    after = {m: server.dataplane.statistics(m)[0].inference_stats.success.count for m in MODELS}
    assert sum(after[m] - before[m] for m in MODELS) == total
    # Batching really merged requests: fewer batches ran than requests were answered.
    stats = [server.dataplane.statistics(m)[0] for m in MODELS]
    assert any(s.execution_count < s.inference_stats.success.count for s in stats)
