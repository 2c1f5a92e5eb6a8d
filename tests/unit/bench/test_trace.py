"""Trace files and the burst shape: the schema kept, bad lines and absurd loads refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlscale.bench import trace
from dlscale.bench.trace import BurstShape, TraceRequest, burst_trace, read_trace
from dlscale.cli import main
from dlscale.errors import BenchError


def _write(path: Path, lines: list[object]) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_a_trace_keeps_its_times_fields_and_order(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [
        {"t": 1.5, "model": "m", "tenant": "b", "shape": [2, 16]},
        {"t": 0.25, "model": "m", "tenant": "a"},
        "",
        {"t": 1.5, "model": "n", "prompt_tokens": 12, "output_tokens": 3},
    ])  # fmt: skip
    assert read_trace(path) == [
        TraceRequest(0.25, "m", "a"),
        TraceRequest(1.5, "m", "b", (2, 16)),
        # Same instant: the file's order is kept; no tenant is the default one.
        TraceRequest(1.5, "n", "default", None, 12, 3),
    ]


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "a line must be a JSON object"),
        ('{"t": -1, "model": "m"}', "t must be seconds"),
        ('{"t": "soon", "model": "m"}', "t must be seconds"),
        ('{"t": 1e9, "model": "m"}', "t must be seconds"),
        ('{"t": true, "model": "m"}', "t must be seconds"),
        ('{"model": "m"}', "t must be seconds"),
        ('{"t": 1}', "model must be a printable string"),
        ('{"t": 1, "model": ""}', "model must be a printable string"),
        ('{"t": 1, "model": "m", "tenant": 7}', "tenant must be a printable string"),
        ('{"t": 1, "model": "m", "shape": [0, 16]}', "each dimension 1 to"),
        ('{"t": 1, "model": "m", "shape": [65536, 65536]}', "elements at most"),
        ('{"t": 1, "model": "m", "shape": "2x16"}', "shape must be a list"),
        ('{"t": 1, "model": "m", "output_tokens": 0}', "output_tokens must be an integer"),
        ('{"t": 1, "model": "m", "prompt_tokens": 1.5}', "prompt_tokens must be an integer"),
        ('{"t": 1, "model": "m", "when": 2}', "unknown key(s) ['when']"),
    ],
)
def test_a_bad_line_is_refused_with_its_number(tmp_path: Path, bad: str, says: str) -> None:
    path = _write(tmp_path / "t.jsonl", [{"t": 0, "model": "m"}, {"t": 1, "model": "m"}, bad])
    with pytest.raises(BenchError) as caught:
        read_trace(path)
    assert f"{path}:3:" in str(caught.value) and says in str(caught.value)


def test_the_command_line_says_which_line_is_bad(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No server is reached: the trace is read before anything is opened.
    path = _write(tmp_path / "t.jsonl", [{"t": 0, "model": "m"}, '{"t": -2, "model": "m"}'])
    code = main(["bench", "http://127.0.0.1:9", "--trace", str(path)])
    assert code == 1
    assert f"{path}:2: t must be seconds" in capsys.readouterr().err


def test_a_trace_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as f:  # sparse: nothing of it is ever in memory
        f.truncate(trace.MAX_TRACE_BYTES + 1)
    with pytest.raises(BenchError, match="bytes, more than the"):
        read_trace(path)


def test_a_trace_with_more_requests_than_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "many.jsonl"
    path.write_text('{"t":0,"model":"m"}\n' * (trace.MAX_REQUESTS + 1))
    with pytest.raises(BenchError, match=f"more than {trace.MAX_REQUESTS} requests"):
        read_trace(path)


def test_a_long_line_an_empty_trace_and_a_missing_file_are_refused(tmp_path: Path) -> None:
    long = _write(tmp_path / "long.jsonl", ['{"t": 0, "model": "' + "m" * 70_000 + '"}'])
    with pytest.raises(BenchError, match=r"long.jsonl:1: longer than"):
        read_trace(long)
    with pytest.raises(BenchError, match="no requests"):
        read_trace(_write(tmp_path / "empty.jsonl", [""]))
    with pytest.raises(BenchError, match="no such file"):
        read_trace(tmp_path / "absent.jsonl")


@pytest.mark.parametrize(
    ("shape", "says"),
    [
        (BurstShape(rate=1e9), "at most"),
        (BurstShape(rate=5000, factor=5), "at most"),
        (BurstShape(rate=0), "above 0"),
        (BurstShape(rate=float("nan")), "finite"),
        (BurstShape(before_s=-1), ">= 0"),
        (BurstShape(burst_s=float("inf")), "finite"),
        (BurstShape(before_s=0, burst_s=0, after_s=0), "from 0 to"),
        # 1000/s for 60 s, 5x that for 60 s: 420 000 requests, above the limit.
        (BurstShape(rate=1000, before_s=60, burst_s=60, after_s=60), "more than 200000"),
    ],
)
def test_absurd_shapes_are_refused_before_a_request_is_drawn(shape: BurstShape, says: str) -> None:
    with pytest.raises(BenchError, match=says):
        burst_trace(shape, "m")


def test_the_burst_shape_sends_each_phase_at_its_rate_tenants_in_turn() -> None:
    shape = BurstShape(rate=20, factor=5, before_s=30, burst_s=20, after_s=30)
    requests = burst_trace(shape, "m", ("a", "b"), seed=3)
    assert requests == burst_trace(shape, "m", ("a", "b"), seed=3)  # seeded: the same schedule
    assert [r.offset_s for r in requests] == sorted(r.offset_s for r in requests)
    before = sum(r.offset_s < 30 for r in requests)
    burst = sum(30 <= r.offset_s < 50 for r in requests)
    after = sum(r.offset_s >= 50 for r in requests)
    # Poisson counts of 600, 2000 and 600 on average: within 15% (several deviations).
    assert 510 < before < 690 and 1700 < burst < 2300 and 510 < after < 690
    assert max(r.offset_s for r in requests) < 80
    assert [r.tenant for r in requests[:4]] == ["a", "b", "a", "b"]
    assert shape.mean_rate == pytest.approx(40.0)
