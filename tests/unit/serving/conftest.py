"""A repository of small real ONNX models for the serving tests (tests/toolkit)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.toolkit.repositories import serving_repository


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """identity, plus (versions 1 and 2) and a broken config."""
    return serving_repository(tmp_path)
