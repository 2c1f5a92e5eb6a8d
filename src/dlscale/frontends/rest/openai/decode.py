"""OpenAI requests read into dlscale's: one InferenceRequest by the generative contract.

The prompt (or the chat messages, as JSON, with `input_format = "chat"`) becomes `text_input`;
the sampling settings become request parameters, which the contract's `Sampling` bounds in one
place (backends/generative/contract.py); `priority` and `timeout` are the Open Inference
Protocol's, so that an OpenAI request waits in the model's one queue by the same rules.
Fields are checked for their types here, each refusal naming its field; fields this server
does not implement are refused when set to anything but their default (501), and fields it
does not know are ignored, as vLLM does.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlscale.errors import InvalidInput, Unsupported
from dlscale.frontends.rest.openai.errors import BadField
from dlscale.types import InferenceRequest, Parameters
from dlscale.wire.generative import MAX_MESSAGES, TEXT_INPUT
from dlscale.wire.rest import ANY_JSON, decode_json
from dlscale.wire.tensors import Buffer

#: A prompt, or the text of all chat messages together, in UTF-8 bytes: the engine holds it
#: to its max_model_len in tokens, this bounds the text it must tokenize to learn that.
MAX_PROMPT_BYTES = 2 * 2**20
#: Roles a chat message may have (OpenAI's; "developer" is its newer "system").
ROLES = ("system", "developer", "user", "assistant", "tool")
#: Prompts one /v1/completions request may hold (each is a sequence in the engine).
MAX_PROMPTS = 64
#: Request ids a client may set (X-Request-Id) are kept to this many characters.
MAX_ID_CHARS = 128
#: Fields this server does not implement, with the value that means "not used".
_UNIMPLEMENTED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "tools": (None, []),
    "functions": (None, []),
}


@dataclass(frozen=True)
class Call:
    """A decoded OpenAI request: one InferenceRequest per prompt (choice `index` i answers
    the i-th), and how the answer is to be sent."""

    requests: tuple[InferenceRequest, ...]
    stream: bool
    #: stream_options.include_usage: a last chunk with `usage` (and `usage: null` on the others).
    include_usage: bool

    @property
    def request(self) -> InferenceRequest:
        """The first prompt's request (a chat has one)."""
        return self.requests[0]

    @property
    def model(self) -> str:
        return self.request.model_name


def completion_call(body: Buffer, headers: Mapping[str, str]) -> Call:
    """A `POST /v1/completions` body as a Call: one prompt or several, each a string or a
    list of token ids, as vLLM takes them."""
    doc = _document(body)
    prompts = _prompts(doc.get("prompt"))
    _bounded("prompt", sum(len(text.encode()) for text, _ in prompts))
    max_tokens = _field(doc, "max_tokens", int)
    calls = [_call(doc, headers, text, kind, max_tokens) for text, kind in prompts]
    first = calls[0]
    return Call(tuple(c.request for c in calls), first.stream, first.include_usage)


def _prompts(value: object) -> list[tuple[str, str]]:
    """The prompts of `prompt`, each as `text_input` and its input_format ("text" or
    "tokens": a JSON list of ids); BadField naming `prompt` otherwise."""
    if isinstance(value, str):
        return [(value, "text")]
    if _is_ids(value):
        return [(json.dumps(value), "tokens")]
    if isinstance(value, list) and value and len(value) <= MAX_PROMPTS:
        if all(isinstance(p, str) for p in value):
            return [(p, "text") for p in value]
        if all(_is_ids(p) for p in value):
            return [(json.dumps(p), "tokens") for p in value]
    raise BadField(
        "prompt",
        "prompt must be a string, a list of token ids, or a list of 1 to "
        f"{MAX_PROMPTS} of either (all of one kind)",
    )


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(type(i) is int for i in value)


def chat_call(body: Buffer, headers: Mapping[str, str]) -> Call:
    """A `POST /v1/chat/completions` body as a Call; the engine renders the messages."""
    doc = _document(body)
    messages = _messages(doc.get("messages"))
    text = json.dumps(messages, ensure_ascii=False)
    # max_completion_tokens is OpenAI's newer name; it wins where a client sends both.
    newer = _field(doc, "max_completion_tokens", int)
    most = newer if newer is not None else _field(doc, "max_tokens", int)
    return _call(doc, headers, text, "chat", max_tokens=most)


def _document(body: Buffer) -> dict[str, Any]:
    doc = decode_json(ANY_JSON, body, "OpenAI request")
    if not isinstance(doc, dict):
        raise InvalidInput("the request body must be a JSON object")
    return doc


