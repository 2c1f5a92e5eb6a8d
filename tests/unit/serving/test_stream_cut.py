"""The DataPlane's stream path in process: the shutdown's cut ends the streams still running."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from tests.toolkit.python_models import write_python_model
from tests.toolkit.streaming_models import TICKER, TICKER_TOML

from dlscale.serving.host import HostPlane
from dlscale.serving.manager import ModelManager
from dlscale.types import InferenceRequest, InferenceResponse


async def test_the_cut_ends_the_streams_still_running_and_frees_their_seats(
    tmp_path: Path,
) -> None:
    write_python_model(tmp_path, "ticker", TICKER, TICKER_TOML)
    manager = ModelManager.open(tmp_path)
    plane = HostPlane(manager, "explicit")
    assert await plane.load_initial() == {}
    got: list[InferenceResponse] = []

    async def forever() -> None:
        request = InferenceRequest("ticker", {"COUNT": np.array([-1], np.int32)})
        async for response in plane.stream(request):
            got.append(response)

    running = asyncio.create_task(forever())
    while not got:
        await asyncio.sleep(0.01)
    waiting = asyncio.create_task(forever())  # one seat: this one waits
    seats = manager.get("ticker").runner.seats
    assert seats is not None
    while seats.waiting != 1:
        await asyncio.sleep(0.01)
    plane.stop_accepting()
    plane.cut(0.0)
    for task in (running, waiting):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert (seats.running, seats.waiting, seats.queue.stats.pending) == (0, 0, 0)
    assert manager.get("ticker").stats.failures["CANCELED"] == 2
    await manager.close()
