"""`dlscale bench --shared-memory system` against a live server: answers checked, nothing left."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.toolkit.server import LocalServer, serving

from dlscale.bench.runner import bench
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions
from dlscale.errors import BenchError
from dlscale.serving.regions.registry import RegionKind
from dlscale.serving.regions.system import SHM_DIR

SHORT = {"duration_s": 0.5, "warmup_s": 0.3, "sample_count": 64}


@pytest.fixture(scope="module")
def shm_server(repo: Path) -> Iterator[LocalServer]:
    with serving(repo, model_control="none", allow_client_shm=True) as running:
        yield running


def _ours() -> set[str]:
    return {p.name for p in SHM_DIR.iterdir() if p.name.startswith(f"dlscale-bench-{os.getpid()}-")}


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_bench_through_system_shared_memory(
    shm_server: LocalServer, repo: Path, scheme: str, tmp_path: Path
) -> None:
    url = shm_server.http_url if scheme == "http" else shm_server.grpc_url
    options = BenchOptions(
        "identity",
        [Scenario.OFFLINE],
        accuracy=True,
        reference=repo / "identity" / "1" / "model.onnx",
        shared_memory="system",
        batch_size=8,
        **SHORT,
    )
    report = bench(f"{scheme}://{url}", options, tmp_path)
    res = report["scenarios"][0]["result"]
    assert res["errors"]["count"] == 0 and res["accuracy"]["ok"] is True
    # The client's ceiling is measured through shared memory too (its null server takes regions;
    # it refused them once, and the ceiling said "not measured"). A loaded machine may make the
    # short calibration run INVALID, which the report says beside the figure it still gives.
    ceiling = report["client_ceiling"]
    assert ceiling["samples_per_s"] is not None and ceiling["samples_per_s"] > 0, ceiling
    assert "shared" not in (ceiling["error"] or "").lower(), ceiling
    # Every region was unregistered and every object unlinked at the end.
    assert shm_server.dataplane.shared_memory.status(RegionKind.SYSTEM) == []
    assert _ours() == set()


def test_a_server_that_refuses_shared_memory_is_a_clear_error(
    http_url: str, tmp_path: Path
) -> None:
    options = BenchOptions("identity", [Scenario.OFFLINE], shared_memory="system", **SHORT)
    with pytest.raises(BenchError, match="--allow-client-shm"):
        bench(http_url, options, tmp_path)
    assert _ours() == set()


def test_shared_memory_needs_a_server(repo: Path, tmp_path: Path) -> None:
    options = BenchOptions("identity", [Scenario.OFFLINE], repo=repo, shared_memory="system")
    with pytest.raises(BenchError, match="needs a server"):
        bench(None, options, tmp_path)
