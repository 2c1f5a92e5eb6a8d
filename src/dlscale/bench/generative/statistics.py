"""A run's token metrics over its requests: percentiles, throughput and goodput under an SLO.

Percentiles interpolate linearly between the two nearest values (numpy's default, as aiperf
computes them), so that the two benches agree on the same timings. Throughput spans the run:
from the first request sent to the last stream's end (aiperf's benchmark duration).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dlscale.bench.generative.records import StreamRecord
from dlscale.bench.latency import summarize

#: The percentiles every generative report gives.
PERCENTILES = (50.0, 90.0, 99.0)


def distribution(values_ns: Sequence[float]) -> dict[str, float | None]:
    """p50, p90, p99, mean, min and max in seconds (None for no values)."""
    return summarize(values_ns, PERCENTILES, method="linear")


@dataclass(frozen=True)
class Slo:
    """Per-request bounds for goodput: TTFT and TPOT (either may be absent)."""

    ttft_s: float | None = None
    tpot_s: float | None = None


@dataclass(frozen=True)
class RunStats:
    """The figures of one run (one concurrency, one rate, one trace replay)."""

    requests: int
    succeeded: int
    failed: int
    duration_s: float
    output_tokens: int
    input_tokens: int
    ttft: dict[str, float | None]
    tpot: dict[str, float | None]
    itl: dict[str, float | None]
    latency: dict[str, float | None]
    output_tokens_per_s: float | None
    requests_per_s: float | None
    #: Requests that met the SLO, per second of the run (None without an SLO).
    goodput_per_s: float | None
    slo_met: int | None
    token_sources: dict[str, int]
    first_errors: list[str]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def summarize_run(records: Sequence[StreamRecord], slo: Slo | None = None) -> RunStats:
    """The run's figures from its requests; failed requests count only as failures."""
    ok = [r for r in records if r.ok]
    span = _span_s(records)
    tokens = sum(r.tokens for r in ok)
    met = sum(r.meets(slo.ttft_s, slo.tpot_s) for r in ok) if slo else None
    return RunStats(
        requests=len(records),
        succeeded=len(ok),
        failed=len(records) - len(ok),
        duration_s=span,
        output_tokens=tokens,
        input_tokens=sum(r.server_prompt_tokens or r.input_tokens for r in ok),
        ttft=distribution([t for r in ok if (t := r.ttft_ns) is not None]),
        tpot=distribution([p for r in ok if (p := r.tpot_ns) is not None]),
        itl=distribution([gap for r in ok for gap in r.itl_ns]),
        latency=distribution([t for r in ok if (t := r.latency_ns) is not None]),
        output_tokens_per_s=tokens / span if span > 0 and ok else None,
        requests_per_s=len(ok) / span if span > 0 and ok else None,
        goodput_per_s=(met / span if span > 0 else None) if met is not None else None,
        slo_met=met,
        token_sources=dict(Counter(r.token_source or "chunks" for r in ok)),
        first_errors=[r.error for r in records if r.error][:5],
    )


def _span_s(records: Sequence[StreamRecord]) -> float:
    """From the first request sent to the last stream's end."""
    sent = [r.sent_ns for r in records]
    done = [r.done_ns for r in records if r.done_ns]
    if not sent or not done:
        return 0.0
    return max(0, max(done) - min(sent)) / 1e9
