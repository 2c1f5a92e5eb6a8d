"""Goodput on recorded samples: replica-seconds of a step function, the per-tenant figures, the
scaling events, each replica's load, the timeline and its plot."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlscale.bench import goodput
from dlscale.bench.fleet_watch import replicas_in_view
from dlscale.bench.goodput import FleetSample, Outcome
from dlscale.bench.replay import error_kind
from dlscale.bench.replay_plot import plot_runs
from dlscale.errors import BenchError

#: A fleet of 1 replica, then 3 from 10 s, then 2 from 20 s.
STEPS = [FleetSample(0.0, 1, {"r1": 0}), FleetSample(10.0, 3, {"r1": 50, "r2": 0, "r3": 0}),
         FleetSample(20.0, 2, {"r1": 100, "r2": 40, "r3": 30}),
         FleetSample(30.0, 2, {"r1": 150, "r2": 5})]  # fmt: skip
OBJECTIVES = {"m": 0.1}


def _outcomes() -> list[Outcome]:
    return [
        Outcome(0.0, 0.01, "m", "a", 0.05),
        Outcome(0.5, 0.5, "m", "a", 0.10),  # on the objective: within
        Outcome(1.0, 1.0, "m", "b", 0.30),  # answered late
        Outcome(1.5, 1.6, "m", "b", None, "http_503"),
        Outcome(2.0, 2.0, "m", "b", None, "timeout"),
        Outcome(2.5, 2.5, "m", "a", None, "http_503"),
    ]


def test_replica_seconds_integrate_the_step_function() -> None:
    assert goodput.replica_seconds(STEPS, 0.0, 30.0) == pytest.approx(10 * 1 + 10 * 3 + 10 * 2)
    assert goodput.replica_seconds(STEPS, 5.0, 25.0) == pytest.approx(5 * 1 + 10 * 3 + 5 * 2)
    # The last count holds past the last sample; the first one before the first sample.
    assert goodput.replica_seconds(STEPS, 0.0, 40.0) == pytest.approx(60 + 10 * 2)
    later = [FleetSample(2.0, 4), FleetSample(6.0, 1)]
    assert goodput.replica_seconds(later, 0.0, 10.0) == pytest.approx(6 * 4 + 4 * 1)
    assert goodput.replica_seconds([], 0.0, 10.0) == 0.0
    assert goodput.replica_seconds(STEPS, 5.0, 5.0) == 0.0


def test_goodput_counts_answers_within_the_objective_per_second_and_replica_second() -> None:
    g = goodput.goodput(_outcomes(), OBJECTIVES, 3.0, 6.0)
    assert (g["sent"], g["answered"], g["within_objective"]) == (6, 3, 2)
    assert g["goodput_per_s"] == pytest.approx(2 / 3.0)
    assert g["goodput_per_replica_s"] == pytest.approx(2 / 6.0)
    assert goodput.goodput(_outcomes(), OBJECTIVES, 3.0, None)["goodput_per_replica_s"] is None


def test_tenants_errors_and_scaling_events() -> None:
    tenants = goodput.by_tenant(_outcomes(), OBJECTIVES)
    assert tenants["a"]["sent"] == 3 and tenants["a"]["answered"] == 2
    assert tenants["a"]["within_objective"] == 2
    assert tenants["b"]["within_objective"] == 0
    assert tenants["b"]["latency_s"]["p99"] == pytest.approx(0.30)
    assert goodput.errors_by_kind(_outcomes()) == {"http_503": 2, "timeout": 1}
    assert goodput.scaling_events(STEPS) == [
        {"t_s": 10.0, "from": 1, "to": 3},
        {"t_s": 20.0, "from": 3, "to": 2},
    ]


def test_replica_load_is_each_replicas_answers_per_second() -> None:
    load = goodput.replica_load(STEPS)
    assert load[0] == {"t_s": 10.0, "per_s": {"r1": 5.0, "r2": 0.0, "r3": 0.0}}
    assert load[1]["per_s"] == {"r1": 5.0, "r2": 4.0, "r3": 3.0}
    # r2 restarted (its count went down): what it has counts from zero; r3 left.
    assert load[2]["per_s"] == {"r1": 5.0, "r2": 0.5}


def test_the_timeline_bins_by_send_time_with_the_replicas_then() -> None:
    rows = goodput.timeline(_outcomes(), STEPS, OBJECTIVES, bin_s=1.0)
    assert [r["sent"] for r in rows] == [2, 2, 2]
    assert [r["within_objective"] for r in rows] == [2, 0, 0]
    assert [r["errors"] for r in rows] == [0, 1, 2]
    assert rows[2]["p99_s"] is None and rows[1]["p99_s"] == pytest.approx(0.30)
    assert [r["replicas"] for r in rows] == [1, 1, 1]
    late = goodput.timeline([Outcome(12.0, 12.0, "m", "a", 0.01)], STEPS, OBJECTIVES, 5.0)
    assert [r["replicas"] for r in late] == [1, 1, 3]


def test_the_plot_is_written(tmp_path: Path) -> None:
    outcomes = _outcomes()
    run = {
        "bin_s": 1.0,
        "goodput": goodput.goodput(outcomes, OBJECTIVES, 3.0, 6.0),
        "timeline": goodput.timeline(outcomes, STEPS, OBJECTIVES),
        "replica_load": goodput.replica_load(STEPS),
        "fleet_samples": [{"t_s": s.at_s, "replicas": s.replicas} for s in STEPS],
    }
    path = plot_runs({"static": run, "objective": {**run, "fleet_samples": []}}, tmp_path / "p.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_failures_are_named_by_kind() -> None:
    assert error_kind(TimeoutError()) == "timeout"
    assert error_kind(BenchError("http://h/v2/models/m/infer: HTTP 503: no replica")) == "http_503"
    assert error_kind(BenchError("http://h: ClientConnectorError: Connect call failed")) == (
        "connection"
    )
    assert error_kind(ValueError("odd")) == "other"


def test_the_fleet_view_counts_replicas_in_rotation() -> None:
    view = {"replicas": [
        {"ready": True, "router_state": "UP"},
        {"ready": True, "router_state": "MAINT"},  # draining: takes no new requests
        {"ready": False, "router_state": "UP"},  # still replaying loads
        {"ready": True, "router_state": "UP 1/2"},
    ]}  # fmt: skip
    assert replicas_in_view(view) == 2
    assert replicas_in_view({"detail": "not found"}) is None
