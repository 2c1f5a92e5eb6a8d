"""Token-level measures of a generative model: TTFT, TPOT and the gap between tokens, the
phases of a request (queue, prefill, decode, end to end), prompt and generated tokens, and how
requests finished (the measures vLLM's metrics name, docs/observability.md).

Measured in the serving core (serving/streams.py), where every frontend's requests pass (OIP
generate and ModelStreamInfer, the OpenAI API, a plain infer joined from its stream), and read by
the Prometheus collector (serving/metrics/collectors.py) at scrape time.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from dlscale.serving.observe.stats import Histogram

#: Time to first token, seconds: from a request's arrival (its wait for a seat included) to
#: its first generated token. MLPerf's bounds run from 0.45 s to 6 s (shared/reference/mlperf.md).
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0,
)  # fmt: skip
#: Time per output token after the first, seconds (MLPerf's TPOT bounds: 30 to 200 ms).
TPOT_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip


#: Seconds of a whole request or one of its phases (queue, prefill, decode).
PHASE_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0,
    640.0,
)  # fmt: skip


def _phase() -> Histogram:
    return Histogram(PHASE_BUCKETS_S)


@dataclass
class TokenStats:
    """What one generative model version generated, and how fast."""

    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS_S))
    #: The gap before each token after the first, one observation per token.
    inter_token: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS_S))
    queue: Histogram = field(default_factory=_phase)
    prefill: Histogram = field(default_factory=_phase)
    decode: Histogram = field(default_factory=_phase)
    end_to_end: Histogram = field(default_factory=_phase)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    #: Requests that ran to their end, by why they ended (stop, length, abort).
    finished_by: Counter[str] = field(default_factory=Counter)
