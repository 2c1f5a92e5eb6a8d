"""The DataPlane over real ONNX Runtime models: validation, routing, lifecycle, statistics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from dlscale.errors import InvalidInput, NotFound, Unavailable, Unsupported
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager
from dlscale.types import InferenceRequest, RequestedOutput


async def _plane(repo: Path, control: str = "explicit") -> DataPlane:
    manager = ModelManager.open(repo)
    await manager.load_all()
    return DataPlane(manager, control)


def _req(model: str, array: np.ndarray, version: str = "", **kw: object) -> InferenceRequest:
    return InferenceRequest(model, {"input": array}, model_version=version, **kw)  # type: ignore[arg-type]


async def test_a_broken_model_does_not_keep_the_others_from_serving(repo: Path) -> None:
    plane = await _plane(repo)
    index = {row["name"]: row for row in plane.repository_index()}
    assert index["identity"]["state"] == "READY"
    assert index["broken"]["state"] == "UNAVAILABLE"
    assert "max_batch_size" in index["broken"]["reason"]
    assert plane.model_ready("identity") and not plane.model_ready("broken")
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    response = await plane.infer(_req("identity", x, id="abc"))
    assert response.id == "abc" and np.array_equal(response.outputs["output"], x)
    await plane.manager.close()


async def test_versions_route_to_their_own_model(repo: Path) -> None:
    plane = await _plane(repo)
    x = np.zeros((1, 4), np.float32)
    assert (await plane.infer(_req("plus", x, "1"))).outputs["output"][0, 0] == 1.0
    latest = await plane.infer(_req("plus", x))
    assert latest.outputs["output"][0, 0] == 2.0 and latest.model_version == "2"
    assert plane.model_metadata("plus")["versions"] == ["1", "2"]
    await plane.manager.close()


BAD = [
    ("nope", {"input": np.zeros((1, 16), np.float32)}, "", NotFound, "unknown model 'nope'"),
    ("identity", {"input": np.zeros((1, 16), np.float32)}, "7", NotFound, "no version '7'"),
    ("broken", {"input": np.zeros((1, 16), np.float32)}, "", Unavailable, "not ready"),
    ("identity", {"inp": np.zeros((1, 16), np.float32)}, "", InvalidInput, "lacks ['input']"),
    ("identity", {"input": np.zeros((1, 16), np.int32)}, "", InvalidInput, "gave INT32"),
    ("identity", {"input": np.zeros((1, 15), np.float32)}, "", InvalidInput, "gave [1, 15]"),
    ("identity", {"input": np.zeros((33, 16), np.float32)}, "", InvalidInput, "exceeds max_batch"),
    ("identity", {"input": np.zeros((0, 16), np.float32)}, "", InvalidInput, "batch size 0"),
    (
        "identity",
        {"input": np.zeros((1, 16), np.float32), "extra": np.zeros(1)},
        "",
        InvalidInput,
        "unexpected inputs ['extra']",
    ),
]


@pytest.mark.parametrize(("model", "inputs", "version", "error", "message"), BAD)
async def test_bad_requests_get_clear_errors_and_nothing_else_breaks(
    repo: Path,
    model: str,
    inputs: dict[str, np.ndarray],
    version: str,
    error: type[Exception],
    message: str,
) -> None:
    plane = await _plane(repo)
    with pytest.raises(error) as info:
        await plane.infer(InferenceRequest(model, inputs, model_version=version))
    assert message in str(info.value)
    ok = await plane.infer(_req("identity", np.ones((1, 16), np.float32)))
    assert ok.outputs["output"].sum() == 16
    await plane.manager.close()


async def test_unknown_requested_outputs_and_the_failure_count(repo: Path) -> None:
    plane = await _plane(repo)
    request = _req("identity", np.ones((1, 16), np.float32), outputs=[RequestedOutput("zzz")])
    with pytest.raises(InvalidInput, match="unknown outputs"):
        await plane.infer(request)
    stats = plane.statistics("identity")["model_stats"][0]
    assert stats["inference_stats"]["fail"]["count"] == 1
    await plane.manager.close()


async def test_unload_drains_in_flight_requests_and_reload_serves_again(repo: Path) -> None:
    plane = await _plane(repo)
    x = np.ones((2, 16), np.float32)
    in_flight = [asyncio.create_task(plane.infer(_req("identity", x))) for _ in range(50)]
    await asyncio.sleep(0)
    await plane.unload_model("identity")
    results = await asyncio.gather(*in_flight)
    assert all(np.array_equal(r.outputs["output"], x) for r in results)
    with pytest.raises(Unavailable, match="not ready"):
        await plane.infer(_req("identity", x))
    other = await plane.infer(_req("plus", np.zeros((1, 4), np.float32)))
    assert other.outputs["output"][0, 0] == 2.0
    await plane.load_model("identity")
    assert np.array_equal((await plane.infer(_req("identity", x))).outputs["output"], x)
    await plane.manager.close()


async def test_reloading_keeps_serving_throughout(repo: Path) -> None:
    plane = await _plane(repo)
    x = np.zeros((1, 4), np.float32)

    async def traffic() -> int:
        n = 0
        for _ in range(200):
            response = await plane.infer(_req("plus", x))
            assert response.outputs["output"][0, 0] == 2.0
            n += 1
        return n

    task = asyncio.create_task(traffic())
    await plane.load_model("plus")
    assert await task == 200
    await plane.manager.close()


async def test_model_control_none_refuses_api_loads(repo: Path) -> None:
    plane = await _plane(repo, control="none")
    with pytest.raises(Unsupported, match="model-control none"):
        await plane.load_model("identity")
    with pytest.raises(NotFound):
        await DataPlane(plane.manager, "explicit").load_model("missing")
    await plane.manager.close()


async def test_stop_accepting_refuses_new_requests(repo: Path) -> None:
    plane = await _plane(repo)
    plane.stop_accepting()
    assert not plane.ready()
    with pytest.raises(Unavailable, match="shutting down"):
        await plane.infer(_req("identity", np.ones((1, 16), np.float32)))
    await plane.manager.close()
