"""`dlscale bench` on a served pipeline: JPEG bytes in (the zoo's set, or a folder of files), the
per-step breakdown read from the server's statistics over REST and gRPC, and in process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.toolkit.server import LocalServer, serving

from dlscale.bench.runner import bench
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions
from dlscale.errors import BenchError
from dlscale.models.zoo.e2e import SMALLCNN_E2E
from dlscale.models.zoo.jpegs import write_jpegs

PIPELINE = SMALLCNN_E2E.name
STEPS = list(SMALLCNN_E2E.parts)
#: A bound any machine meets, loaded or not: these check the path, not this CPU's speed.
SHORT: dict[str, Any] = {
    "duration_s": 0.5,
    "warmup_s": 0.3,
    "latency_bound_s": 2.0,
    "client_ceiling": False,
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """smallcnn-e2e: JPEG -> image step -> smallcnn -> top-k step, built by the zoo."""
    root = tmp_path_factory.mktemp("pipeline-repo")
    SMALLCNN_E2E.build(root)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo, model_control="none") as running:
        yield running


@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 JPEGs, plus what a folder must not contribute: a hidden file, a subfolder, a link to a
    file outside the folder."""
    root = tmp_path_factory.mktemp("jpegs")
    folder = root / "photos"
    write_jpegs(folder, 8, seed=3, size=(120, 160))
    (folder / ".hidden.jpg").write_bytes(b"not an image")
    (folder / "sub").mkdir()
    (folder / "sub" / "nested.jpg").write_bytes(b"not an image")
    (root / "outside.jpg").write_bytes(b"not an image")
    os.symlink(root / "outside.jpg", folder / "zz-link.jpg")
    return folder


def _check_pipeline_report(report: dict[str, Any]) -> None:
    res = report["scenarios"][0]["result"]
    assert res["verdict"] == "VALID", res["reasons"]
    assert res["errors"]["count"] == 0 and res["completed"] == res["issued"] > 0
    breakdown = report["steps"]
    assert breakdown["pipeline"] == PIPELINE
    assert [s["model"] for s in breakdown["steps"]] == STEPS
    for step in breakdown["steps"]:
        # Every pipeline request went through every step once (the warm-up came before).
        assert step["requests"] == breakdown["requests"] > 0
        assert step["queue_ms"] >= 0 and step["compute_ms"] > 0 and step["mean_batch"] >= 1
        assert 0 < step["busy_share"] <= 1
    in_steps = sum(s["queue_ms"] + s["compute_ms"] for s in breakdown["steps"])
    assert breakdown["server_ms"] >= in_steps * 0.99
    busiest = max(breakdown["steps"], key=lambda s: s["busy_share"])
    assert breakdown["limiting_step"]["model"] == busiest["model"]
    # The report says it too, in words and in its Markdown.
    markdown = Path(report["files"]["markdown"]).read_text()
    assert f"## Per step of {PIPELINE}" in markdown and "limiting step:" in markdown


def test_http_singlestream_on_the_zoo_jpegs_breaks_time_down_per_step(
    server: LocalServer, tmp_path: Path
) -> None:
    options = BenchOptions(PIPELINE, [Scenario.SINGLESTREAM], sample_count=16, **SHORT)
    report = bench(f"http://{server.http_url}", options, tmp_path)
    assert report["data"]["source"].startswith("zoo:synthetic-jpegs")
    _check_pipeline_report(report)


def test_grpc_offline_from_a_folder_of_files(
    server: LocalServer, jpeg_folder: Path, tmp_path: Path
) -> None:
    options = BenchOptions(PIPELINE, [Scenario.OFFLINE], data=jpeg_folder, **SHORT)
    report = bench(f"grpc://{server.grpc_url}", options, tmp_path)
    # The 8 regular files only: no hidden file, no subfolder, no link followed out.
    assert report["data"]["samples"] == 8 and "(8 files" in report["data"]["source"]
    _check_pipeline_report(report)


def test_in_process_pipeline_and_a_plain_model_has_no_breakdown(repo: Path, tmp_path: Path) -> None:
    options = BenchOptions(PIPELINE, [Scenario.SINGLESTREAM], repo=repo, sample_count=8, **SHORT)
    _check_pipeline_report(bench(None, options, tmp_path / "pipeline"))
    plain = BenchOptions("smallcnn", [Scenario.SINGLESTREAM], repo=repo, sample_count=8, **SHORT)
    assert bench(None, plain, tmp_path / "plain")["steps"] is None


def test_a_folder_for_a_model_without_a_bytes_input_is_refused(
    server: LocalServer, jpeg_folder: Path, tmp_path: Path
) -> None:
    options = BenchOptions("smallcnn", [Scenario.SINGLESTREAM], data=jpeg_folder, **SHORT)
    with pytest.raises(BenchError, match="one BYTES input"):
        bench(f"http://{server.http_url}", options, tmp_path)
