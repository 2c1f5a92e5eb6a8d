"""Synthetic prompts of set input and output lengths, in the model's tokens, from a seed.

Lengths are drawn from normal distributions (mean and standard deviation in tokens, rounded,
at least 1), as aiperf's `--isl/--osl` and their `-stddev` do. A prompt of N tokens is built
from tokens that decode to text and encode back to themselves alone, then checked by encoding
the whole text (a tokenizer may merge neighbours) and trimmed or topped up until it holds N.
Without a tokenizer, prompts are words of random letters, about one token each, and the
server's own prompt count (usage, num_input_tokens) is the one reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlscale.bench.generative.endpoints import Ask
from dlscale.bench.generative.tokens import TokenCounter
from dlscale.errors import BenchError

#: Bounds on what a run may ask for, checked before anything is built.
MAX_TOKENS_PER_PROMPT = 131_072
MAX_OUTPUT_TOKENS = 65_536
MAX_REQUESTS = 1_000_000
#: Candidate tokens tried when building the pool of clean ones.
POOL_CANDIDATES = 4096
#: Rounds of trimming or topping up a prompt before its length is taken as it is.
FIT_ROUNDS = 8


@dataclass(frozen=True)
class Lengths:
    """A length distribution in tokens: mean and standard deviation."""

    mean: int
    stddev: float = 0.0

    def check(self, name: str, most: int) -> None:
        if not 1 <= self.mean <= most or self.stddev < 0 or self.stddev > most:
            raise BenchError(
                f"{name}: the mean must be 1 to {most} tokens and the stddev 0 or more, "
                f"not {self.mean} and {self.stddev}"
            )

    def draw(self, rng: np.random.Generator, count: int, most: int) -> list[int]:
        if self.stddev == 0:
            return [self.mean] * count
        values = np.rint(rng.normal(self.mean, self.stddev, count))
        return [int(v) for v in np.clip(values, 1, most)]


class PromptMaker:
    """Builds prompts of an exact token length from the model's tokenizer (or words without)."""

    def __init__(self, counter: TokenCounter | None, seed: int) -> None:
        self.counter = counter
        self.rng = np.random.default_rng(seed)
        self.pool = self._clean_tokens() if counter is not None else []

    def _clean_tokens(self) -> list[int]:
        assert self.counter is not None
        special = self.counter.special_ids()
        size = self.counter.vocab_size
        picks = self.rng.choice(size, min(size, POOL_CANDIDATES), replace=False)
        pool = []
        for token in (int(t) for t in picks):
            if token in special:
                continue
            text = self.counter.decode([token])
            # A pool token is printable text that encodes back to one token on its own.
            if text.strip() and text.isprintable() and len(self.counter.encode(text)) == 1:
                pool.append(token)
        if len(pool) < 16:
            raise BenchError(f"the tokenizer in {self.counter.folder} has too few plain tokens")
        return pool

    def prompt(self, tokens: int) -> tuple[str, int]:
        """A prompt of `tokens` tokens (by the tokenizer) and the count it really has."""
        if self.counter is None:
            letters = self.rng.integers(0, 26, size=(tokens, 4))
            words = ["".join(chr(97 + int(c)) for c in row) for row in letters]
            return " ".join(words), tokens
        ids = [int(i) for i in self.rng.choice(self.pool, tokens)]
        text = self.counter.decode(ids)
        for _ in range(FIT_ROUNDS):
            have = self.counter.encode(text)
            if len(have) == tokens:
                break
            if len(have) > tokens:
                have = have[:tokens]
            else:
                have += [int(i) for i in self.rng.choice(self.pool, tokens - len(have))]
            text = self.counter.decode(have)
        return text, self.counter.count(text)


def synthetic_asks(
    maker: PromptMaker, count: int, isl: Lengths, osl: Lengths
) -> list[tuple[Ask, int]]:
    """`count` requests with drawn lengths: each Ask and its prompt's token count."""
    if not 1 <= count <= MAX_REQUESTS:
        raise BenchError(f"--requests must be 1 to {MAX_REQUESTS}, not {count}")
    isl.check("--isl", MAX_TOKENS_PER_PROMPT)
    osl.check("--osl", MAX_OUTPUT_TOKENS)
    inputs = isl.draw(maker.rng, count, MAX_TOKENS_PER_PROMPT)
    outputs = osl.draw(maker.rng, count, MAX_OUTPUT_TOKENS)
    prompts = [maker.prompt(n) for n in inputs]
    return [(Ask(text, n_out), real) for (text, real), n_out in zip(prompts, outputs, strict=True)]
