"""The trace extension's sampling, counts and files; the logging extension over Python logging."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from dlscale.errors import ConfigError, InvalidInput
from dlscale.serving.observe.logs import LogControl
from dlscale.serving.observe.stats import RequestTimes
from dlscale.serving.observe.trace import Tracer, TraceSettings


def _traced(tracer: Tracer, model: str, requests: int) -> list[int]:
    ids = []
    for n in range(requests):
        trace = tracer.start(model, 1, f"r{n}")
        if trace is not None:
            ids.append(trace.id)
            tracer.finish(trace, RequestTimes(request_start=10, request_end=20))
    return ids


def test_rate_count_and_files(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = Tracer(path, TraceSettings("TIMESTAMPS", rate=2))
    assert _traced(tracer, "m", 4) == [1, 2]  # the 2nd and the 4th request
    tracer.flush()  # log_frequency 0: everything goes to the file itself, at the end
    written = json.loads(path.read_text())
    assert written[0] == {"id": 1, "model_name": "m", "model_version": 1, "request_id": "r1"}
    assert written[1] == {
        "id": 1,
        "timestamps": [{"name": "REQUEST_START", "ns": 10}, {"name": "REQUEST_END", "ns": 20}],
    }
    # A count: once spent, the traces are written to an indexed file and sampling stops.
    tracer.update({"trace_rate": "1", "trace_count": "3"})
    assert _traced(tracer, "m", 5) == [3, 4, 5]
    assert tracer.settings()["trace_count"] == "0"
    tracer.wait()  # files are written by the tracer's thread
    assert len(json.loads((tmp_path / "trace.json.0").read_text())) == 6


def test_model_settings_fall_back_to_the_servers(tmp_path: Path) -> None:
    tracer = Tracer(tmp_path / "t.json")
    tracer.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}, model="a")
    assert _traced(tracer, "a", 2) and not _traced(tracer, "b", 2)
    tracer.update({"trace_level": None}, model="a")
    assert tracer.settings("a")["trace_level"] == ["OFF"]
    assert tracer.settings("a")["trace_rate"] == "1"


def test_bad_trace_settings() -> None:
    with pytest.raises(ConfigError, match="needs a trace file"):
        Tracer(None, TraceSettings("TIMESTAMPS"))
    with pytest.raises(InvalidInput, match="needs a trace file"):
        Tracer(None).update({"trace_level": ["TIMESTAMPS"]})
    with pytest.raises(InvalidInput, match="unknown trace setting 'rate'"):
        Tracer(None).update({"rate": "1"})
    with pytest.raises(InvalidInput, match="'trace_count' must be an integer >= -1"):
        Tracer(None).update({"trace_count": "-2"})


def test_log_settings_filter_and_format() -> None:
    control = LogControl()
    control.install("INFO")
    stream = io.StringIO()
    handler = control._handler
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    try:
        log = logging.getLogger("dlscale.test")
        logging.getLogger("some.library").info("library detail")
        log.debug("hidden")
        log.info("shown")
        control.update({"log_info": False, "log_verbose_level": 1})
        log.info("dropped")
        log.debug("debug shown")
        logging.getLogger("some.library").debug("still quiet")
        control.update({"log_format": "ISO8601"})
        log.warning("iso")
    finally:
        control.uninstall()
    out = stream.getvalue()
    assert "shown" in out and "debug shown" in out
    assert "hidden" not in out and "dropped" not in out
    assert "library detail" not in out and "still quiet" not in out
    iso = next(line for line in out.splitlines() if line.endswith("iso"))
    assert iso[10] == "T", iso  # 2026-11-23T09:41:00+0000 WARNING ...
