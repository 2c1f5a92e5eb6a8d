"""Sizes and durations as users type them."""

from __future__ import annotations

import pytest

from dlscale.errors import PlanError
from dlscale.plan.units import (
    human_bytes,
    human_seconds,
    parse_duration,
    parse_size,
    parse_size_range,
)


def test_sizes() -> None:
    assert parse_size("64") == 64
    assert parse_size("1K") == 1024
    assert parse_size("256M") == 256 << 20
    assert parse_size("1.5G") == 3 << 29
    assert parse_size("2GiB") == 2 << 30
    assert parse_size("1e9") == 10**9
    assert parse_size_range("1K:8K") == [1024, 2048, 4096, 8192]
    assert parse_size_range("4K") == [4096]
    for bad in ("", "K", "1X", "1K:512"):
        with pytest.raises(PlanError):
            parse_size_range(bad)


def test_durations() -> None:
    assert parse_duration("15ms") == pytest.approx(0.015)
    assert parse_duration("250us") == pytest.approx(250e-6)
    assert parse_duration("8h") == 8 * 3600
    assert parse_duration("2") == 2.0
    with pytest.raises(PlanError):
        parse_duration("15 parsecs")


def test_printing() -> None:
    assert human_bytes(1 << 30) == "1 GiB"
    assert human_bytes(100) == "100 B"
    assert human_seconds(0.015) == "15 ms"
    assert human_seconds(8 * 3600) == "8 h"
    assert human_seconds(2e-6) == "2 us"
