"""Short real LoadGen runs against a live dlscale server over HTTP and gRPC (port 0)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from tests.toolkit.cli import run_cli
from tests.toolkit.models import identity_graph, write_model
from tests.toolkit.server import serving
from tests.toolkit.verdicts import every_sample_answered

from dlscale.bench.runner import bench
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions

SHORT = {"duration_s": 0.5, "warmup_s": 0.3, "sample_count": 64}


def test_http_offline_and_server_are_valid(http_url: str, tmp_path: Path) -> None:
    # A p99 bound any machine meets, loaded or not: this checks the path, not this CPU's speed
    # (MLPerf's default bound failed here on a shared 2-core machine).
    options = BenchOptions(
        "identity",
        [Scenario.OFFLINE, Scenario.SERVER],
        target_qps=300.0,
        latency_bound_s=1.0,
        **SHORT,
    )
    report = bench(http_url, options, tmp_path)
    every_sample_answered(report)
    assert report["targets"][0]["kind"] == "http"
    # The server's statistics extension gives the per-batch-size profile.
    assert report["profile"] is not None and report["profile"]["batch_latency_s"]


def test_http_accuracy_catches_a_server_answering_wrong(
    http_url: str, repo: Path, tmp_path: Path
) -> None:
    reference = repo / "identity" / "1" / "model.onnx"
    options = BenchOptions(
        "broken", [Scenario.SINGLESTREAM], accuracy=True, reference=reference, **SHORT
    )
    res = bench(http_url, options, tmp_path)["scenarios"][0]["result"]
    assert res["accuracy"]["ok"] is False and res["verdict"] == "INVALID"


def test_http_unknown_model_is_a_clear_error(http_url: str) -> None:
    from dlscale.errors import BenchError

    with pytest.raises(BenchError, match="no ready model 'nope'"):
        bench(http_url, BenchOptions("nope", [Scenario.OFFLINE], **SHORT), Path("unused"))


def test_grpc_singlestream_is_valid(grpc_url: str, tmp_path: Path) -> None:
    report = bench(grpc_url, BenchOptions("identity", [Scenario.SINGLESTREAM], **SHORT), tmp_path)
    every_sample_answered(report)


def test_bench_compare_alternates_and_gives_ratios(
    http_url: str, grpc_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "compare"
    done = run_cli(
        "bench", "compare", http_url, grpc_url, "--model", "identity",
        "--scenario", "multistream", "--duration", "0.5s", "--samples", "64", "--rounds", "2",
        "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["rounds"] == 2
    rows = report["comparison"]
    assert [r["target"] for r in rows] == [http_url, grpc_url]
    for row in rows:
        assert row["scenario"] == "MultiStream" and row["runs"] == row["valid_runs"] == 2
        assert len(row["throughput_rounds"]) == len(row["p99_rounds_s"]) == 2
        assert row["throughput"] == pytest.approx(statistics.median(row["throughput_rounds"]))
        assert row["p99_s"] == pytest.approx(statistics.median(row["p99_rounds_s"]))
    base, other = rows
    # Each target's median over the baseline's, whatever they measured.
    assert other["throughput_ratio"] == pytest.approx(other["throughput"] / base["throughput"])
    assert other["p99_ratio"] == pytest.approx(other["p99_s"] / base["p99_s"])
    # The runs alternated: target 1, target 2, then target 1 and 2 again (LoadGen's own logs).
    order = ["target1/round1", "target2/round1", "target1/round2", "target2/round2"]
    written = [
        (out / "loadgen" / run / "multistream" / "mlperf_log_summary.txt").stat().st_mtime_ns
        for run in order
    ]
    assert written == sorted(written)
    # The summary a reader sees names both targets and the ratio.
    assert http_url in done.stdout and grpc_url in done.stdout
    assert f"{other['throughput_ratio']:.3f}" in (out / "report.md").read_text()


def test_grpc_reads_the_models_config_and_keeps_to_its_max_batch_size(tmp_path: Path) -> None:
    # Triton configs often say 8 or 16: the gRPC target must read it as the REST target does
    # (it used to send 32 rows and get INVALID_ARGUMENT), and take the batch profile too.
    repo = tmp_path / "repo"
    write_model(repo, "small", identity_graph(4, "INPUT0", "OUTPUT0"), "max_batch_size = 8\n")
    with serving(repo, model_control="none") as running:
        out = tmp_path / "out"
        done = run_cli(
            "bench", f"grpc://{running.grpc_url}", "--model", "small", "--scenario", "offline",
            "--batch-size", "32", "--duration", "0.5s", "--samples", "64", "--out", str(out),
            "--no-progress",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    every_sample_answered(report)
    assert report["profile"] is not None
    assert max(int(b) for b in report["profile"]["batch_latency_s"]) <= 8
