"""Start-up loads models side by side, pipelines after the models they use."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tests.toolkit.models import write_null_model

from dlscale.serving.manager import ModelManager

#: A null model whose warm-up takes 300 ms of (sleeping) compute.
SLOW = """max_batch_size = 4
[backend_options]
delay_us = 300000
[[inputs]]
name = "x"
datatype = "FP32"
shape = [2]
[[outputs]]
name = "y"
datatype = "FP32"
shape = [2]
"""


async def test_models_load_side_by_side(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Two at least load at once, whatever the cores (a few at a time on a bigger host).
    for name in ("a", "b"):
        write_null_model(tmp_path, name, SLOW)
    manager = ModelManager.open(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="dlscale.models"):  # LOADING is logged at debug
        assert await manager.load_all() == {}
    events = [r.getMessage() for r in caplog.records if r.name == "dlscale.models"]
    loading = [i for i, e in enumerate(events) if e.endswith(": LOADING")]
    ready = [i for i, e in enumerate(events) if ": READY" in e]
    # Both began loading before the first was ready: they did not wait in a line.
    assert len(loading) == 2 and len(ready) == 2 and max(loading) < min(ready), events
    await manager.close()
