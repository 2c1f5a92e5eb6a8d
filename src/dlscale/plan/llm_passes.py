"""An engine's forward passes: what one pass holds, and how an engine schedules a burst of
requests into passes (docs/plan.md, "Generative models": passes, token budget, attention).

A pass carries new tokens of some sequences (prompt chunks, or one token per decoding
sequence) that attend to what those sequences already hold in the KV cache. Engines that run
iteration-level batching (vLLM, transformers' continuous batching) fill a pass decoding
sequences first, then prompt tokens up to a token budget, splitting a prompt that does not fit
(chunked prefill); each pass pays its per-pass costs again (the weights' reads, the host's
dispatch of every layer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlscale.errors import PlanError


@dataclass(frozen=True)
class Pass:
    """One forward pass: `tokens` new tokens of `sequences` sequences, which hold `cached` KV
    tokens before it, and whose new tokens attend to `attended` tokens in all (causal, each to
    its own sequence's)."""

    tokens: int
    sequences: int
    cached: float = 0.0
    attended: float = 0.0

    @classmethod
    def decode(cls, batch: int, context: float) -> Pass:
        """A decode step: one new token per sequence, each attending to `context` cached
        tokens (its own key, one more, is left out as the planner always has)."""
        return cls(batch, batch, batch * context, batch * context)

    @classmethod
    def prompt(cls, tokens: int, before: int = 0) -> Pass:
        """`tokens` of one prompt after `before` tokens already prefilled; its i-th new token
        attends to the `before` and to i new ones (causal: n(n+1)/2 of those for n tokens)."""
        return cls(tokens, 1, before, tokens * before + tokens * (tokens + 1) / 2)

    @classmethod
    def prompts(cls, tokens: int, count: int) -> Pass:
        """`count` whole prompts of `tokens` tokens in one pass."""
        one = cls.prompt(tokens)
        return cls(one.tokens * count, count, 0.0, one.attended * count)

    def __add__(self, other: Pass) -> Pass:
        """The two passes' sequences run in one pass."""
        return Pass(
            self.tokens + other.tokens,
            self.sequences + other.sequences,
            self.cached + other.cached,
            self.attended + other.attended,
        )


@dataclass(frozen=True)
class Scheduling:
    """How an engine forms its passes: the tokens one pass takes at most (None: no limit, a
    prompt is prefilled in one pass), and whether attention runs over every key the pass reads
    (transformers' SDPA/eager paged path: one masked attention over the whole batch) rather
    than over each sequence's own (paged or varlen kernels: vLLM, FlashAttention), and how
    many of a burst's requests an idle engine's first pass holds."""

    step_tokens: int | None = None
    dense_attention: bool = False
    #: The requests of a burst an idle engine's first pass holds (None: all of them). vLLM's
    #: engine core steps as soon as one request is in, while its client sends the others one
    #: by one: its first pass held the first prompt alone in 9 of 12 bursts (twice), the rest
    #: joining the second (BENCHMARKS.md, "Generative plan: measured kernels and the burst's
    #: wake-up").
    first_pass_requests: int | None = None

    def __post_init__(self) -> None:
        if self.step_tokens is not None and self.step_tokens < 1:
            raise PlanError(f"tokens per pass must be at least 1, got {self.step_tokens}")
        if self.first_pass_requests is not None and self.first_pass_requests < 1:
            raise PlanError(
                f"a first pass holds a request at least, got {self.first_pass_requests}"
            )


@dataclass
class _Sequence:
    prefilled: int = 0
    generated: int = 0
    first: int = -1
    last: int = -1


@dataclass(frozen=True)
class Burst:
    """The passes of a burst of requests and, per request, the passes of its first and last
    token (indexes into `passes`)."""

    passes: list[Pass]
    first: list[int] = field(default_factory=list)
    last: list[int] = field(default_factory=list)


def burst(scheduling: Scheduling, batch: int, prompt: int, output: int) -> Burst:
    """`batch` requests of `prompt` tokens, `output` generated each, arriving at once.

    Each pass takes one token of every decoding sequence first, then prompt tokens in arrival
    order up to the budget (a prompt that does not fit is split); a sequence's first token
    comes from the pass that ends its prompt, each later one from a decode step. The first
    pass holds only the requests in by then (`first_pass_requests`), the later ones all.
    """
    if batch < 1 or prompt < 1 or output < 1:
        raise PlanError(f"a burst needs batch, prompt and output >= 1, got {batch, prompt, output}")
    budget_per_pass = scheduling.step_tokens or batch * prompt + batch
    states = [_Sequence() for _ in range(batch)]
    passes: list[Pass] = []
    while any(s.generated < output for s in states):
        budget, work = budget_per_pass, Pass(0, 0)
        arrived = states if passes else states[: scheduling.first_pass_requests or batch]
        decoding = [s for s in states if s.prefilled == prompt and 0 < s.generated < output]
        for s in decoding[:budget]:
            work += Pass.decode(1, prompt + s.generated - 1)
            s.generated += 1
            s.last = len(passes)
        budget -= min(len(decoding), budget)
        for s in arrived:
            if budget == 0:
                break
            if s.prefilled == prompt:
                continue
            take = min(prompt - s.prefilled, budget)
            work += Pass.prompt(take, s.prefilled)
            s.prefilled += take
            budget -= take
            if s.prefilled == prompt:
                s.generated, s.first = 1, len(passes)
                s.last = len(passes)
        passes.append(work)
    return Burst(passes, [s.first for s in states], [s.last for s in states])


def ttft_weights(done: Burst) -> list[float]:
    """Each pass's count in the burst's TTFT: the last request's first token, every pass up to
    it once (the time to it is the sum of their seconds)."""
    last = max(done.first)
    return [1.0 if k <= last else 0.0 for k in range(len(done.passes))]


def tpot_weights(done: Burst, output: int) -> list[float]:
    """Each pass's count in the burst's TPOT: the mean over requests of (last token's time -
    first token's) / (output - 1), MLPerf's definition, as a weighted sum of the passes."""
    weights = [0.0] * len(done.passes)
    if output < 2:
        return weights
    share = 1.0 / (len(done.first) * (output - 1))
    for first, last in zip(done.first, done.last, strict=True):
        for k in range(first + 1, last + 1):
            weights[k] += share
    return weights
