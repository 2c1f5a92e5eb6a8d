"""Shared fixtures: model repositories built from the zoo once per test session, and the real
tritonclient clients of a module's own `server` fixture (a module that defines `server` gets
`http` and `grpc` for it; one that defines its own `http` or `grpc` keeps those)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tests.toolkit.server import LocalServer

from dlscale.native import before_tensorflow

# Test modules that load TensorFlow at collection (TensorFlow Serving's stubs) are collected by
# every worker, before any test compiles a torch model: Triton first (dlscale/native.py).
before_tensorflow()

#: Files that share an expensive session fixture, each set run by one worker (`--dist loadfile`
#: otherwise splits them by file, and each worker made its own): the Ray cluster and fleet of
#: tests/integration/scale/conftest.py (25-40 s, and two clusters at once on 2 cores), and
#: `big_zoo` below (resnet50 and bert-base built, 20-60 s). A file left out still works: its
#: worker makes the fixture for itself.
TOGETHER = {
    "tests/integration/scale/test_ray_": "ray",
    "tests/integration/test_e2e_zoo_slow.py": "big-zoo",
    "tests/unit/backends/test_torch_backend.py": "big-zoo",
    "tests/unit/backends/test_torch_inputs.py": "big-zoo",
    "tests/unit/models/test_flops.py": "big-zoo",
    "tests/unit/models/test_zoo.py": "big-zoo",
    "tests/unit/plan/test_mlperf_ceilings.py": "big-zoo",
}


def shared_set(path: str) -> str | None:
    """The TOGETHER set a test file (its path from the repository root) belongs to, if any."""
    return next((v for k, v in TOGETHER.items() if path.startswith(k)), None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with each set of TOGETHER's files as one unit."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFixturesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = str(super()._split_scope(nodeid))
            return shared_set(scope) or scope

    return SharedFixturesTogether(config, log)


SMALL_MODELS = ("identity", "mlp", "digits")
BIG_MODELS = ("resnet50", "bert-base")


@pytest.fixture(scope="session")
def small_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with identity, mlp and digits built (a few seconds, digits is trained)."""
    pytest.importorskip("torch", reason="building the zoo needs the [torch] extra")
    pytest.importorskip("sklearn", reason="digits needs scikit-learn, in the [torch] extra")
    from dlscale.models.zoo import build_zoo

    root = tmp_path_factory.mktemp("small_repo")
    build_zoo(root, SMALL_MODELS)
    return root


@pytest.fixture(scope="session")
def big_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with resnet50 and bert-base built (about 20 s and 550 MB; ask sparingly)."""
    pytest.importorskip("torch", reason="building the zoo needs the [torch] extra")
    from dlscale.models.zoo import build_zoo

    root = tmp_path_factory.mktemp("big_zoo")
    build_zoo(root, BIG_MODELS)
    return root


@pytest.fixture(scope="session")
def llama_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zoo's llama-tiny (Hugging Face folder under a transformers-backend config), built once
    for the session; a test that changes its config copies it first."""
    pytest.importorskip("transformers", reason="llama-tiny needs the [llm] extra")
    from dlscale.models.zoo import build_zoo

    [model] = build_zoo(tmp_path_factory.mktemp("llm"), ["llama-tiny"])
    return model


@pytest.fixture
def http(server: LocalServer) -> Iterator[th.InferenceServerClient]:
    """tritonclient's REST client of the module's server (8 connections for concurrent calls)."""
    client = th.InferenceServerClient(server.http_url, concurrency=8)
    yield client
    client.close()


@pytest.fixture
def grpc(server: LocalServer) -> Iterator[tg.InferenceServerClient]:
    """tritonclient's gRPC client of the module's server."""
    client = tg.InferenceServerClient(server.grpc_url)
    yield client
    client.close()
