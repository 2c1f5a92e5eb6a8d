"""Issue 28's bounds on what control settings may hold: traces, label files, configs, groups."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from dlscale.errors import ConfigError, InvalidInput, PermissionDenied
from dlscale.frontends.access import Access, Restriction
from dlscale.models.config import parse_config
from dlscale.serving.classification import read_labels
from dlscale.serving.control.bounds import MAX_BATCH_SIZE, check_devices, check_override
from dlscale.serving.observe import trace
from dlscale.serving.observe.logs import LogControl
from dlscale.serving.observe.stats import RequestTimes
from dlscale.serving.observe.trace import Tracer, TraceSettings


def _finish(tracer: Tracer, requests: int) -> None:
    for n in range(requests):
        traced = tracer.start("m", 1, f"r{n}")
        assert traced is not None
        tracer.finish(traced, RequestTimes(request_start=10, request_end=20))


def test_keep_all_traces_stay_bounded_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace, "MAX_BUFFERED_TRACES", 50)  # the bound, small for the test
    tracer = Tracer(tmp_path / "trace.json", TraceSettings("TIMESTAMPS", rate=1))
    _finish(tracer, 120)  # rate 1, count -1, log_frequency 0: keep every trace
    assert len(tracer._buffer) // 2 == 20
    tracer.flush()
    written = [json.loads((tmp_path / f"trace.json.{i}").read_text()) for i in range(3)]
    assert [len(w) // 2 for w in written] == [50, 50, 20]


def test_trace_files_are_written_off_the_calling_thread(tmp_path: Path) -> None:
    """A trace file that blocks (a FIFO with no reader) holds only the writer thread: the
    requests that finish traces go on, and traces beyond the pending writes are dropped."""
    path = tmp_path / "trace.json"
    fifos = [tmp_path / f"trace.json.{i}" for i in range(trace.MAX_PENDING_WRITES)]
    for fifo in fifos:
        os.mkfifo(fifo)
    tracer = Tracer(path, TraceSettings("TIMESTAMPS", rate=1, log_frequency=1))
    done = threading.Event()

    def requests() -> None:
        _finish(tracer, trace.MAX_PENDING_WRITES + 5)
        done.set()

    worker = threading.Thread(target=requests, daemon=True)
    worker.start()
    worker.join(60)  # a hang guard: written on this thread, the first FIFO would block for ever
    finished = done.is_set()
    for fifo in fifos:  # readers let the writer through
        threading.Thread(target=fifo.read_bytes, daemon=True).start()
    tracer.flush()
    assert finished
    assert tracer.dropped >= 1


def test_log_settings_refuse_values_they_cannot_hold() -> None:
    logs = LogControl()
    with pytest.raises(InvalidInput, match="'log_format' must be one of"):
        logs.update({"log_format": ["default"]})
    with pytest.raises(InvalidInput, match="'log_verbose_level' must be an integer"):
        logs.update({"log_verbose_level": 10**200})
    assert logs.update({"log_verbose_level": 2**32 - 1})["log_verbose_level"] == 2**32 - 1


def test_a_label_file_must_stay_in_the_model_folder_in_the_config() -> None:
    for label_file in ("/etc/passwd", "../labels.txt", "a\0b"):
        data = {
            "name": "m",
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [2], "label_file": label_file}],
        }
        with pytest.raises(ConfigError, match="inside the model's folder"):
            parse_config(data, "config.toml")


def test_label_files_are_regular_bounded_files_in_the_folder(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("a\nb\n")
    assert read_labels(tmp_path, "labels.txt") == ("a", "b")
    (tmp_path / "environ").symlink_to("/proc/self/environ")
    with pytest.raises(ConfigError, match="inside the model's folder"):
        read_labels(tmp_path, "environ")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ConfigError, match="not a regular file"):
        read_labels(tmp_path, "fifo")
    with pytest.raises(ConfigError, match="cannot be read"):
        read_labels(tmp_path, "a\0b")


def test_a_load_config_asks_no_more_than_the_host_has() -> None:
    base = {"name": "m", "max_batch_size": 4}
    check_override(parse_config(base, "request"))
    for change, fragment in [
        ({"max_batch_size": MAX_BATCH_SIZE + 1}, "max_batch_size"),
        ({"instances": [{"count": 10**6}]}, "model instances"),
        ({"backend_options": {"inter_op_threads": 10**6}}, "inter_op_threads"),
    ]:
        with pytest.raises(InvalidInput, match=fragment):
            check_override(parse_config({**base, **change}, "request"))


def test_trace_and_logging_take_the_key_of_any_restriction() -> None:
    access = Access([Restriction.parse("statistics:admin-key=s3cret")])
    for group in ("trace", "logging"):
        with pytest.raises(PermissionDenied, match="'admin-key'"):
            access.check(group, {})
        access.check(group, {"admin-key": "s3cret"})
    access.check("inference", {})
    Access().check("logging", {})  # no key kept: open, as Triton is
    own = Access(
        [
            Restriction.parse("model-repository:admin-key=s3cret"),
            Restriction.parse("logging:log-key=other"),
        ]
    )
    own.check("logging", {"log-key": "other"})
    own.check("trace", {"admin-key": "s3cret"})


def test_a_load_config_names_only_the_gpus_the_host_has() -> None:
    config = parse_config({"name": "m", "instances": [{"device": "cuda:7"}]}, "request")
    check_devices(config, None)  # NVML cannot tell: the runtime says what it lacks
    with pytest.raises(InvalidInput, match="has 2 GPU"):
        check_devices(config, 2)
    with pytest.raises(InvalidInput, match="no GPU"):
        check_devices(config, 0)
    check_devices(parse_config({"name": "m", "instances": [{"device": "cuda:1"}]}, "r"), 2)
