"""`--workers`: LoadGen issues here, worker processes send, receive and check (real server)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.toolkit.verdicts import every_sample_answered

from dlscale.bench.runner import bench
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions

SHORT = {"duration_s": 0.5, "warmup_s": 0.3, "sample_count": 64, "client_ceiling": False}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_two_workers_offline_and_server_are_valid(
    protocol: str, http_url: str, grpc_url: str, tmp_path: Path
) -> None:
    url = http_url if protocol == "http" else grpc_url
    options = BenchOptions(
        "identity",
        [Scenario.OFFLINE, Scenario.SERVER],
        target_qps=200.0,
        latency_bound_s=1.0,
        workers=2,
        **SHORT,
    )
    report = bench(url, options, tmp_path)
    every_sample_answered(report)
    assert report["options"]["workers"] == 2


def test_two_workers_check_every_answer_in_accuracy_mode(
    http_url: str, repo: Path, tmp_path: Path
) -> None:
    reference = repo / "identity" / "1" / "model.onnx"
    options = BenchOptions(
        "identity", [Scenario.OFFLINE], accuracy=True, reference=reference, workers=2, **SHORT
    )
    res = bench(http_url, options, tmp_path)["scenarios"][0]["result"]
    assert res["verdict"] == "VALID", res["reasons"]
    assert res["accuracy"]["ok"] is True and res["accuracy"]["samples"] == 64


def test_workers_catch_a_server_answering_wrong(http_url: str, repo: Path, tmp_path: Path) -> None:
    reference = repo / "identity" / "1" / "model.onnx"
    options = BenchOptions(
        "broken", [Scenario.SINGLESTREAM], accuracy=True, reference=reference, workers=2, **SHORT
    )
    res = bench(http_url, options, tmp_path)["scenarios"][0]["result"]
    assert res["accuracy"]["ok"] is False and res["verdict"] == "INVALID"


def test_workers_need_a_server(repo: Path) -> None:
    from dlscale.errors import BenchError

    options = BenchOptions("identity", [Scenario.OFFLINE], repo=repo, workers=2, **SHORT)
    with pytest.raises(BenchError, match="--workers sends requests"):
        bench(None, options, Path("unused"))


def test_samples_of_dead_workers_are_completed_as_failures(http_url: str, tmp_path: Path) -> None:
    # LoadGen waits for every sample it issued: workers that are gone must not leave it waiting.
    from dlscale.bench.loadgen import LoopThread
    from dlscale.bench.session import Session

    options = BenchOptions("identity", [Scenario.OFFLINE], workers=2, **SHORT)
    loop = LoopThread()
    session = Session(http_url, options, loop)
    try:
        session.open()
        assert session.pool is not None
        for process in session.pool._processes:
            process.kill()
            process.join()
        result = session.run(session.settings(Scenario.OFFLINE), tmp_path)
    finally:
        session.close()
        loop.close()
    assert result.issued > 0 and result.completed == result.issued == result.errors
    assert not result.valid and "bench worker" in result.first_errors[0]
