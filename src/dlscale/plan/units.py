"""Parsing and printing of sizes, durations and rates as users type and read them."""

from __future__ import annotations

import re

from dlscale.errors import PlanError
from dlscale.hardware.catalog import load_catalog

# Binary multiples, as nccl-tests reads -b/-e (1K = 1024 bytes).
_SIZE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_DURATION = {"": 1.0, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_size(text: str) -> int:
    """Bytes in '64', '1K', '256M', '1G', '1.5G' or '1e9' (K, M, G, T are powers of 1024)."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]?)i?B?\s*", text, flags=re.IGNORECASE)
    try:
        assert m is not None
        return int(float(m.group(1)) * _SIZE[m.group(2).upper()])
    except (AssertionError, ValueError):
        raise PlanError(f"not a size: {text!r} (e.g. 64, 1K, 256M, 1G)") from None


def parse_size_range(text: str) -> list[int]:
    """Powers of two from 'LO:HI' (e.g. '1K:1G'), both ends included."""
    lo_text, sep, hi_text = text.partition(":")
    lo, hi = parse_size(lo_text), parse_size(hi_text) if sep else parse_size(lo_text)
    if lo < 1 or hi < lo:
        raise PlanError(f"size range {text!r} must be LO:HI with 1 <= LO <= HI")
    return [lo << k for k in range((hi // lo).bit_length())]  # LO x 2^k <= HI


def parse_duration(text: str) -> float:
    """Seconds in '15ms', '250us', '2s', '8h', '30min'; a bare number is seconds."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-z]*)\s*", text)
    if m is None or m.group(2) not in _DURATION:
        raise PlanError(f"not a duration: {text!r} (e.g. 15ms, 2s, 8h)")
    return float(m.group(1)) * _DURATION[m.group(2)]


def human_bytes(n: float) -> str:
    """'1.0 GiB', '256 KiB', '64 B'."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def human_seconds(s: float) -> str:
    """'3.2 us', '15 ms', '2.5 s', '8.0 h', '3.1 d'."""
    if s == float("inf"):
        return "inf"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0), ("ms", 1e-3)):
        if s >= size:
            return f"{s / size:.3g} {unit}"
    return f"{s * 1e6:.3g} us"


def parse_prices(text: str | None) -> dict[str, float]:
    """--price DEVICE=DOLLARS_PER_HOUR,... keyed by the catalog's names."""
    prices: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item:
            continue
        name, sep, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            sep = ""
        if not sep or price < 0:
            raise PlanError(f"--price wants DEVICE=DOLLARS_PER_HOUR,..., got {item!r}")
        prices[load_catalog().get(name.strip()).name] = price  # aliases to the catalog's name
    return prices
