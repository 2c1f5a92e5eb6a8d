"""One request to the transformers engine: checked and tokenized, then its outputs as parts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from transformers.generation.continuous_batching.requests import GenerationOutput, RequestStatus

from dlscale.backends.base import StreamPart
from dlscale.backends.generative.contract import (
    Sampling,
    chat_messages,
    check_context,
    part,
    prompt_text,
    prompt_tokens,
)
from dlscale.backends.generative.transformers_sampling import request_settings
from dlscale.backends.generative.transformers_text import StreamedText
from dlscale.errors import BackendError, DlscaleError, InvalidInput
from dlscale.types import Parameter


@dataclass(frozen=True)
class Job:
    """What the engine is given for one request, every bound checked."""

    prompt: list[int]
    sampling: Sampling
    #: The tokens that end the sequence; empty with ignore_eos.
    eos: list[int]
    #: The per-request settings of the engine's sampling processors.
    settings: dict[str, Any]


@dataclass(frozen=True)
class Bounds:
    """What one sequence may hold: the context (max_model_len) and the KV cache's tokens."""

    context: int
    cache_tokens: int
    #: Token ids the model embeds (a token-id prompt's ids are below it).
    vocabulary: int


def prepare(
    tokenizer: Any,
    bounds: Bounds,
    eos_ids: tuple[int, ...],
    inputs: Mapping[str, np.ndarray],
    parameters: Mapping[str, Parameter],
) -> Job:
    """The request as the engine takes it; InvalidInput naming what is wrong otherwise.
    Rendering and tokenizing take time in proportion to the prompt: the caller runs this off
    the event loop, and a prompt too long in bytes for the context is refused before either."""
    sampling = Sampling.from_parameters(parameters)
    text = prompt_text(inputs, bounds.context)
    if sampling.input_format == "tokens":
        prompt = prompt_tokens(text, bounds.vocabulary)
    elif sampling.input_format == "chat":
        messages = chat_messages(text)
        try:
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # the model's own Jinja template refused the messages
            raise InvalidInput(f"the chat template cannot render these messages: {exc}") from None
        # The template writes the begin token itself.
        prompt = list(tokenizer(text, add_special_tokens=False).input_ids)
    else:
        prompt = list(tokenizer(text).input_ids)
    if not prompt:
        raise InvalidInput("the prompt is empty")
    check_context(len(prompt), sampling.max_tokens, bounds.context, sampling.input_format)
    if len(prompt) + sampling.max_tokens > bounds.cache_tokens:
        raise InvalidInput(
            f"the prompt ({len(prompt)} tokens) and max_tokens ({sampling.max_tokens}) need "
            f"{len(prompt) + sampling.max_tokens} tokens of KV cache; this engine's cache holds "
            f"{bounds.cache_tokens} (kv_cache_gib): ask for fewer tokens",
            "max_tokens",
        )
    return Job(
        prompt=prompt,
        sampling=sampling,
        eos=[] if sampling.ignore_eos else list(eos_ids),
        settings=request_settings(sampling.temperature, sampling.top_p, sampling.seed),
    )


class Parts:
    """Turns the engine's outputs for one sequence into streamed parts (one per new token)."""

    def __init__(self, tokenizer: Any, job: Job) -> None:
        self._job = job
        self._text = StreamedText(
            lambda tokens: tokenizer.decode(tokens, skip_special_tokens=True), job.sampling.stop
        )
        #: Whether the engine has ended the sequence (no cancel needed).
        self.engine_done = False
        self.done = False

    def next(self, output: GenerationOutput | DlscaleError) -> StreamPart:
        """The part an engine output makes; the final one has a finish reason."""
        if isinstance(output, DlscaleError):
            self.engine_done = True
            raise output
        if output.status == RequestStatus.FAILED:
            self.engine_done = True
            raise BackendError(f"the transformers engine failed the sequence: {output.error}")
        tokens = output.generated_tokens
        self.engine_done = output.is_finished()
        new = self._text.update(tokens, self.engine_done)
        reason = None
        if self._text.stopped:
            reason = "stop"
        elif self.engine_done:
            ended_by_eos = bool(tokens) and tokens[-1] in self._job.eos
            reason = "stop" if ended_by_eos else "length"
        self.done = reason is not None
        return part(new, len(self._job.prompt), len(tokens), reason)
