"""Short real LoadGen runs against a live dlscale server over HTTP and gRPC (port 0).

They run once the frontends are part of the build; until then they are skipped, by name.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bench_models import build_repo

from dlscale.bench.runner import bench, compare
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions
from dlscale.models.repository import ModelRepository
from dlscale.serving.dataplane import DataPlane
from dlscale.serving.manager import ModelManager

SHORT = {"duration_s": 0.5, "warmup_s": 0.3, "sample_count": 64}


class LiveServer:
    """A dlscale server (manager, dataplane, frontend) on an event loop of its own thread."""

    def __init__(self, repo: Path, frontend_module: str, frontend_class: str) -> None:
        module = importlib.import_module(frontend_module)
        self._cls: Any = getattr(module, frontend_class)
        self.repo = repo
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.frontend: Any = None
        self.manager: ModelManager | None = None

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    async def _start(self) -> int:
        self.manager = ModelManager(ModelRepository(self.repo))
        await self.manager.load_all()
        self.frontend = self._cls(DataPlane(self.manager), "127.0.0.1", 0)
        await self.frontend.start()
        return int(self.frontend.port)

    async def _stop(self) -> None:
        await self.frontend.stop()
        assert self.manager is not None
        await self.manager.close()

    def start(self) -> int:
        return int(self._run(self._start()))

    def stop(self) -> None:
        self._run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()


def _frontend(module: str, cls: str) -> tuple[str, str]:
    try:
        found = importlib.import_module(module)
    except ImportError:
        pytest.skip(f"{module} is not part of this build yet")
    if not hasattr(found, cls):
        pytest.skip(f"{module} has no {cls} yet")
    return module, cls


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repo(tmp_path_factory.mktemp("remote-repo"))


@pytest.fixture(scope="module")
def http_url(repo: Path) -> Iterator[str]:
    server = LiveServer(repo, *_frontend("dlscale.frontends.rest.transport", "HttpFrontend"))
    port = server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="module")
def grpc_url(repo: Path) -> Iterator[str]:
    module = "dlscale.frontends.grpc"
    server = LiveServer(repo, *_frontend(module, "GrpcFrontend"))
    port = server.start()
    yield f"grpc://127.0.0.1:{port}"
    server.stop()


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
