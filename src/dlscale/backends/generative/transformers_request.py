"""One request to the transformers engine: checked and tokenized, then its outputs as parts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from transformers.generation.continuous_batching.requests import GenerationOutput, RequestStatus

from dlscale.backends.base import StreamPart
from dlscale.backends.generative.contract import (
    chat_messages,
    check_context,
    part,
    prompt_text,
    prompt_tokens,
)
from dlscale.backends.generative.transformers_rows import RowState
from dlscale.backends.generative.transformers_sampling import request_settings
from dlscale.backends.generative.transformers_text import StreamedText
from dlscale.errors import BackendError, DlscaleError, InvalidField, InvalidInput
from dlscale.sampling import Sampling

if TYPE_CHECKING:  # xgrammar is optional: the engine serves without structured output
    from dlscale.backends.generative.transformers_grammar import Grammars, Matcher


@dataclass(frozen=True)
class Job:
    """What the engine is given for one request, every bound checked."""

    prompt: list[int]
    sampling: Sampling
    #: The tokens that end the sequence; empty with ignore_eos.
    eos: list[int]
    #: The per-request settings of the engine's sampling processors.
    settings: dict[str, Any]
    #: What the row processors keep for it (its logprobs are recorded there).
    rows: RowState


class Model(Protocol):
    """What a request is prepared against (the loaded engine): its tokenizer, context
    (max_model_len), the tokens its KV cache holds, the ids it embeds, its end tokens and
    grammar compiler (None where xgrammar is not installed)."""

    tokenizer: Any
    context: int
    cache_tokens: int
    vocabulary: int
    eos_ids: tuple[int, ...]
    grammars: Grammars | None


def prepare(model: Model, inputs: Mapping[str, np.ndarray], sampling: Sampling) -> Job:
    """The request as the engine takes it; InvalidInput naming what is wrong otherwise.
    Rendering and tokenizing take time in proportion to the prompt: the caller runs this off
    the event loop, and a prompt too long in bytes for the context is refused before either."""
    text = prompt_text(inputs, model.context)
    prompt = tokens(model, text, sampling)
    if not prompt:
        raise InvalidInput("the prompt is empty")
    check_context(len(prompt), sampling.max_tokens, model.context, sampling.input_format)
    if len(prompt) + sampling.max_tokens > model.cache_tokens:
        raise InvalidInput(
            f"the prompt ({len(prompt)} tokens) and max_tokens ({sampling.max_tokens}) need "
            f"{len(prompt) + sampling.max_tokens} tokens of KV cache; this engine's cache holds "
            f"{model.cache_tokens} (kv_cache_gib): ask for fewer tokens",
            "max_tokens",
        )
    eos = [] if sampling.ignore_eos else list(model.eos_ids)
    rows = RowState(
        prompt,
        eos,
        min_tokens=sampling.min_tokens,
        repetition_penalty=sampling.repetition_penalty,
        logprobs=sampling.logprobs,
        matcher=_matcher(model, sampling),
    )
    return Job(prompt, sampling, eos, request_settings(sampling, rows), rows)


def tokens(model: Model, text: str, sampling: Sampling) -> list[int]:
    """The prompt's token ids: its text, its ids (`input_format = "tokens"`), or its chat
    messages through the chat template."""
    tokenizer = model.tokenizer
    if sampling.input_format == "tokens":
        return prompt_tokens(text, model.vocabulary)
    if sampling.input_format != "chat":
        return list(tokenizer(text).input_ids)
    messages = chat_messages(text)
    tools = json.loads(sampling.tools) if sampling.tools else None
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
    except Exception as exc:  # the model's own Jinja template refused the messages
        raise InvalidInput(f"the chat template cannot render these messages: {exc}") from None
    # The template writes the begin token itself.
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def _matcher(model: Model, sampling: Sampling) -> Matcher | None:
    if sampling.guide is None:
        return None
    if model.grammars is None:  # as vLLM answers when it has no structured-output backend
        raise InvalidField("response_format", "structured output needs xgrammar installed")
    param = "tool_choice" if sampling.tools else "response_format"
    return model.grammars.matcher(sampling.guide, param)


class Parts:
    """Turns the engine's outputs for one sequence into streamed parts (one per new token)."""

    def __init__(self, tokenizer: Any, job: Job) -> None:
        self._job = job
        self._tokenizer = tokenizer
        self._reported = 0  # tokens whose logprobs were sent
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
        return part(new, len(self._job.prompt), len(tokens), reason, self._logprobs(len(tokens)))

    def _logprobs(self, generated: int) -> str:
        """The log-probabilities of the tokens since the last part, as the contract's JSON."""
        if self._job.sampling.logprobs is None:
            return ""
        new = self._job.rows.records[self._reported : generated]
        self._reported += len(new)
        name = self._token_text
        return json.dumps(
            [[name(r.token), r.logprob, [[name(i), lp] for i, lp in r.top]] for r in new]
        )

    def _token_text(self, token: int) -> str:
        return str(self._tokenizer.decode([token]))
