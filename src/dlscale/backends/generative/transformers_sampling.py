"""Per-request sampling inside transformers' continuous batching: greedy or seeded draws.

The continuous-batching manager takes one `GenerationConfig` for all its requests: greedy or
sampled for every sequence, and one random generator shared by the whole batch, so that a
request's draws would depend on which others share its steps. dlscale runs the engine greedy
(arg-max) and hands it these logits processors, which read each request's own settings
(`add_request(..., temperature=, top_p=, generator=)`) one row at a time: temperature and
top-p scale and cut the row, and a draw from the request's own seeded `torch.Generator`
leaves only the drawn token in it, which the arg-max then picks. A greedy request passes
through untouched. So greedy equals `generate`'s greedy, and a seeded request draws the same
tokens whatever else is batched with it (docs/generative.md). Top-k cuts a row as top-p does.
Settings that need each request's history (penalties, min_tokens, grammars, logprobs) are
in transformers_rows.py; this chain runs them first and last.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingLogitsProcessorList,
)
from transformers.generation.logits_process import LogitsProcessorList

from dlscale.backends.generative.transformers_rows import ROWS, After, Before, RowState
from dlscale.sampling import Sampling

#: The per-request keyword arguments these processors read (`add_request`'s extras).
TEMPERATURE, TOP_P, TOP_K, GENERATOR = "temperature", "top_p", "top_k", "generator"


def request_settings(sampling: Sampling, rows: RowState) -> dict[str, Any]:
    """The `add_request` extras for one request; greedy when its temperature is 0."""
    settings: dict[str, Any] = {ROWS: rows} if rows.needed else {}
    if sampling.greedy:
        return {**settings, TEMPERATURE: 0.0, TOP_P: 1.0}
    generator = torch.Generator()
    if sampling.seed is None:
        generator.seed()  # a fresh seed from the OS: unseeded requests differ
    else:
        generator.manual_seed(sampling.seed)
    return {
        **settings,
        TEMPERATURE: sampling.temperature,
        TOP_P: sampling.top_p,
        TOP_K: sampling.top_k,
        GENERATOR: generator,
    }


class _FloatSetting(ContinuousBatchingLogitsProcessor):
    """A processor whose argument is one float per row, read from each request's settings."""

    ignored_kwargs: tuple[str, ...] = ()
    #: The value of a row no request fills.
    default = 1.0

    def value(self, settings: dict[str, Any]) -> float:
        """The row's value for a request's `add_request` extras."""
        raise NotImplementedError

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        defaults = torch.full_like(int32_tensor, self.default, dtype=torch.float32)
        int32_tensor.copy_(defaults.view(torch.int32))

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        values = [self.value(r.state.logit_processor_kwargs) for r in requests_with_new_token]
        # The engine stores every argument as int32; floats travel bit-cast (as its own
        # warpers do).
        return torch.tensor(values, dtype=torch.float32).view(dtype=torch.int32)


class _Temperature(_FloatSetting):
    supported_kwargs: dict[str, type] = {TEMPERATURE: float}  # noqa: RUF012  (the base's shape)

    def value(self, settings: dict[str, Any]) -> float:
        # A greedy row (0) is left as it is: dividing by 1 keeps its arg-max.
        return float(settings.get(TEMPERATURE, 0.0) or 1.0)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        temperatures = tensor_arg[: scores.size(0)].view(dtype=torch.float32)
        return scores / temperatures.unsqueeze(-1)


class _TopP(_FloatSetting):
    supported_kwargs: dict[str, type] = {TOP_P: float}  # noqa: RUF012

    def value(self, settings: dict[str, Any]) -> float:
        return float(settings.get(TOP_P, 1.0))

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        top_p = tensor_arg[: scores.size(0)].view(dtype=torch.float32).unsqueeze(-1)
        if not bool((top_p < 1.0).any()):  # no row cuts: spare the sort over the vocabulary
            return scores
        ordered, order = torch.sort(scores, descending=True, dim=-1)
        probabilities = ordered.softmax(dim=-1)
        before = probabilities.cumsum(dim=-1) - probabilities
        # Keep the smallest set whose mass reaches top_p: a token goes when the mass before it
        # already does; the most likely token always stays. top_p = 1 keeps every token.
        drop = (before >= top_p) & (top_p < 1.0)
        drop[..., 0] = False
        return scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


class _TopK(ContinuousBatchingLogitsProcessor):
    supported_kwargs: dict[str, type] = {TOP_K: int}  # noqa: RUF012
    ignored_kwargs: tuple[str, ...] = ()

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(0)

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        return torch.tensor(
            [r.state.logit_processor_kwargs.get(TOP_K, 0) for r in requests_with_new_token],
            dtype=torch.int32,
        )

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        top_k = tensor_arg[: scores.size(0)].unsqueeze(-1)
        if not bool((top_k > 0).any()):  # no row cuts (0 keeps every token)
            return scores
        ordered = torch.sort(scores, descending=True, dim=-1)[0]
        kth = ordered.gather(-1, (top_k.clamp(1, scores.size(-1)) - 1).long())
        # Ties with the k-th score stay, as in transformers' own top-k.
        return scores.masked_fill((top_k > 0) & (scores < kth), float("-inf"))


class _Draw(_FloatSetting):
    supported_kwargs: dict[str, type] = {GENERATOR: torch.Generator}  # noqa: RUF012
    #: -1 marks a greedy row.
    default = -1.0

    def value(self, settings: dict[str, Any]) -> float:
        # One uniform draw per row from the request's own generator.
        generator = settings.get(GENERATOR)
        return -1.0 if generator is None else float(torch.rand(1, generator=generator))

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        draws = tensor_arg[: scores.size(0)].view(dtype=torch.float32).unsqueeze(-1)
        cumulative = scores.softmax(dim=-1).cumsum(dim=-1)
        # Inverse of the cumulative distribution at the draw: the sampled token.
        chosen = torch.searchsorted(cumulative, draws * cumulative[:, -1:]).clamp(
            max=scores.size(-1) - 1
        )
        only_chosen = torch.full_like(scores, float("-inf")).scatter(-1, chosen, 0.0)
        return torch.where(draws >= 0.0, only_chosen, scores)


class RequestSampling(ContinuousBatchingLogitsProcessorList):
    """The engine's logits processing: each request's penalties, masks and logprobs (on the raw
    scores), temperature, top-k, top-p and seeded draw, then the chosen token's logprob."""

    def __init__(self) -> None:
        super().__init__(LogitsProcessorList(), per_request_processors=False)
        self.logits_processor = LogitsProcessorList(
            [Before(), _Temperature(), _TopK(), _TopP(), _Draw(), After()]
        )
        # One int32 argument row per processor, filled per step by prepare_tensor_args.
        self.tensors_required = len(self.logits_processor)
        self._retrieve_processors_kwargs()
        self.do_processing = True
