"""`dlscale bench URL --trace | --shape burst` against a live server on port 0: the trace's order
and per-second counts reach the server, the loop stays open, failures are counted by kind."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.toolkit.models import write_null_model
from tests.toolkit.repositories import BATCHED, NULL_TENSORS
from tests.toolkit.server import LocalServer, serving

from dlscale.bench.replay_run import ReplayOptions, run_replay
from dlscale.bench.trace import BurstShape
from dlscale.cli import main

#: Seconds the slow model holds each request (one at a time): far above any scheduling jitter.
SLOW_S = 1.5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("replay-repo")
    tensors = NULL_TENSORS.format(inp="input", out="output", width=4, out_width=4)
    write_null_model(root, "fast", BATCHED.format(max_batch=8, delay=0) + tensors)
    slow = f"[backend_options]\ndelay_us = {int(SLOW_S * 1e6)}\n"
    write_null_model(root, "slow", BATCHED.format(max_batch=1, delay=0) + tensors + slow)
    with serving(root, model_control="none", grpc_port=None) as running:
        yield running


def _answered(server: LocalServer, model: str) -> int:
    stats = httpx.get(f"http://{server.http_url}/v2/models/{model}/stats").json()
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


def _requests(report: dict[str, Any]) -> list[dict[str, Any]]:
    lines = Path(report["files"]["requests"]).read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_a_trace_is_sent_in_its_order_and_per_second_counts(
    server: LocalServer, tmp_path: Path
) -> None:
    # 3, 6 and 2 requests in seconds 0, 1 and 2, each in the middle of its second, written out
    # of order: the replay sorts them by time.
    counts = {0: 3, 1: 6, 2: 2}
    lines = [
        {"t": s + 0.3 + 0.04 * i, "model": "fast", "tenant": f"t{i % 2}"}
        for s, n in counts.items()
        for i in range(n)
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in reversed(lines)) + "\n")
    before = _answered(server, "fast")
    url = f"http://{server.http_url}"
    report = run_replay(ReplayOptions(url, tmp_path / "out", trace=path, objective_s=30.0))
    sent = _requests(report)
    assert [r["offset_s"] for r in sent] == [x["t"] for x in lines]
    order = sorted(range(len(sent)), key=lambda i: sent[i]["sent_s"])
    assert order == list(range(len(sent)))  # sent in the trace's order
    assert all(r["sent_s"] >= r["offset_s"] for r in sent)  # never early
    assert Counter(int(r["sent_s"]) for r in sent) == Counter(counts)
    assert [row["sent"] for row in report["timeline"]] == [3, 6, 2]
    # Every request reached the server and was answered.
    assert _answered(server, "fast") - before == len(lines)
    assert report["goodput"]["within_objective"] == len(lines) and report["errors"] == {}
    assert set(report["tenants"]) == {"t0", "t1"}
    assert Path(report["files"]["plot"]).read_bytes()[:4] == b"\x89PNG"


def test_the_loop_is_open_requests_go_while_earlier_ones_wait(
    server: LocalServer, tmp_path: Path
) -> None:
    # The slow model answers one request per SLOW_S: a closed loop would send the second only
    # after the first answer; an open one sends all four within 0.3 s.
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(f'{{"t": {0.1 * i}, "model": "slow"}}\n' for i in range(4)))
    url = f"http://{server.http_url}"
    report = run_replay(ReplayOptions(url, tmp_path / "out", trace=path, objective_s=60.0))
    sent = _requests(report)
    first_answer = sent[0]["sent_s"] + sent[0]["latency_s"]
    assert all(r["sent_s"] < first_answer for r in sent)
    # They queued in the server behind each other: each answered after the one before.
    answers = [r["sent_s"] + r["latency_s"] for r in sent]
    assert answers == sorted(answers)


def test_past_the_in_flight_bound_a_request_fails_in_the_client_not_queued(
    server: LocalServer, tmp_path: Path
) -> None:
    # Two in flight at most; the slow model holds each for SLOW_S, so the third and fourth,
    # sent 0.1 s apart, find two requests in flight and are counted, not sent.
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(f'{{"t": {0.1 * i}, "model": "slow"}}\n' for i in range(4)))
    before = _answered(server, "slow")
    options = ReplayOptions(
        f"http://{server.http_url}", tmp_path / "out", trace=path, objective_s=60.0,
        max_in_flight=2,
    )  # fmt: skip
    report = run_replay(options)
    assert report["errors"] == {"client_cap": 2}
    assert [r["error"] for r in _requests(report)] == ["", "", "client_cap", "client_cap"]
    assert _answered(server, "slow") - before == 2


def test_failures_are_counted_by_kind_and_the_load_goes_on(
    server: LocalServer, tmp_path: Path
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"t": 0, "model": "fast", "tenant": "ok"}\n'
        '{"t": 0.1, "model": "fast", "tenant": "wrong", "shape": [1, 5]}\n'
        '{"t": 0.2, "model": "fast", "tenant": "ok", "shape": [3, 4]}\n'
    )
    url = f"http://{server.http_url}"
    report = run_replay(ReplayOptions(url, tmp_path / "out", trace=path, objective_s=30.0))
    assert report["errors"] == {"http_400": 1}
    assert report["tenants"]["ok"]["answered"] == 2 and report["tenants"]["wrong"]["answered"] == 0


def test_the_burst_shape_from_the_command_line(
    server: LocalServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([
        "bench", f"http://{server.http_url}", "--model", "fast", "--shape", "burst",
        "--baseline-rate", "4", "--burst-factor", "5", "--before", "1s", "--burst", "1s",
        "--after", "1s", "--tenants", "a,b", "--latency-bound", "30s", "--out", str(tmp_path),
    ])  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "report.json").read_text())
    shape = BurstShape(4, 5, 1, 1, 1)
    assert report["load"]["mean_rate"] == pytest.approx(shape.mean_rate)
    assert report["goodput"]["sent"] == report["goodput"]["within_objective"] > 0
    assert set(report["tenants"]) == {"a", "b"}
    assert "goodput" in capsys.readouterr().out


def test_absurd_rates_are_refused_before_a_request_goes(
    server: LocalServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _answered(server, "fast")
    code = main([
        "bench", f"http://{server.http_url}", "--model", "fast", "--shape", "burst",
        "--baseline-rate", "1e7", "--out", str(tmp_path),
    ])  # fmt: skip
    assert code == 1 and "at most 10000/s" in capsys.readouterr().err
    assert _answered(server, "fast") == before
