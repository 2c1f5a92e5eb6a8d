"""The client's ceiling against a null server, and the concurrency sweep (real LoadGen runs)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.toolkit.cli import run_cli

from dlscale.bench import report as report_module
from dlscale.bench.ceiling import Ceiling, mark
from dlscale.bench.runner import bench
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions

SHORT = {"duration_s": 0.5, "warmup_s": 0.3, "sample_count": 64}


def test_the_ceiling_is_measured_and_each_run_says_whether_it_reached_it(
    http_url: str, tmp_path: Path
) -> None:
    options = BenchOptions("identity", [Scenario.OFFLINE], workers=2, **SHORT)
    report = bench(http_url, options, tmp_path)
    ceiling = report["client_ceiling"]
    assert ceiling["error"] is None and ceiling["samples_per_s"] > 0
    assert "null-backend" in ceiling["method"] and "http" in ceiling["method"]
    assert "workers 2" in ceiling["method"]
    res = report["scenarios"][0]["result"]
    assert res["verdict"] == "VALID" and res["client_bound"] in (True, False)
    assert "## Client ceiling" in (tmp_path / "report.md").read_text()
    # The ceiling run's own LoadGen logs sit beside the run's.
    assert (tmp_path / "loadgen" / "client-ceiling" / "mlperf_log_summary.txt").is_file()


def test_a_run_at_the_ceiling_is_reported_as_client_bound(http_url: str, tmp_path: Path) -> None:
    options = BenchOptions("identity", [Scenario.OFFLINE], client_ceiling=False, **SHORT)
    report = bench(http_url, options, tmp_path)
    assert report["client_ceiling"] is None
    measured = report["scenarios"][0]["result"]["throughput_samples_per_s"]
    mark(report, Ceiling(measured, "as fast as this very run"))
    assert report["scenarios"][0]["result"]["client_bound"] is True
    assert report["client_ceiling"]["headline_share"] == 1.0
    text = report_module.write_markdown(report, tmp_path / "bound.md").read_text()
    assert "(client-bound)" in text and "the server's throughput is at least" in text


def test_grpc_concurrency_sweep_lists_each_point_and_draws_the_curve(
    grpc_url: str, tmp_path: Path
) -> None:
    options = BenchOptions(
        "identity",
        [Scenario.OFFLINE],
        concurrency_sweep=(1, 2, 4),
        client_ceiling=False,
        **SHORT,
    )
    report = bench(grpc_url, options, tmp_path)
    entry = report["scenarios"][0]
    points = entry["sweep"]
    assert [p["concurrency"] for p in points] == [1, 2, 4]
    for p in points:
        assert p["sweep"] == "concurrency" and p["valid"], p["reasons"]
        assert 0 < p["request_latency_s"]["p50"] <= p["request_latency_s"]["p99"]
    best = max(p["throughput_samples_per_s"] for p in points if p["valid"])
    assert entry["result"]["throughput_samples_per_s"] == best
    assert Path(report["files"]["concurrency_png"]).stat().st_size > 0
    assert "## Concurrency sweep" in (tmp_path / "report.md").read_text()


def test_cli_workers_sweep_and_ceiling_together(http_url: str, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    done = run_cli(
        "bench", http_url, "--model", "identity", "--workers", "2", "--concurrency", "1:4",
        "--duration", "0.5s", "--samples", "64", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    points = report["scenarios"][0]["sweep"]
    assert [p["concurrency"] for p in points] == [1, 2, 4]
    assert all(p["valid"] and p["client_bound"] in (True, False) for p in points)
    assert report["client_ceiling"]["samples_per_s"] > 0
    assert "batch 32, concurrency 4" in report["client_ceiling"]["method"]
    assert (out / "concurrency.png").is_file()
    assert "client ceiling:" in done.stdout
    # The console shows each point's request latency, not only the report (a user saw only an
    # Offline p50 of seconds there), uncut off a terminal.
    assert "Concurrency sweep" in done.stdout and "tar..." not in done.stdout
    for point in points:
        assert f"{point['request_latency_s']['p99'] * 1e3:.3f}" in done.stdout
