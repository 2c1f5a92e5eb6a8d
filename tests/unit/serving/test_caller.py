"""Models that call models get their route at construction: refused until it is connected."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from tests.toolkit.models import write_null_model

from dlscale.backends.null import NullBackend
from dlscale.errors import Unavailable
from dlscale.serving.caller import CallRoute
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager
from dlscale.types import InferenceRequest

TENSORS = """
[[inputs]]
name = "x"
datatype = "FP32"
shape = [4]
[[outputs]]
name = "x_out"
datatype = "FP32"
shape = [4]
"""


async def test_a_models_call_takes_the_route_its_manager_was_given(tmp_path: Path) -> None:
    write_null_model(tmp_path, "echo", TENSORS)
    route = CallRoute()
    manager = ModelManager.open(tmp_path, calls=route)
    await manager.load_all()
    backend = manager.get("echo").instances[0].backend
    assert isinstance(backend, NullBackend) and backend.options.caller is not None
    caller = backend.options.caller  # what a backend whose model calls models is handed
    request = InferenceRequest("echo", {"x": np.arange(4, dtype=np.float32)})
    try:
        # Nothing connected the route: the call says so; no DataPlane patched itself in.
        with pytest.raises(Unavailable, match="no inference path"):
            await asyncio.to_thread(caller.infer, request)
        with pytest.raises(Unavailable, match="no stream path"):
            await asyncio.to_thread(lambda: list(caller.stream(request)))
        plane = DataPlane(manager)
        route.connect(plane.call_paths())
        answer = await asyncio.to_thread(caller.infer, request)
        assert answer.model_name == "echo" and "x_out" in answer.outputs
        streamed = await asyncio.to_thread(lambda: list(caller.stream(request)))
        assert [r.model_name for r in streamed] == ["echo"]
        assert manager.get("echo").stats.snapshot().inference_stats.success.count == 2
    finally:
        await manager.close()
