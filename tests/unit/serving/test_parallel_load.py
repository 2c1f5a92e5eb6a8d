"""Start-up loads models side by side, pipelines after the models they use."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tests.toolkit.models import write_null_model

from dlscale.models.repository import ModelVersion
from dlscale.serving.manager import ModelManager
from dlscale.serving.served import ModelState, ServedVersion

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


async def test_an_unforeseen_error_fails_that_model_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A bug or a library's own error while loading one model (no backend foresees it, so no
    # real model can be made to raise it here: the loader is made to). It once escaped the
    # manager: the model stayed LOADING and a server starting with it stopped.
    for name in ("good", "bugged"):
        write_null_model(tmp_path, name, SLOW.replace("300000", "0"))
    manager = ModelManager.open(tmp_path)
    real_load = manager.loader.load

    async def load(mv: ModelVersion) -> ServedVersion:
        if mv.name == "bugged":
            raise KeyError("a library's own error")
        return await real_load(mv)

    monkeypatch.setattr(manager.loader, "load", load)
    failed = await manager.load_all()
    assert list(failed) == ["bugged"] and failed["bugged"].http_status == 500
    assert 'KeyError: "a library\'s own error"' in str(failed["bugged"])
    index = {entry.name: entry for entry in manager.entries()}
    assert index["bugged"].state is ModelState.UNAVAILABLE and "KeyError" in index["bugged"].reason
    assert index["good"].state is ModelState.READY
    assert "Traceback" in caplog.text  # the cause, for whoever reads the log
    await manager.close()
