"""Pure parts of the bench: LoadGen log reading, percentiles, peak search, accuracy checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dlscale.bench.accuracy import check_labels, check_reference
from dlscale.bench.data import SampleSet
from dlscale.bench.latency import summarize
from dlscale.bench.lglog import read_logs
from dlscale.bench.peak import find_peak

SUMMARY = """================================================
MLPerf Results Summary
================================================
SUT name : PySUT
Scenario : Server
Mode     : PerformanceOnly
Completed samples per second    : 282.51
Result is : INVALID
  Performance constraints satisfied : NO
  Min duration satisfied : Yes
  Min queries satisfied : Yes
  Early stopping satisfied: NO
Recommendations:
 * Reduce target QPS to improve latency.
Early Stopping Result:
 * Run unsuccessful.

================================================
Additional Stats
================================================
Scheduled samples per second : 283.10
Min latency (ns)                : 400022
Max latency (ns)                : 9000000
Mean latency (ns)               : 1000000
50.00 percentile latency (ns)   : 900000
90.00 percentile latency (ns)   : 2000000
95.00 percentile latency (ns)   : 3000000
97.00 percentile latency (ns)   : 4000000
99.00 percentile latency (ns)   : 5000000
99.90 percentile latency (ns)   : 9000000
"""


def test_read_logs_gives_verdict_reasons_and_figures(tmp_path: Path) -> None:
    (tmp_path / "mlperf_log_summary.txt").write_text(SUMMARY)
    got = read_logs(tmp_path)
    assert got["result"] == "INVALID" and got["valid"] is False
    assert got["reasons"] == [
        "Performance constraints satisfied: NO",
        "Early stopping satisfied: NO",
    ]
    assert got["recommendations"] == ["Reduce target QPS to improve latency."]
    assert got["throughput"] == 282.51
    assert got["scheduled_qps"] == 283.10
    assert got["latency_s"]["p99"] == pytest.approx(0.005)
    assert got["latency_s"]["p99.9"] == pytest.approx(0.009)


def test_summarize_percentiles() -> None:
    ns = np.arange(1, 1001) * 1_000_000  # 1..1000 ms
    got = summarize(ns)
    assert got["p50"] == pytest.approx(0.501)  # "higher": a latency a query really had
    assert got["p99"] == pytest.approx(0.991)
    assert got["max"] == pytest.approx(1.0)
    assert summarize([])["p99"] is None


@pytest.mark.parametrize("capacity", [3.0, 170.0, 1000.0, 7777.0])
def test_find_peak_brackets_the_highest_passing_rate(capacity: float) -> None:
    tried: list[float] = []

    def run_at(qps: float) -> tuple[bool, float]:
        tried.append(qps)
        return qps <= capacity, qps

    search = find_peak(run_at, start_qps=100.0, precision=0.05, max_runs=30)
    assert search.peak_qps is not None
    assert search.peak_qps <= capacity
    assert search.peak_qps >= capacity / 1.05 - 1e-9 or capacity < 100 / 2**5
    assert len(search.runs) == len(tried)


def test_find_peak_reports_none_when_nothing_passes() -> None:
    search = find_peak(lambda q: (False, q), start_qps=8.0, max_runs=5)
    assert search.peak_qps is None and search.best is None
    assert [q for q, _, _ in search.runs] == [8.0, 4.0, 2.0, 1.0]


def test_reference_check_catches_wrong_outputs() -> None:
    reference = [{"y": np.array([1.0, 2.0, 3.0], np.float32)} for _ in range(4)]
    good = {i: {"y": r["y"].copy()} for i, r in enumerate(reference)}
    bad = {i: {"y": r["y"] + 1} for i, r in enumerate(reference)}
    assert check_reference(reference, good, "ref").ok is True
    result = check_reference(reference, bad, "ref")
    assert result.ok is False and result.passed == 0
    assert result.max_abs_error == pytest.approx(1.0)
    assert "differs" in result.mismatches[0]


def test_label_check_counts_top1() -> None:
    samples = SampleSet({"x": np.zeros((4, 2), np.float32)}, np.array([0, 1, 1, 0]), "test")
    scores = {i: {"y": np.eye(2, dtype=np.float32)[p]} for i, p in enumerate([0, 1, 0, 0])}
    result = check_labels(samples, scores)
    assert result.passed == 3 and result.top1 == pytest.approx(0.75)
