"""Shared fixtures: model repositories built from the zoo once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

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
