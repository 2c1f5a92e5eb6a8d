"""Short real LoadGen runs against a live dlscale server over HTTP and gRPC (port 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlscale.bench.runner import bench, compare
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions

SHORT = {"duration_s": 0.5, "warmup_s": 0.3, "sample_count": 64}


def _check_valid(report: dict[str, Any]) -> None:
    for entry in report["scenarios"]:
        res = entry["result"]
        assert res["verdict"] == "VALID", res["reasons"]
        assert res["completed"] == res["issued"] > 0 and res["errors"]["count"] == 0
        assert 0 < res["latency_s"]["p50"] <= res["latency_s"]["p99"]


def test_http_offline_and_server_are_valid(http_url: str, tmp_path: Path) -> None:
    options = BenchOptions(
        "identity", [Scenario.OFFLINE, Scenario.SERVER], target_qps=300.0, **SHORT
    )
    report = bench(http_url, options, tmp_path)
    _check_valid(report)
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
    _check_valid(report)


def test_compare_alternates_and_gives_ratios(http_url: str, grpc_url: str, tmp_path: Path) -> None:
    options = BenchOptions("identity", [Scenario.MULTISTREAM], **SHORT)
    report = compare([http_url, grpc_url], options, tmp_path, rounds=2)
    rows = report["comparison"]
    assert [r["target"] for r in rows] == [http_url, grpc_url]
    assert rows[0]["throughput_ratio"] == pytest.approx(1.0)
    assert rows[1]["throughput_ratio"] > 0 and rows[1]["runs"] == 2
