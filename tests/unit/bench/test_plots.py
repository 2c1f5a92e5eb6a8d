"""The sweep plot draws a curve only through a sweep; both plots render."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlscale.bench.report import plot_sweep, sweep_series


def _point(target: str, qps: float, throughput: float, valid: bool = True) -> dict[str, Any]:
    return {
        "target": target,
        "target_qps": qps,
        "throughput_samples_per_s": throughput,
        "p99_s": 0.001 * qps / 100,
        "valid": valid,
    }


def test_a_sweep_is_a_curve_and_repeated_rounds_are_points(tmp_path: Path) -> None:
    sweep = [_point("a", q, q * 0.9, valid=q < 400) for q in (400, 100, 200)]
    rounds = [_point("b", 300, t) for t in (280, 270, 290)]
    a, b = sweep_series(sweep + rounds)
    assert (a.target, a.is_curve, a.throughput) == ("a", True, [90.0, 180.0, 360.0])
    assert a.offered == [100, 200, 400]  # the x axis: what was offered, in order
    assert a.invalid == [False, False, True]
    assert (b.target, b.is_curve) == ("b", False)
    assert plot_sweep(sweep + rounds, 0.01, tmp_path / "sweep.png") == tmp_path / "sweep.png"
    assert (tmp_path / "sweep.png").stat().st_size > 0
    assert plot_sweep([], 0.01, tmp_path / "none.png") is None


def test_the_interference_plot_renders_each_condition_with_its_figures(tmp_path: Path) -> None:
    from dlscale.bench.interference_report import plot

    phases = [
        {"condition": c, "p99_s": p99, "neighbor_rate": rate}
        for c, p99, rate in (("alone", 0.006, 900), ("qos off", 0.5, 880), ("qos on", 0.008, 700))
    ]
    report = {
        "phases": phases,
        "summary": {"conditions": [{"condition": "alone", "protected_p99_s": 0.006}]},
        "targets": {"p99_ratio": 1.2, "neighbor_kept": 0.8},
        "protected": {"model": "mlp", "objective_s": 0.05},
        "neighbor": {"model": "resnet50"},
    }
    assert plot(report, tmp_path / "i.png") == tmp_path / "i.png"
    assert (tmp_path / "i.png").stat().st_size > 0
