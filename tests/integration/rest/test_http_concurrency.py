"""Many concurrent clients: none lost or mixed; a failing backend fails only its batch."""

from __future__ import annotations

import asyncio
import random

import httpx
import numpy as np
import pytest
import tritonclient.http.aio as tha
from tests.toolkit.repositories import mlp_reference, rest_repository
from tests.toolkit.server import LocalServer, settings_for
from tritonclient.utils import InferenceServerException

REQUESTS = 2000
CLIENTS = 8
STREAMS_PER_CLIENT = 8


def _stats(server: LocalServer, model: str) -> dict[str, int]:
    entry = server.dataplane.statistics(model)[0]
    return {
        "rows": entry.inference_count,
        "success": entry.inference_stats.success.count,
        "fail": entry.inference_stats.fail.count,
    }


async def _one(client: tha.InferenceServerClient, n: int, rng: random.Random) -> tuple[str, int]:
    model, name, out = rng.choice((("identity", "input", "output"), ("mlp", "x", "y")))
    rows = rng.randint(1, 8)
    binary = rng.random() < 0.5
    x = np.random.default_rng(n).standard_normal((rows, 16)).astype(np.float32)
    tensor = tha.InferInput(name, [rows, 16], "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    result = await client.infer(
        model,
        [tensor],
        request_id=f"r{n}",
        outputs=[tha.InferRequestedOutput(out, binary_data=not binary)],
    )
    assert result.get_response()["id"] == f"r{n}"
    got = result.as_numpy(out)
    if model == "identity":
        np.testing.assert_array_equal(got, x)
    else:
        np.testing.assert_allclose(got, mlp_reference(x), rtol=1e-4, atol=1e-4)
    return model, rows


async def test_two_thousand_concurrent_requests(server: LocalServer) -> None:
    before = {m: _stats(server, m) for m in ("identity", "mlp")}
    rng = random.Random(11)
    numbers = iter(range(REQUESTS))
    done: list[tuple[str, int]] = []

    async def stream(client: tha.InferenceServerClient) -> None:
        for n in numbers:  # streams share one iterator: each request is sent exactly once
            done.append(await _one(client, n, rng))

    clients = [
        tha.InferenceServerClient(server.http_url, conn_limit=STREAMS_PER_CLIENT)
        for _ in range(CLIENTS)
    ]
    try:
        await asyncio.gather(*(stream(c) for c in clients for _ in range(STREAMS_PER_CLIENT)))
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    assert len(done) == REQUESTS
    for model in ("identity", "mlp"):
        after = _stats(server, model)
        sent = [rows for m, rows in done if m == model]
        assert after["success"] - before[model]["success"] == len(sent)
        assert after["rows"] - before[model]["rows"] == sum(sent)
        assert after["fail"] == before[model]["fail"]
    assert server.dataplane.statistics("identity")[0].execution_count > 0


def _fails_even(x: np.ndarray) -> tha.InferInput:
    tensor = tha.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


#: Requests sent together to fails_even, which share one batch: its row count decides.
TOGETHER = {(1, 1): "fail", (1, 2): "ok", (2, 4): "fail", (2, 2, 3): "ok"}


async def test_failing_backend_fails_only_its_batch(server: LocalServer) -> None:
    before = _stats(server, "fails_even")

    async with tha.InferenceServerClient(server.http_url) as client:
        # The suite's repository holds a model that fails to load, so the server's strict
        # readiness is false from the start; failing batches must not change it either way.
        ready_before = await client.is_server_ready()

        async def send(rows: int, value: float) -> str:
            x = np.full((rows, 4), value, dtype=np.float32)
            try:
                out = await client.infer("fails_even", [_fails_even(x)])
            except InferenceServerException as exc:
                assert exc.status() == "500" and "onnxruntime failed" in str(exc)
                return "fail"
            np.testing.assert_array_equal(out.as_numpy("y"), x)  # its own rows, not another's
            return "ok"

        async def other(n: int) -> str:
            x = np.full((2, 16), float(n), dtype=np.float32)
            tensor = tha.InferInput("input", [2, 16], "FP32")
            tensor.set_data_from_numpy(x)
            out = await client.infer("identity", [tensor])
            np.testing.assert_array_equal(out.as_numpy("output"), x)
            return "ok"

        for sizes, expected in TOGETHER.items():
            # Each request carries its own values, so a mixed-up answer shows.
            batch = [send(rows, 10.0 * k + rows) for k, rows in enumerate(sizes)]
            # Another model's requests in the meantime are untouched.
            others = [other(n) for n in range(8)] if expected == "fail" else []
            outcomes = await asyncio.gather(*batch, *others)
            assert outcomes[: len(sizes)] == [expected] * len(sizes), sizes
            assert outcomes[len(sizes) :] == ["ok"] * len(others)
        # The model goes on serving batches of odd size.
        assert await send(7, 1.0) == "ok"
        assert await client.is_server_ready() == ready_before

    after = _stats(server, "fails_even")
    failed = sum(len(s) for s, e in TOGETHER.items() if e == "fail")
    served = [rows for s, e in TOGETHER.items() if e == "ok" for rows in s] + [7]
    assert after["fail"] - before["fail"] == failed
    assert after["success"] - before["success"] == len(served)
    assert after["rows"] - before["rows"] == sum(served)  # failed batches compute no rows


async def test_graceful_stop_finishes_in_flight_requests(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = rest_repository(tmp_path_factory.mktemp("stop"))
    server = LocalServer(settings_for(root))
    server.start()
    url = f"http://{server.http_url}"
    body = {
        "inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]
    }
    try:
        async with httpx.AsyncClient(base_url=url) as client:
            # The "queued" model holds a lone request 300 ms for company: it is in flight
            # while the frontend stops.
            pending = asyncio.ensure_future(client.post("/v2/models/queued/infer", json=body))
            batcher = server.dataplane.manager.get("queued").runner.batcher
            while not batcher.queued:
                await asyncio.sleep(0.005)
            stopping = asyncio.get_running_loop().run_in_executor(
                None, server.run, server.http.stop(5.0)
            )
            response = await pending
            await stopping
        assert response.status_code == 200
        assert response.json()["outputs"][0]["data"] == [1, 2, 3, 4]
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/v2/health/live")
    finally:
        server.stop()
