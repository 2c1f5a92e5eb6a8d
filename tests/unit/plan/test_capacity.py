"""The serving capacity planner: roofline and profile service curves, and monotone answers.

Devices are the hardware catalog's: H100-SXM (1979 TOP/s INT8, 3.35 TB/s, 700 W) and L4
(242.5 TOP/s INT8, 0.3 TB/s, 72 W).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlscale.errors import DlscaleError, PlanError
from dlscale.hardware.catalog import load_catalog
from dlscale.plan.serve import (
    Profile,
    ServiceCurve,
    Workload,
    plan_device,
    plan_serving,
    profile_curve,
    roofline,
    roofline_curve,
)

BIG = load_catalog().get("H100-SXM")
SMALL = load_catalog().get("L4")
# 8 GFLOP per sample; 25 MB of weights shared by the batch plus 5 MB of activations each
RESNETISH = Workload("resnetish", 8e9, lambda _p, b: 25e6 / b + 5e6)


def test_roofline_bound() -> None:
    # H100, batch 1: compute 1979e12 / 8e9 = 247,375/s; memory 3.35e12 / 30e6 = 111,667/s
    r = roofline(BIG, RESNETISH, "int8", 1)
    assert r.bound == "memory"
    assert r.attainable_rate == pytest.approx(3.35e12 / 30e6)
    # batch 64: memory 3.35e12 / (25e6/64 + 5e6) = 621k/s > 247k/s -> compute
    r = roofline(BIG, RESNETISH, "int8", 64)
    assert (r.bound, r.attainable_rate) == ("compute", pytest.approx(247_375))
    with pytest.raises(DlscaleError, match="int4"):
        roofline(BIG, RESNETISH, "int4", 1)


def test_roofline_curve_divides_by_efficiency() -> None:
    curve = roofline_curve(BIG, RESNETISH, "int8", efficiency=0.5, max_batch=64)
    assert curve.time(64) == pytest.approx(64 / (247_375 * 0.5))
    assert curve.time(1) == pytest.approx(1 / (3.35e12 / 30e6 * 0.5))
    assert "compute-bound" in curve.basis
    with pytest.raises(PlanError):
        roofline_curve(BIG, RESNETISH, "int8", efficiency=1.5)


def write_profile(tmp_path: Path, table: dict[str, float]) -> Path:
    path = tmp_path / "profile.json"
    raw = {
        "model": "resnetish",
        "device": "H100-SXM",
        "precision": "int8",
        "batch_latency_s": table,
    }
    path.write_text(json.dumps(raw))
    return path


def test_profile_interpolates_and_rejects_junk(tmp_path: Path) -> None:
    profile = Profile.load(write_profile(tmp_path, {"1": 1e-3, "8": 2e-3, "32": 5e-3}))
    assert profile.time(1) == pytest.approx(1e-3)
    assert profile.time(20) == pytest.approx(2e-3 + 3e-3 * 12 / 24)
    with pytest.raises(PlanError, match="up to 32"):
        profile.time(64)
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "m", "batch_latency_s": {"1": 0.001}}')
    with pytest.raises(PlanError, match="not a profile"):
        Profile.load(bad)
    with pytest.raises(PlanError, match="cannot read"):
        Profile.load(tmp_path / "missing.json")


def test_profile_read_from_a_bench_report(tmp_path: Path) -> None:
    # `dlscale bench` writes the profile inside report.json (bench/environment.py).
    report = {
        "format": "dlscale-bench/1",
        "scenarios": [],
        "profile": {
            "model": "mlp",
            "device": "H100-SXM",
            "precision": "fp32",
            "batch_latency_s": {"1": 2e-4, "256": 3e-2},
        },
    }
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    profile = Profile.load(path)
    assert (profile.model, profile.device, profile.precision) == ("mlp", "H100-SXM", "fp32")
    assert profile.time(256) == pytest.approx(3e-2)
    report["profile"] = None  # nothing was timed (a server without statistics)
    path.write_text(json.dumps(report))
    with pytest.raises(PlanError, match="no profile"):
        Profile.load(path)
    report["profile"] = {**report_profile(), "device": None}  # remote: device unknown
    path.write_text(json.dumps(report))
    with pytest.raises(PlanError, match="no catalog device"):
        Profile.load(path)


def test_profile_spread_stays_on_its_device(tmp_path: Path) -> None:
    path = tmp_path / "spread.json"
    raw = {**report_profile(), "device": "H100-SXM", "batch_latency_spread": [0.8, 1.2]}
    path.write_text(json.dumps(raw))
    profile = Profile.load(path)
    assert profile.spread == (0.8, 1.2)
    assert profile_curve(profile, BIG, BIG, RESNETISH).spread == (0.8, 1.2)
    assert profile_curve(profile, BIG, SMALL, RESNETISH).spread == ()
    path.write_text(json.dumps({**raw, "batch_latency_spread": [1.0, -1.0]}))
    with pytest.raises(PlanError, match="spread"):
        Profile.load(path)


def report_profile() -> dict[str, object]:
    return {"model": "m", "device": "L4", "precision": "fp32", "batch_latency_s": {"1": 1e-3}}


def test_profile_scaled_by_roofline_ratio(tmp_path: Path) -> None:
    profile = Profile.load(write_profile(tmp_path, {"1": 1e-3, "64": 4e-3}))
    same = profile_curve(profile, BIG, BIG, RESNETISH)
    assert same.time(64) == pytest.approx(4e-3)
    assert same.basis == "measured on H100-SXM"
    moved = profile_curve(profile, BIG, SMALL, RESNETISH)
    # batch 64: H100 compute-bound at 247,375/s; L4 at min(242.5e12/8e9, 0.3e12/5.39e6) =
    # min(30,312, 55,652) = 30,312/s, compute-bound too: ratio 1979 / 242.5 = 8.16
    assert moved.time(64) == pytest.approx(4e-3 * 1979 / 242.5)
    assert "x 8.16" in moved.basis and "compute-bound there, compute-bound here" in moved.basis
    # batch 1: H100 111,667/s (memory) against L4 0.3e12 / 30e6 = 10,000/s (memory): 11.17
    assert moved.time(1) == pytest.approx(1e-3 * 3.35 / 0.3)


@pytest.fixture(scope="module")
def small_curve() -> ServiceCurve:
    return roofline_curve(SMALL, RESNETISH, "int8", efficiency=0.4, max_batch=8)


def test_devices_needed_grow_with_load(small_curve: ServiceCurve) -> None:
    counts = [plan_device(small_curve, qps, 0.015).devices for qps in (1e3, 1e4, 3e4, 1e5)]
    assert all(c is not None for c in counts)
    assert counts == sorted(counts)
    assert counts[0] < counts[-1]


def test_devices_needed_shrink_as_the_slo_loosens(small_curve: ServiceCurve) -> None:
    plans = [plan_device(small_curve, 2e4, slo) for slo in (0.004, 0.008, 0.015, 0.1)]
    rates = [p.peak_rate_per_device for p in plans]
    assert rates == sorted(rates)
    counts = [p.devices for p in plans]
    assert all(c is not None for c in counts)
    assert counts == sorted(counts, reverse=True)


def test_unmeetable_slo(small_curve: ServiceCurve) -> None:
    # one sample alone takes 1 / (10k/s x 0.4) = 250 us
    plan = plan_device(small_curve, 1000, 200e-6)
    assert plan.devices is None and plan.power_watts is None


def test_power_and_cost(small_curve: ServiceCurve) -> None:
    plan = plan_device(small_curve, 2e4, 0.015, price_per_hour=0.8)
    assert plan.devices is not None
    assert plan.power_watts == pytest.approx(plan.devices * 72.0)
    # dollars per hour / inferences per hour x a million
    assert plan.cost_per_million == pytest.approx(plan.devices * 0.8 / (2e4 * 3600) * 1e6)


def test_plans_cheapest_first() -> None:
    curves = [roofline_curve(d, RESNETISH, "int8", 0.4, 8) for d in (SMALL, BIG)]
    plans = plan_serving(curves, 5e4, 0.015, {"L4": 0.8, "H100-SXM": 2.5})
    costs = [p.cost_per_million for p in plans]
    assert all(c is not None for c in costs)
    assert costs == sorted(costs)  # type: ignore[type-var]
    with pytest.raises(PlanError, match="positive"):
        plan_device(curves[0], 0, 0.015)
