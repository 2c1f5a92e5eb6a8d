"""The OpenAI tests' shared engine: one llama-tiny server (transformers backend) for the folder."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.toolkit.server import LocalServer, serving

#: The engine's model name on the shared server.
LLAMA = "llama-tiny"


@pytest.fixture(scope="package")
def llama_server(
    llama_tiny: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalServer]:
    """The zoo's llama-tiny served on the transformers engine, shared by the folder's modules
    (it loads in seconds, but each server is one more on a busy machine)."""
    root = tmp_path_factory.mktemp("llama-repo")
    shutil.copytree(llama_tiny, root / LLAMA)
    with serving(root, grpc_port=None) as running:
        yield running
