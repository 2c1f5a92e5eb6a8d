"""Fixtures for the hardware tests: the NVML stand-in of fake_nvml.py."""

from __future__ import annotations

import pytest
from fake_nvml import FakeNvml, three_gpus


@pytest.fixture
def fake_nvml() -> FakeNvml:
    """An H100 with MIG on (two instances, one empty slot between), an A100 with MIG off, a T4."""
    return three_gpus()
