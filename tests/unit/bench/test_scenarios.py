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


@pytest.mark.parametrize(
    ("settings", "minimums_s"),
    [
        # The demo's Server run on resnet50 with two cores: 512 queries at 4.7/s.
        (RunSettings(Scenario.SERVER, duration_s=5, min_query_count=512, target_qps=4.7), 108.9),
        (RunSettings(Scenario.SERVER, duration_s=5, min_query_count=512, target_qps=1e4), 5.0),
        (RunSettings(Scenario.SINGLESTREAM, 5, 64, expected_latency_s=0.5), 32.0),
        (RunSettings(Scenario.OFFLINE, duration_s=5, min_query_count=1), 5.0),
    ],
)
def test_the_safety_net_leaves_time_for_the_minimums(
    settings: RunSettings, minimums_s: float
) -> None:
    # A run that keeps up stops at its minimums; the net must not end it before them.
    assert settings.minimums_s() == pytest.approx(minimums_s, abs=0.1)
    net_s = settings.to_loadgen(sample_count=8).max_duration_ms / 1000
    assert net_s >= minimums_s + 30 and net_s >= 4 * settings.duration_s


def test_official_runs_take_mlperf_minimums() -> None:
    s = RunSettings(Scenario.OFFLINE, official=True, model_key="resnet50", accuracy=True)
    t = s.to_loadgen(sample_count=32)
    assert t.min_duration_ms == 600_000
    assert t.min_query_count == 24576
    assert t.mode == lg.TestMode.AccuracyOnly


def test_server_without_a_rate_is_refused() -> None:
    with pytest.raises(BenchError, match="--target-qps"):
        RunSettings(Scenario.SERVER).to_loadgen(8)
