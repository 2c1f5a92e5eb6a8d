"""OpenAI answers from dlscale's streamed responses: whole objects, stream chunks, usage.

Each streamed response of a generative model carries the new text and the token counts so far,
and the final one its finish reason (wire/generative.py); `Piece` reads that, and
the functions below write it as vLLM's OpenAI server does (shared/reference/generative.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from dlscale.errors import InvalidInput
from dlscale.frontends.rest.openai.tools import ToolUse, read_calls
from dlscale.frontends.rest.responses import event
from dlscale.types import InferenceResponse
from dlscale.wire.generative import (
    FINISH_REASON,
    LOGPROBS,
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    TEXT_OUTPUT,
)

#: The end of every stream, after its last chunk (also after an error chunk).
DONE = b"data: [DONE]\n\n"
#: What a chat answer's first delta names.
ASSISTANT = "assistant"


#: One token's log-probability as the engine sends it: `[token, logprob, [[alt, logprob]...]]`.
TokenLogprob = list[Any]


@dataclass(frozen=True)
class Piece:
    """What one streamed response says: new text, tokens so far, and why it ended (final)."""

    text: str
    input_tokens: int | None
    output_tokens: int | None
    finish_reason: str | None
    logprobs: tuple[TokenLogprob, ...] = ()

    @classmethod
    def of(cls, response: InferenceResponse) -> Piece:
        outputs = response.outputs
        if not outputs:  # a final flag alone: the stream's end, after its last text
            return cls("", None, None, None)
        if TEXT_OUTPUT not in outputs and NUM_OUTPUT_TOKENS not in outputs:
            raise InvalidInput(
                f"model {response.model_name!r} does not answer {TEXT_OUTPUT}: the OpenAI API "
                "serves generative models only"
            )
        text = _scalar(outputs.get(TEXT_OUTPUT))
        reason = _scalar(outputs.get(FINISH_REASON))
        return cls(
            text=_text(text),
            input_tokens=_count(outputs.get(NUM_INPUT_TOKENS)),
            output_tokens=_count(outputs.get(NUM_OUTPUT_TOKENS)),
            finish_reason=_text(reason) or None,
            logprobs=tuple(orjson.loads(str(response.parameters.get(LOGPROBS, "[]")))),
        )

    @property
    def carries_news(self) -> bool:
        """Whether it makes a chunk: one per generated token, as vLLM sends (a token whose
        text is held back, part of a character or of a stop string, has an empty chunk, with
        its logprobs), and the end; a final flag alone is no chunk."""
        return bool(self.text) or self.output_tokens is not None or self.finish_reason is not None


@dataclass
class Choice:
    """One choice's answer as its pieces arrive: whole text, last counts, finish reason, and
    its tokens' log-probabilities."""

    texts: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    tokens: list[TokenLogprob] = field(default_factory=list)

    def add(self, piece: Piece) -> None:
        self.texts.append(piece.text)
        self.tokens.extend(piece.logprobs)
        if piece.input_tokens is not None:
            self.prompt_tokens = piece.input_tokens
        if piece.output_tokens is not None:
            self.completion_tokens = piece.output_tokens
        if piece.finish_reason is not None:
            self.finish_reason = piece.finish_reason


