"""Scenario names, durations, latency bounds and the LoadGen settings they produce."""

from __future__ import annotations

import mlperf_loadgen as lg
import pytest

from dlscale.bench.scenarios import (
    RunSettings,
    Scenario,
    latency_bound_for,
    parse_duration,
)
from dlscale.errors import BenchError


def test_parse_scenarios() -> None:
    assert Scenario.parse("Server") == [Scenario.SERVER]
    assert Scenario.parse("all") == list(Scenario)
    with pytest.raises(BenchError, match="unknown scenario 'fast'"):
        Scenario.parse("fast")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15ms", 0.015), ("10s", 10.0), ("2m", 120.0), ("250us", 250e-6), ("3", 3.0)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["soon", "-1s", "0ms"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(BenchError):
        parse_duration(text)


def test_latency_bounds_come_from_mlperf_then_the_user() -> None:
    assert latency_bound_for("resnet50", None) == (0.015, "MLPerf server bound")
    assert latency_bound_for("bert-base", None)[0] == 0.130
    assert latency_bound_for("resnet50", 0.05) == (0.05, "--latency-bound")
    assert latency_bound_for("identity", None)[1] == "default"


def test_short_runs_set_duration_counts_and_rate() -> None:
    s = RunSettings(Scenario.SERVER, duration_s=2.0, min_query_count=100, target_qps=250.0)
    t = s.to_loadgen(sample_count=32)
    assert t.scenario == lg.TestScenario.Server
    assert (t.min_duration_ms, t.min_query_count, t.server_target_qps) == (2000, 100, 250.0)
    assert t.performance_sample_count_override == 32
    assert t.mode == lg.TestMode.PerformanceOnly


def test_official_runs_take_mlperf_minimums() -> None:
    s = RunSettings(Scenario.OFFLINE, official=True, model_key="resnet50", accuracy=True)
    t = s.to_loadgen(sample_count=32)
    assert t.min_duration_ms == 600_000
    assert t.min_query_count == 24576
    assert t.mode == lg.TestMode.AccuracyOnly


def test_server_without_a_rate_is_refused() -> None:
    with pytest.raises(BenchError, match="--target-qps"):
        RunSettings(Scenario.SERVER).to_loadgen(8)
