"""A load that follows time: a JSONL trace of requests with tenants, or the built-in burst shape.

One JSON object per line (docs/bench.md, "Traces and bursts"): `t` (seconds from the run's
start), `model`, `tenant`, and optionally `shape` (the request's input shape) or, for generative
models, `prompt_tokens` and `output_tokens`. Every field is bounded, a bad line is refused with
its number, and the size of a load is checked before anything is read into memory or generated.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.errors import BenchError

#: Requests in one run at most (a trace's lines, or a shape's rate times its duration).
MAX_REQUESTS = 200_000
#: A trace file's size at most, checked before it is read.
MAX_TRACE_BYTES = 64 << 20
MAX_LINE_BYTES = 64 << 10
#: The latest send time, seconds (a day).
MAX_OFFSET_S = 86_400.0
#: The highest rate a shape may ask for, requests per second.
MAX_RATE = 10_000.0
MAX_NAME = 128
MAX_TENANTS = 256
MAX_MODELS = 64
#: A request's shape: dimensions, each dimension's length, and elements in all.
MAX_DIMS = 8
MAX_DIM = 1 << 20
MAX_ELEMENTS = 1 << 24
MAX_PROMPT_TOKENS = 131_072
MAX_OUTPUT_TOKENS = 65_536
_KEYS = {"t", "model", "tenant", "shape", "prompt_tokens", "output_tokens"}


@dataclass(frozen=True)
class TraceRequest:
    """One request of a load: when to send it (seconds from the start), to which model, whose."""

    offset_s: float
    model: str
    tenant: str
    #: The input tensors' shape for this request; None: one of the model's own samples.
    shape: tuple[int, ...] | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None


def json_lines(
    path: Path, max_bytes: int, max_line_bytes: int, max_lines: int
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each non-blank line of a JSONL trace as an object, with `--trace FILE:LINE` to name it in
    errors; the file's size, each line's and their count are bounded before they are read."""
    if not path.is_file():
        raise BenchError(f"--trace {path}: no such file")
    size = path.stat().st_size
    if size > max_bytes:
        raise BenchError(f"--trace {path}: {size} bytes, more than the {max_bytes} allowed")
    count = 0
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            where = f"--trace {path}:{number}"
            if len(raw) > max_line_bytes:
                raise BenchError(f"{where}: longer than {max_line_bytes} bytes")
            if not raw.strip():
                continue
            if count == max_lines:
                raise BenchError(f"--trace {path}: more than {max_lines} requests")
            count += 1
            try:
                doc = json.loads(raw)
            except ValueError as exc:
                raise BenchError(f"{where}: not JSON ({exc})") from None
            if not isinstance(doc, dict):
                raise BenchError(f"{where}: a line must be a JSON object")
            yield where, doc
    if not count:
        raise BenchError(f"--trace {path}: no requests")


def read_trace(path: Path) -> list[TraceRequest]:
    """The trace's requests in time order; BenchError names the file and line of a bad one."""
    lines = json_lines(path, MAX_TRACE_BYTES, MAX_LINE_BYTES, MAX_REQUESTS)
    out = [_line(doc, where) for where, doc in lines]
    _check_counts(out, f"--trace {path}")
    # Stable: requests of the same instant keep the file's order.
    return sorted(out, key=lambda r: r.offset_s)


