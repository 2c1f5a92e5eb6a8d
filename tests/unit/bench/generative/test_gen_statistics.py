"""Token metrics of hand-built requests: TTFT, TPOT, ITL, throughput and goodput by hand."""

from __future__ import annotations

import pytest

from dlscale.bench.generative.records import Chunk, StreamRecord
from dlscale.bench.generative.statistics import Slo, distribution, summarize_run

MS = 1_000_000


def record(
    sent_ms: float, chunk_ms: list[float], done_ms: float, tokens: int | None
) -> StreamRecord:
    r = StreamRecord(sent_ns=int(sent_ms * MS))
    r.chunks = [Chunk(int(t * MS), "x") for t in chunk_ms]
    r.done_ns = int(done_ms * MS)
    r.server_tokens = tokens
    return r


def test_one_request_by_hand() -> None:
    # Sent at 0; text at 10, 14, 20, 30 ms; stream over at 31 ms; the server counted 7 tokens.
    r = record(0, [10, 14, 20, 30], 31, tokens=7)
    assert r.ttft_ns == 10 * MS
    assert r.latency_ns == 31 * MS
    # TPOT = (last token 30 - TTFT 10) / (7 - 1) tokens.
    assert r.tpot_ns == pytest.approx(20 * MS / 6)
    assert r.itl_ns == [4 * MS, 6 * MS, 10 * MS]
    assert r.tokens == 7


def test_token_count_falls_back_to_the_tokenizer_then_chunks() -> None:
    r = record(0, [1, 2, 3], 4, tokens=None)
    assert r.tokens == 3  # one per chunk
    r.counted_tokens = 5
    assert r.tokens == 5  # the tokenizer's count
    r.server_tokens = 6
    assert r.tokens == 6  # the server's count wins


def test_a_one_token_answer_has_no_tpot() -> None:
    assert record(0, [5], 6, tokens=1).tpot_ns is None


def test_distribution_interpolates_linearly() -> None:
    # 1..5 ms: p50 3 ms; p90 = 4 + 0.6 * (5 - 4) = 4.6 ms; p99 = 4 + 0.96 = 4.96 ms.
    d = distribution([1 * MS, 2 * MS, 3 * MS, 4 * MS, 5 * MS])
    assert d["p50"] == pytest.approx(0.003)
    assert d["p90"] == pytest.approx(0.0046)
    assert d["p99"] == pytest.approx(0.00496)
    assert d["mean"] == pytest.approx(0.003)
    assert (d["min"], d["max"]) == (pytest.approx(0.001), pytest.approx(0.005))
    assert distribution([])["p50"] is None


def test_run_throughput_goodput_and_failures() -> None:
    fast = record(0, [10, 20, 30], 30, tokens=3)  # TTFT 10 ms, TPOT 10 ms
    slow = record(100, [300, 400], 500, tokens=2)  # TTFT 200 ms, TPOT 100 ms
    failed = StreamRecord(sent_ns=50 * MS, done_ns=60 * MS, error="HTTP 500: boom")
    stats = summarize_run([fast, slow, failed], Slo(ttft_s=0.050, tpot_s=0.050))
    # The run spans 0 .. 500 ms; 5 tokens from the two that succeeded.
    assert stats.duration_s == pytest.approx(0.5)
    assert (stats.requests, stats.succeeded, stats.failed) == (3, 2, 1)
    assert stats.output_tokens == 5
    assert stats.output_tokens_per_s == pytest.approx(10.0)
    assert stats.requests_per_s == pytest.approx(4.0)
    # Only the fast one met both bounds: 1 request in 0.5 s.
    assert stats.slo_met == 1
    assert stats.goodput_per_s == pytest.approx(2.0)
    assert stats.ttft["p50"] == pytest.approx(0.105)  # midway between 10 and 200 ms
    assert stats.first_errors == ["HTTP 500: boom"]


def test_no_slo_no_goodput() -> None:
    stats = summarize_run([record(0, [1, 2], 3, tokens=2)])
    assert stats.goodput_per_s is None and stats.slo_met is None
