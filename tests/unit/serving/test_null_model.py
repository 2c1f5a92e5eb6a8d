"""Null-backend models from a repository, through the same manager, batcher and DataPlane."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from tests.toolkit.models import write_null_model

from dlscale.models.repository import ModelRepository
from dlscale.serving.host import HostPlane
from dlscale.serving.manager import ModelManager
from dlscale.types import Datatype, InferenceRequest, TensorSpec

TENSORS = """
[[inputs]]
name = "x"
datatype = "FP32"
shape = [4]
[[inputs]]
name = "text"
datatype = "BYTES"
shape = [1]
[[outputs]]
name = "y"
datatype = "FP32"
shape = [4]
[[outputs]]
name = "scores"
datatype = "FP16"
shape = [3]
"""
#: Each batch holds its instance 50 ms: requests sent meanwhile queue and share a batch.
SLOW = "max_batch_size = 16\n[backend_options]\ndelay_us = 50000\n"


@pytest.fixture
def null_repo(tmp_path: Path) -> Path:
    write_null_model(tmp_path, "echo", "max_batch_size = 8\n" + TENSORS, versions=(1, 2))
    write_null_model(tmp_path, "slow", SLOW + TENSORS)
    (tmp_path / "no_marker" / "1").mkdir(parents=True)
    (tmp_path / "no_marker" / "config.toml").write_text('backend = "null"\n' + TENSORS)
    write_null_model(tmp_path, "undeclared", "max_batch_size = 8\n")
    return tmp_path


async def _plane(repo: Path) -> HostPlane:
    manager = ModelManager.open(repo)
    await manager.load_all()
    return HostPlane(manager, "explicit")


def _request(model: str, rows: int, start: float = 0.0) -> InferenceRequest:
    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + start
    text = np.array([[f"row {start + i}".encode()] for i in range(rows)], dtype=object)
    return InferenceRequest(model, {"x": x, "text": text})


async def test_a_null_model_loads_from_its_config_and_echoes(null_repo: Path) -> None:
    plane = await _plane(null_repo)
    served = plane.manager.get("echo")
    assert served.version.model_file.name == "model.null" and served.version.version == 2
    assert served.inputs[0] == TensorSpec("x", Datatype.FP32, (-1, 4))
    assert served.outputs[1] == TensorSpec("scores", Datatype.FP16, (-1, 3))
    request = _request("echo", 3, start=10.0)
    response = await plane.infer(request)
    np.testing.assert_array_equal(response.outputs["y"], request.inputs["x"])
    assert response.outputs["scores"].dtype == np.float16
    assert response.outputs["scores"].shape == (3, 3) and not response.outputs["scores"].any()
    await plane.manager.close()


async def test_what_a_null_model_lacks_keeps_it_unavailable(null_repo: Path) -> None:
    plane = await _plane(null_repo)
    index = {row.name: row for row in plane.repository_index()}
    assert index["no_marker"].state == "UNAVAILABLE"
    assert "no model file for backend 'null'" in index["no_marker"].reason
    assert "model.null" in index["no_marker"].reason
    assert index["undeclared"].state == "UNAVAILABLE"
    assert "needs [[inputs]] and [[outputs]]" in index["undeclared"].reason
    checked = {c.name: c for c in ModelRepository(null_repo).check()}
    assert checked["echo"].versions == (2,) and not checked["no_marker"].ok
    await plane.manager.close()


async def test_requests_batch_through_a_null_model_and_get_their_own_rows(
    null_repo: Path,
) -> None:
    plane = await _plane(null_repo)
    requests = [_request("slow", 1 + i % 3, start=100.0 * i) for i in range(12)]
    responses = await asyncio.gather(*(plane.infer(r) for r in requests))
    for request, response in zip(requests, responses, strict=True):
        np.testing.assert_array_equal(response.outputs["y"], request.inputs["x"])
    stats = plane.manager.get("slow").stats
    assert stats.inference_count == sum(r.inputs["x"].shape[0] for r in requests)
    # One instance, busy 50 ms per batch: the requests queued behind it were merged.
    assert stats.execution_count < len(requests)
    await plane.manager.close()