def _line(doc: dict[str, Any], where: str) -> TraceRequest:
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise BenchError(f"{where}: unknown key(s) {unknown}; expected {sorted(_KEYS)}")
    t = doc.get("t")
    if not isinstance(t, int | float) or not _number(t) or not 0 <= t <= MAX_OFFSET_S:
        raise BenchError(f"{where}: t must be seconds from 0 to {MAX_OFFSET_S:g}, not {t!r}")
    return TraceRequest(
        float(t),
        _name(doc.get("model"), "model", where),
        _name(doc.get("tenant", "default"), "tenant", where),
        _shape(doc.get("shape"), where),
        _count(doc.get("prompt_tokens"), "prompt_tokens", MAX_PROMPT_TOKENS, where),
        _count(doc.get("output_tokens"), "output_tokens", MAX_OUTPUT_TOKENS, where),
    )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _name(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME or not value.isprintable():
        raise BenchError(f"{where}: {key} must be a printable string of 1 to {MAX_NAME} characters")
    return value


def _shape(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    good = isinstance(value, list) and 1 <= len(value) <= MAX_DIMS
    if not good or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise BenchError(f"{where}: shape must be a list of 1 to {MAX_DIMS} integers")
    if not all(1 <= d <= MAX_DIM for d in value) or math.prod(value) > MAX_ELEMENTS:
        raise BenchError(
            f"{where}: shape {value}: each dimension 1 to {MAX_DIM}, "
            f"{MAX_ELEMENTS} elements at most"
        )
    return tuple(value)


def _count(value: Any, key: str, most: int, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise BenchError(f"{where}: {key} must be an integer from 1 to {most}, not {value!r}")
    return value


def _check_counts(requests: list[TraceRequest], where: str) -> None:
    tenants = {r.tenant for r in requests}
    models = {r.model for r in requests}
    if len(tenants) > MAX_TENANTS:
        raise BenchError(f"{where}: {len(tenants)} tenants, more than {MAX_TENANTS}")
    if len(models) > MAX_MODELS:
        raise BenchError(f"{where}: {len(models)} models, more than {MAX_MODELS}")


@dataclass(frozen=True)
class BurstShape:
    """Baseline, a burst of `factor` times the baseline rate, then the baseline again."""

    rate: float = 10.0
    factor: float = 5.0
    before_s: float = 60.0
    burst_s: float = 60.0
    after_s: float = 120.0

    def check(self) -> None:
        """Refuse absurd rates and durations before a single arrival is drawn."""
        for name in ("rate", "factor", "before_s", "burst_s", "after_s"):
            value = getattr(self, name)
            if not _number(value) or value < 0:
                raise BenchError(f"--shape burst: {name} must be a finite number >= 0, not {value}")
        if not 0 < self.rate <= MAX_RATE or not 0 < self.rate * self.factor <= MAX_RATE:
            raise BenchError(
                f"--shape burst: rates {self.rate:g} and {self.rate * self.factor:g}/s: each "
                f"must be above 0 and at most {MAX_RATE:g}/s"
            )
        if self.duration_s <= 0 or self.duration_s > MAX_OFFSET_S:
            raise BenchError(f"--shape burst: {self.duration_s:g} s: from 0 to {MAX_OFFSET_S:g} s")
        if self.expected_requests > MAX_REQUESTS:
            raise BenchError(
                f"--shape burst: about {self.expected_requests:.0f} requests, more than "
                f"{MAX_REQUESTS}: lower the rates or the durations"
            )

    @property
    def duration_s(self) -> float:
        """The whole shape's length."""
        return self.before_s + self.burst_s + self.after_s

    @property
    def mean_rate(self) -> float:
        """Requests per second over the whole shape."""
        return self.expected_requests / self.duration_s

    @property
    def expected_requests(self) -> float:
        """Requests the shape sends, on average."""
        return self.rate * (self.before_s + self.after_s + self.factor * self.burst_s)


def burst_trace(
    shape: BurstShape, model: str, tenants: tuple[str, ...] = ("default",), seed: int = 0
) -> list[TraceRequest]:
    """The shape's requests: Poisson arrivals at each phase's rate (seeded: every run of the
    same shape sends the same schedule), tenants in turn."""
    shape.check()
    if not tenants or len(tenants) > MAX_TENANTS:
        raise BenchError(f"--tenants: 1 to {MAX_TENANTS} tenants")
    rng = random.Random(seed)
    out: list[TraceRequest] = []
    phases = (
        (0.0, shape.before_s, shape.rate),
        (shape.before_s, shape.burst_s, shape.rate * shape.factor),
        (shape.before_s + shape.burst_s, shape.after_s, shape.rate),
    )
    for start, length, rate in phases:
        t = start + rng.expovariate(rate)
        while t < start + length and len(out) < MAX_REQUESTS:
            out.append(TraceRequest(t, model, tenants[len(out) % len(tenants)]))
            t += rng.expovariate(rate)
    return out
