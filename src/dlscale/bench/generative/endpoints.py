"""The three streaming endpoint shapes: OpenAI completions, OpenAI chat, OIP generate_stream.

Each kind knows its path, the JSON body that asks for `max_tokens` tokens (with `ignore_eos`,
so that the output length is the one asked for), and how to read one server-sent event into
the text it carries and the counts the server gives (shared/reference/generative.md: OpenAI
chunks end with `data: [DONE]` and, with `stream_options.include_usage`, a last chunk holding
`usage`; OIP generate_stream sends `data: {json}` per response, `text_output` and the
cumulative `num_output_tokens`, and no `[DONE]`).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from dlscale.errors import BenchError


class Endpoint(enum.StrEnum):
    """An endpoint kind, by its `--generative` name."""

    COMPLETIONS = "completions"
    CHAT = "chat"
    GENERATE = "generate"

    @classmethod
    def parse(cls, name: str) -> Endpoint:
        """`openai` means completions; `chat` and `generate` name themselves."""
        try:
            return cls("completions" if name.lower() == "openai" else name.lower())
        except ValueError:
            raise BenchError(
                f"--generative {name!r}: expected openai (completions), chat or generate"
            ) from None

    def path(self, model: str) -> str:
        if self is Endpoint.COMPLETIONS:
            return "/v1/completions"
        if self is Endpoint.CHAT:
            return "/v1/chat/completions"
        return f"/v2/models/{model}/generate_stream"


@dataclass(frozen=True)
class Ask:
    """What one request asks: its prompt, how many tokens, and sampling knobs."""

    prompt: str
    max_tokens: int
    ignore_eos: bool = True
    temperature: float | None = None


def request_body(kind: Endpoint, model: str, ask: Ask) -> dict[str, Any]:
    """The JSON body of one streaming request."""
    sampling: dict[str, Any] = {"max_tokens": ask.max_tokens}
    if ask.ignore_eos:
        sampling["ignore_eos"] = True
    if ask.temperature is not None:
        sampling["temperature"] = ask.temperature
    if kind is Endpoint.GENERATE:
        return {"text_input": ask.prompt, "stream": True, **sampling}
    body: dict[str, Any] = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        **sampling,
    }
    if kind is Endpoint.CHAT:
        body["messages"] = [{"role": "user", "content": ask.prompt}]
    else:
        body["prompt"] = ask.prompt
    return body


@dataclass(frozen=True)
class Event:
    """What one server-sent event said."""

    text: str = ""
    #: Output tokens so far (OIP num_output_tokens; OpenAI usage.completion_tokens).
    tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    #: OpenAI's `[DONE]`.
    done: bool = False


def read_event(kind: Endpoint, data: str) -> Event:
    """One event's `data:` payload; an error event or a payload that is not JSON is an error."""
    if data.strip() == "[DONE]":
        return Event(done=True)
    try:
        doc = json.loads(data)
    except ValueError:
        return Event(error=f"an event that is not JSON: {data[:120]!r}")
    if not isinstance(doc, dict):
        return Event(error=f"an event that is not a JSON object: {data[:120]!r}")
    if "error" in doc:
        error = doc["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        return Event(error=str(message))
    if kind is Endpoint.GENERATE:
        return _generate_event(doc)
    return _openai_event(kind, doc)


def _generate_event(doc: dict[str, Any]) -> Event:
    text = doc.get("text_output", "")
    return Event(
        text=text if isinstance(text, str) else "",
        tokens=_count(doc.get("num_output_tokens")),
        prompt_tokens=_count(doc.get("num_input_tokens")),
        finish_reason=_text(doc.get("finish_reason")),
    )


def _openai_event(kind: Endpoint, doc: dict[str, Any]) -> Event:
    found = doc.get("usage")
    usage: dict[str, Any] = found if isinstance(found, dict) else {}
    text, finish = "", None
    choices = doc.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        if kind is Endpoint.CHAT:
            delta = choice.get("delta")
            text = (delta.get("content") if isinstance(delta, dict) else None) or ""
        else:
            text = choice.get("text") or ""
        finish = _text(choice.get("finish_reason"))
    return Event(
        text=text if isinstance(text, str) else "",
        tokens=_count(usage.get("completion_tokens")),
        prompt_tokens=_count(usage.get("prompt_tokens")),
        finish_reason=finish,
    )


def _count(value: object) -> int | None:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, str) and value else None
