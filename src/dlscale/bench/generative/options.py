"""What a generative run was asked to do (the command line's flags, typed and checked)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.bench.generative.endpoints import Endpoint
from dlscale.bench.generative.mlperf import TokenBounds
from dlscale.bench.generative.prompts import Lengths
from dlscale.bench.generative.statistics import Slo
from dlscale.bench.scenarios import Scenario
from dlscale.errors import BenchError

#: Bounds on a sweep, so that a typo cannot start a run of days.
MAX_POINTS = 64
MAX_CONCURRENCY = 4096


@dataclass(frozen=True)
class GenerativeOptions:
    """One generative bench run: the target, the prompts, the loads and the bounds."""

    url: str
    kind: Endpoint
    model: str
    isl: Lengths = field(default_factory=lambda: Lengths(128))
    osl: Lengths = field(default_factory=lambda: Lengths(128))
    tokenizer: Path | None = None
    requests: int = 64
    warmup: int = 2
    concurrency: tuple[int, ...] = ()
    rates: tuple[float, ...] = ()
    trace: Path | None = None
    trace_speedup: float = 1.0
    scenarios: tuple[Scenario, ...] = ()
    bounds: TokenBounds = field(default_factory=lambda: TokenBounds.choose(None, None, None))
    slo: Slo = field(default_factory=Slo)
    duration_s: float = 10.0
    target_qps: float | None = None
    min_queries: int | None = None
    seed: int = 0
    connections: int = 4096
    ignore_eos: bool = True
    temperature: float | None = None
    #: OpenAI's bearer key (`--api-key`, else the OPENAI_API_KEY environment variable).
    api_key: str | None = None

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise BenchError(f"a generative target is http://HOST:PORT, not {self.url!r}")
        if len(self.concurrency) + len(self.rates) > MAX_POINTS:
            raise BenchError(f"at most {MAX_POINTS} sweep points per run")
        if any(not 1 <= c <= MAX_CONCURRENCY for c in self.concurrency):
            raise BenchError(f"--concurrency: each point must be 1 to {MAX_CONCURRENCY}")
        if any(not r > 0 for r in self.rates):
            raise BenchError("--rate: each rate must be positive (requests/s)")
        if not self.trace_speedup > 0:
            raise BenchError("--trace-speedup must be positive")
        if not 0 <= self.warmup <= 1000:
            raise BenchError("--warmup-requests must be 0 to 1000")

    @property
    def loads(self) -> tuple[int, ...]:
        """The concurrency points, or one stream when nothing else was asked."""
        if self.concurrency or self.rates or self.trace or self.scenarios:
            return self.concurrency
        return (1,)

    def to_dict(self) -> dict[str, Any]:
        return dict(
            self.__dict__,
            kind=self.kind.value,
            isl=self.isl.__dict__,
            osl=self.osl.__dict__,
            tokenizer=str(self.tokenizer) if self.tokenizer else None,
            trace=str(self.trace) if self.trace else None,
            scenarios=[s.value for s in self.scenarios],
            bounds=self.bounds.__dict__,
            slo=self.slo.__dict__,
        )


def parse_list(text: str | None, kind: type[int] | type[float], flag: str) -> tuple[Any, ...]:
    """`1,4,16` (or one value); START:END[:STEP] is the classic bench's syntax (sweep.py)."""
    if not text:
        return ()
    try:
        values = tuple(kind(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise BenchError(
            f"{flag} {text!r}: expected a comma-separated list, as in 1,4,16"
        ) from None
    if len(values) > MAX_POINTS:
        raise BenchError(f"{flag}: at most {MAX_POINTS} values")
    return values