@dataclass
class Answer:
    """One request's answer: a choice per prompt (index i answers the i-th), usage summed."""

    id: str
    model: str
    chat: bool
    created: int = field(default_factory=lambda: int(time.time()))
    choices: list[Choice] = field(default_factory=lambda: [Choice()])
    #: Whether the request asked for log-probabilities (else `logprobs` is null).
    logprobs: bool = False
    #: How it may call tools: a chat's answer is read for `tool_calls` when parsed.
    tools: ToolUse = field(default_factory=ToolUse)

    def add(self, piece: Piece, index: int = 0) -> None:
        self.choices[index].add(piece)

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def usage(self) -> dict[str, int]:
        prompt = sum(c.prompt_tokens for c in self.choices)
        completion = sum(c.completion_tokens for c in self.choices)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def whole(self) -> dict[str, Any]:
        """The non-streamed answer: `text_completion` or `chat.completion`, with usage."""
        choices = [self._whole_choice(i, c) for i, c in enumerate(self.choices)]
        return {**self._head(self.object), "choices": choices, "usage": self.usage()}

    def _whole_choice(self, index: int, choice: Choice) -> dict[str, Any]:
        text = "".join(choice.texts)
        out: dict[str, Any] = {"index": index, "finish_reason": choice.finish_reason}
        if self.chat:
            out["message"] = self._message(text)
            if out["message"].get("tool_calls") and self.tools.mode == "auto":
                out["finish_reason"] = "tool_calls"  # vLLM's, for calls the model chose
        else:
            out["text"] = text
        out["logprobs"] = self._logprobs(choice.tokens)
        return out

    def _message(self, text: str) -> dict[str, Any]:
        if not self.tools.parsed:
            return {"role": ASSISTANT, "content": text}
        content, calls = read_calls(text, self.tools)
        message: dict[str, Any] = {"role": ASSISTANT, "content": content}
        if calls:
            message["tool_calls"] = [c.to_dict() for c in calls]
        return message

    def _logprobs(self, tokens: list[TokenLogprob]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        return chat_logprobs(tokens) if self.chat else completion_logprobs(tokens)

    def chunk(
        self, piece: Piece | None, include_usage: bool, first: bool = False, index: int = 0
    ) -> bytes:
        """One `data:` event for a piece (a chat's first names the role: `piece` None)."""
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            delta: dict[str, Any] = {"role": ASSISTANT, "content": ""} if first else {}
            if piece is not None and (piece.text or piece.finish_reason is None):
                delta["content"] = piece.text
            choice["delta"] = delta
        else:
            choice["text"] = piece.text if piece is not None else ""
        choice["logprobs"] = self._logprobs(list(piece.logprobs) if piece is not None else [])
        choice["finish_reason"] = piece.finish_reason if piece is not None else None
        return self._chunk_event(choice, include_usage)

    def held_chunk(self, include_usage: bool) -> bytes:
        """The one chunk of a chat answer read for tool calls, sent once it is whole (a call is
        known only at its end): its content or its `tool_calls`, logprobs and finish reason."""
        whole = self.whole()["choices"][0]
        delta = {k: v for k, v in whole["message"].items() if k != "role" and v is not None}
        if "tool_calls" in delta:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta["tool_calls"])]
        ending = {k: whole[k] for k in ("logprobs", "finish_reason")}
        return self._chunk_event({"index": 0, "delta": delta, **ending}, include_usage)

    def _chunk_event(self, choice: dict[str, Any], include_usage: bool) -> bytes:
        doc = {**self._head(self._chunk_object), "choices": [choice]}
        if include_usage:
            doc["usage"] = None  # OpenAI: null on every chunk but the last
        return event(doc)

    def usage_chunk(self) -> bytes:
        """stream_options.include_usage: the last chunk, no choices, the request's usage."""
        return event({**self._head(self._chunk_object), "choices": [], "usage": self.usage()})

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _head(self, kind: str) -> dict[str, Any]:
        prefix = "chatcmpl-" if self.chat else "cmpl-"
        return {
            "id": prefix + self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
        }


def chat_logprobs(tokens: list[TokenLogprob]) -> dict[str, Any]:
    """Chat's shape: `{"content": [{token, logprob, bytes, top_logprobs: [...]}]}`."""

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {
        "content": [
            {**entry(token, logprob), "top_logprobs": [entry(t, lp) for t, lp in top]}
            for token, logprob, top in tokens
        ]
    }


def completion_logprobs(tokens: list[TokenLogprob]) -> dict[str, Any]:
    """Completions' (legacy) shape: parallel lists of tokens, their logprobs, the best
    alternatives ({token: logprob}) and each token's offset in the text."""
    offsets, at = [], 0
    for token, _, _ in tokens:
        offsets.append(at)
        at += len(token)
    return {
        "tokens": [t[0] for t in tokens],
        "token_logprobs": [t[1] for t in tokens],
        "top_logprobs": [{alt: lp for alt, lp in t[2]} for t in tokens],
        "text_offset": offsets,
    }


def _scalar(array: np.ndarray | None) -> object:
    if array is None or array.size == 0:
        return None
    return array.reshape(-1)[0]


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        # An engine sends whole characters; a split one shows as U+FFFD rather than failing.
        return value.decode(errors="replace")
    return str(value)


def _count(array: np.ndarray | None) -> int | None:
    value = _scalar(array)
    return None if value is None else int(value)  # type: ignore[call-overload]