def _call(
    doc: dict[str, Any],
    headers: Mapping[str, str],
    text: str,
    input_format: str,
    max_tokens: int | None,
) -> Call:
    model = _field(doc, "model", str)
    if not model:
        raise BadField("model", "model is required: the name of a served generative model")
    for name, unused in _UNIMPLEMENTED.items():
        if doc.get(name) not in unused:
            raise Unsupported(f"{name} is not supported by this server; leave it out")
    response_format = _field(doc, "response_format", dict)
    if response_format is not None and response_format.get("type") != "text":
        raise Unsupported('response_format: only {"type": "text"} is supported')
    n = _field(doc, "n", int)
    if n not in (None, 1):
        raise BadField("n", f"n must be 1: one choice per request is supported, not {n}")
    stream = bool(_field(doc, "stream", bool))
    options = _field(doc, "stream_options", dict)
    if options is not None and not stream:
        raise BadField("stream_options", "stream_options is only allowed when stream is true")
    include_usage = bool(_field(options or {}, "include_usage", bool, "stream_options."))
    parameters = _parameters(doc, input_format, max_tokens)
    inputs = {TEXT_INPUT: np.array([text.encode()], dtype=object)}
    request = InferenceRequest(model, inputs, id=_request_id(headers), parameters=parameters)
    request.traceparent = headers.get("traceparent", "")  # continued by an OTLP trace
    return Call((request,), stream, include_usage)


def _parameters(doc: dict[str, Any], input_format: str, max_tokens: int | None) -> Parameters:
    """The request parameters: sampling settings by the contract's names, and the queue's."""
    parameters: Parameters = {"input_format": input_format}
    if max_tokens is not None:
        parameters["max_tokens"] = max_tokens
    for name in ("temperature", "top_p"):
        value = _field(doc, name, float)
        if value is not None:
            parameters[name] = value
    for name, kind in (("seed", int), ("priority", int), ("timeout", int), ("ignore_eos", bool)):
        value = _field(doc, name, kind)
        if value is not None:
            parameters[name] = value
    stop = doc.get("stop")
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        parameters["stop"] = json.dumps(stop)  # the contract reads a JSON list in a string
    elif isinstance(stop, str):
        parameters["stop"] = json.dumps([stop])
    elif stop is not None:
        raise BadField("stop", "stop must be a string or a list of strings")
    return parameters


def _field(doc: Mapping[str, Any], name: str, kind: type, prefix: str = "") -> Any:
    """`doc[name]` if it is a `kind` (null and absent: None), else BadField naming it."""
    value = doc.get(name)
    if value is None:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not ok or (kind is float and not math.isfinite(value)):
        expected = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
        what = expected.get(kind, "an object")
        raise BadField(prefix + name, f"{prefix}{name} must be {what}, not {_shown(value)}")
    if kind is int and not -(2**63) <= value < 2**63:  # request parameters are 64-bit
        raise BadField(prefix + name, f"{prefix}{name} is out of range: {_shown(value)}")
    return value


def _messages(value: object) -> list[dict[str, str]]:
    """Chat messages as {role, content} strings; text parts of a content list are joined."""
    if not isinstance(value, list) or not value:
        raise BadField("messages", "messages must be a non-empty list of {role, content}")
    if len(value) > MAX_MESSAGES:
        raise BadField("messages", f"at most {MAX_MESSAGES} messages, not {len(value)}")
    out: list[dict[str, str]] = []
    total = 0
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise BadField(where, f"{where} must be an object with role and content")
        role = message.get("role")
        if role not in ROLES:
            raise BadField(f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)}")
        content = _content(message.get("content"), f"{where}.content")
        total += len(content.encode())
        out.append({"role": str(role), "content": content})
    _bounded("messages", total)
    return out


def _content(value: object, where: str) -> str:
    if value is None:
        return ""  # an assistant turn that only called tools
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise Unsupported(f"{where}: only text parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise BadField(where, f"{where}: a text part's text must be a string")
            texts.append(text)
        return "".join(texts)
    raise BadField(where, f"{where} must be a string or a list of text parts")


def _bounded(param: str, size: int) -> None:
    if size > MAX_PROMPT_BYTES:
        raise BadField(
            param, f"the {param} is {size} bytes, above this server's {MAX_PROMPT_BYTES} bytes"
        )


def _request_id(headers: Mapping[str, str]) -> str:
    """The client's X-Request-Id (cut to MAX_ID_CHARS), else a new one."""
    given = headers.get("x-request-id", "").strip()
    return given[:MAX_ID_CHARS] if given else uuid.uuid4().hex


def _shown(value: object) -> str:
    plain = isinstance(value, str | int | float | bool)
    text = (
        json.dumps(value)
        if plain
        else {"dict": "an object", "list": "a list"}.get(type(value).__name__, type(value).__name__)
    )
    return text if len(text) <= 40 else text[:37] + "..."
