"""What one streamed request observed, and the per-request token metrics derived from it.

Definitions (docs/bench.md, *Generative bench*; shared/reference/generative.md): TTFT runs from
sending the request to the first chunk that carries output text; ITL is the gap between two
successive chunks that carry text; TPOT = (time of the last token - sending) - TTFT, divided by
tokens - 1 (LoadGen's and aiperf's ITL formula); end-to-end latency runs to the end of the stream.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass
class Chunk:
    """One response of a stream that carried output text."""

    at_ns: int
    text: str


@dataclass
class StreamRecord:
    """One request: when it went out, each text chunk's arrival, the end, the server's counts."""

    sent_ns: int
    #: The offset the load meant to send it at (rate and trace loads), from the run's start.
    scheduled_s: float | None = None
    chunks: list[Chunk] = field(default_factory=list)
    done_ns: int = 0
    #: Output tokens as the server counted them (usage.completion_tokens, num_output_tokens).
    server_tokens: int | None = None
    #: Prompt tokens as the server counted them (usage.prompt_tokens, num_input_tokens).
    server_prompt_tokens: int | None = None
    #: Output tokens counted here with the model's tokenizer (when the server gave no count).
    counted_tokens: int | None = None
    #: Where `tokens` came from: "server", "tokenizer" or "chunks".
    token_source: str = ""
    error: str | None = None
    finish_reason: str | None = None
    input_tokens: int = 0
    requested_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunks)

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)

    @property
    def tokens(self) -> int:
        """Output tokens: the server's count, else the tokenizer's, else one per chunk."""
        if self.server_tokens is not None:
            return self.server_tokens
        if self.counted_tokens is not None:
            return self.counted_tokens
        return len(self.chunks)

    @property
    def ttft_ns(self) -> int | None:
        return self.chunks[0].at_ns - self.sent_ns if self.chunks else None

    @property
    def latency_ns(self) -> int | None:
        """End to end: from sending to the end of the stream."""
        return self.done_ns - self.sent_ns if self.ok and self.done_ns else None

    @property
    def tpot_ns(self) -> float | None:
        """(last token - TTFT) / (tokens - 1), the first text chunk to the last over the tokens
        after the first; None for a one-token answer."""
        if not self.ok or self.tokens < 2:
            return None
        return (self.chunks[-1].at_ns - self.chunks[0].at_ns) / (self.tokens - 1)

    @property
    def itl_ns(self) -> list[int]:
        """Gaps between successive text chunks."""
        times = [c.at_ns for c in self.chunks]
        return [b - a for a, b in itertools.pairwise(times)]

    def meets(self, ttft_bound_s: float | None, tpot_bound_s: float | None) -> bool:
        """Whether this request met the SLO: it succeeded, and TTFT and TPOT within bounds."""
        if not self.ok:
            return False
        ttft = self.ttft_ns
        if ttft_bound_s is not None and (ttft is None or ttft > ttft_bound_s * 1e9):
            return False
        tpot = self.tpot_ns
        return tpot_bound_s is None or tpot is None or tpot <= tpot_bound_s * 1e9
