"""Per-request settings that need each row's own history: penalties, min_tokens, grammars, logprobs.

transformers' continuous batching hands a logits processor one int32 argument per row. The
settings below depend on what the request has generated so far (its tokens, a grammar's
state), which no int32 holds: each request's `RowState` gets a slot number, the row's
argument carries it, and the processor finds the state by it. The slot travels with the
batch, so a row is never matched to another request's state. A row with no such setting
costs a comparison. `Before` runs on the model's raw scores (vLLM's order: logprobs are the
raw model's, penalties and masks come before temperature); `After` runs last and reads the
token the engine's arg-max will pick, to record its log-probability.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
)

if TYPE_CHECKING:  # xgrammar is optional: the engine serves without structured output
    from dlscale.backends.generative.transformers_grammar import Matcher

#: The `add_request` extra that carries a request's RowState.
ROWS = "rows"
_slots = itertools.count()
#: The live states by slot; a state goes when its request is dropped by the engine and us.
_LIVE: weakref.WeakValueDictionary[int, RowState] = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class Logprob:
    """One generated token's log-probability and its most likely alternatives (raw scores)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class RowState:
    """What one request's row needs at each step, and the log-probabilities recorded."""

    def __init__(
        self,
        prompt: Sequence[int],
        eos: Sequence[int],
        *,
        min_tokens: int = 0,
        repetition_penalty: float = 1.0,
        logprobs: int | None = None,
        matcher: Matcher | None = None,
    ) -> None:
        self.slot = next(_slots) % 2**31
        self._seen = set(prompt)
        self._counted = 0  # generated tokens already in _seen
        self._eos = list(eos)
        self._min_tokens = min_tokens
        self._penalty = repetition_penalty
        self._logprobs = logprobs
        self._matcher = matcher
        self._raw: torch.Tensor | None = None
        #: The engine's state of the request (its generated tokens), seen at its first step.
        self.state: Any = None
        #: Appended by the engine's thread, one per generated token, before the token is out.
        self.records: list[Logprob] = []
        _LIVE[self.slot] = self

    @property
    def needed(self) -> bool:
        """Whether any setting needs the row processors (else the request goes without)."""
        return bool(
            self._min_tokens
            or self._penalty != 1.0
            or self._logprobs is not None
            or self._matcher is not None
        )

    def before(self, row: torch.Tensor) -> None:
        """Record the raw log-probabilities, then penalise and mask `row` in place."""
        generated: list[int] = list(self.state.generated_tokens) if self.state is not None else []
        if self._logprobs is not None:
            self._raw = torch.log_softmax(row, dim=-1)
        if self._penalty != 1.0:
            self._penalise(row, generated)
        if len(generated) < self._min_tokens and self._eos:
            row[self._eos] = float("-inf")
        if self._matcher is not None:
            self._matcher.mask(row, generated)

    def after(self, row: torch.Tensor) -> None:
        """Record the chosen token's raw log-probability (the engine picks the arg-max)."""
        raw, self._raw = self._raw, None
        if raw is None or self._logprobs is None:
            return
        chosen = int(row.argmax())
        top: tuple[tuple[int, float], ...] = ()
        if self._logprobs > 0:
            values, ids = raw.topk(self._logprobs)
            top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
        self.records.append(Logprob(chosen, float(raw[chosen]), top))

    def _penalise(self, row: torch.Tensor, generated: list[int]) -> None:
        # vLLM's (and CTRL's) rule: over the prompt's and the answer's tokens, a positive
        # score is divided by the penalty and a negative one multiplied by it.
        self._seen.update(generated[self._counted :])
        self._counted = len(generated)
        seen = torch.tensor(sorted(self._seen), dtype=torch.long, device=row.device)
        scores = row[seen]
        row[seen] = torch.where(scores > 0, scores / self._penalty, scores * self._penalty)


class _Rows(ContinuousBatchingLogitsProcessor):
    supported_kwargs: dict[str, type] = {ROWS: RowState}  # noqa: RUF012  (the base's shape)
    ignored_kwargs: tuple[str, ...] = ()

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(-1)

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        slots = []
        for request in requests_with_new_token:
            rows = request.state.logit_processor_kwargs.get(ROWS)
            if rows is not None:
                rows.state = request.state
            slots.append(-1 if rows is None else rows.slot)
        return torch.tensor(slots, dtype=torch.int32)

    def _states(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> list[tuple[int, RowState]]:
        slots = tensor_arg[: scores.size(0)]
        if not bool((slots >= 0).any()):
            return []
        found = ((i, _LIVE.get(slot)) for i, slot in enumerate(slots.tolist()) if slot >= 0)
        return [(i, rows) for i, rows in found if rows is not None]


class Before(_Rows):
    """Each row's raw log-probabilities recorded, then its penalty, min_tokens and grammar."""

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        for i, rows in self._states(scores, tensor_arg):
            rows.before(scores[i])
        return scores


class After(_Rows):
    """Each row's chosen token and its log-probability recorded (scores unchanged)."""

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        for i, rows in self._states(scores, tensor_arg):
            rows.after(scores[i])
        return scores
