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
from dlscale.types import InferenceResponse
from dlscale.wire.generative import (
    FINISH_REASON,
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    TEXT_OUTPUT,
)

#: The end of every stream, after its last chunk (also after an error chunk).
DONE = b"data: [DONE]\n\n"
#: What a chat answer's first delta names.
ASSISTANT = "assistant"


@dataclass(frozen=True)
class Piece:
    """What one streamed response says: new text, tokens so far, and why it ended (final)."""

    text: str
    input_tokens: int | None
    output_tokens: int | None
    finish_reason: str | None

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
        )

    @property
    def carries_news(self) -> bool:
        """Whether it makes a chunk: one per generated token, as vLLM sends (a token whose
        text is held back, part of a character or of a stop string, has an empty chunk), and
        the end; a final flag alone is no chunk."""
        return bool(self.text) or self.output_tokens is not None or self.finish_reason is not None


@dataclass
class Choice:
    """One choice's answer as its pieces arrive: whole text, last counts, finish reason."""

    texts: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None

    def add(self, piece: Piece) -> None:
        self.texts.append(piece.text)
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
            out["message"] = {"role": ASSISTANT, "content": text}
        else:
            out["text"] = text
        out["logprobs"] = None
        return out

    def chunk(
        self, piece: Piece | None, include_usage: bool, first: bool = False, index: int = 0
    ) -> bytes:
        """One `data:` event for a piece (a chat's first names the role: `piece` None)."""
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            delta: dict[str, str] = {"role": ASSISTANT, "content": ""} if first else {}
            if piece is not None and (piece.text or piece.finish_reason is None):
                delta["content"] = piece.text
            choice["delta"] = delta
        else:
            choice["text"] = piece.text if piece is not None else ""
        choice["logprobs"] = None
        choice["finish_reason"] = piece.finish_reason if piece is not None else None
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


def event(doc: dict[str, Any]) -> bytes:
    """A server-sent event holding one JSON document."""
    return b"data: " + orjson.dumps(doc) + b"\n\n"


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
