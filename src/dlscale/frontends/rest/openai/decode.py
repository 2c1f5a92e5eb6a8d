"""OpenAI requests read into dlscale's: one InferenceRequest by the generative contract.

The prompt (or the chat messages, as JSON, with `input_format = "chat"`) becomes `text_input`;
the sampling settings become the request's typed `Sampling` (dlscale/sampling.py), read here
once and bounded there; `priority` and `timeout` are the Open Inference Protocol's, so that an
OpenAI request waits in the model's one queue by the same rules. Fields are checked for their
types here, each refusal naming its field in `param`; fields this server does not implement
are refused (400) when set to anything but their default, and fields it does not know are
ignored, as vLLM does.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlscale.errors import InvalidField, InvalidInput, clipped
from dlscale.frontends.rest.openai.tools import ToolUse, response_guide, tool_use
from dlscale.sampling import MAX_TOKENS_DEFAULT, Guide, Sampling
from dlscale.types import InferenceRequest, Parameters
from dlscale.wire.generative import MAX_MESSAGES, TEXT_INPUT
from dlscale.wire.rest_json import ANY_JSON, decode_json
from dlscale.wire.tensors import Buffer

#: A prompt, or the text of all chat messages together, in UTF-8 bytes: the engine holds it
#: to its max_model_len in tokens, this bounds the text it must tokenize to learn that.
MAX_PROMPT_BYTES = 2 * 2**20
#: Roles a chat message may have (OpenAI's; "developer" is its newer "system").
ROLES = ("system", "developer", "user", "assistant", "tool")
#: Prompts one completions request may hold (a list of prompts: a choice each).
MAX_PROMPTS = 64
#: Request ids a client may set (X-Request-Id) are kept to this many characters.
MAX_ID_CHARS = 128
#: Fields this server does not implement, with the value that means "not used".
_UNIMPLEMENTED: dict[str, tuple[Any, ...]] = {
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "functions": (None, []),
}
#: Sampling fields read as they are named, with their JSON types.
_SAMPLING_FIELDS: tuple[tuple[str, type], ...] = (
    ("temperature", float),
    ("top_p", float),
    ("top_k", int),
    ("min_tokens", int),
    ("repetition_penalty", float),
    ("seed", int),
    ("ignore_eos", bool),
)


@dataclass(frozen=True)
class Call:
    """A decoded OpenAI request: one InferenceRequest per prompt (choice `index` i answers
    the i-th), and how the answer is to be sent."""

    requests: tuple[InferenceRequest, ...]
    stream: bool
    #: stream_options.include_usage: a last chunk with `usage` (and `usage: null` on the others).
    include_usage: bool
    #: How the answer may call tools (chat), read back from its text by encode.py.
    tools: ToolUse = field(default_factory=ToolUse)

    @property
    def request(self) -> InferenceRequest:
        """The first prompt's request (a chat has one)."""
        return self.requests[0]

    @property
    def model(self) -> str:
        return self.request.model_name

    @property
    def logprobs(self) -> bool:
        """Whether the answer carries log-probabilities."""
        sampling = self.request.sampling
        return sampling is not None and sampling.logprobs is not None


def completion_call(body: Buffer, headers: Mapping[str, str]) -> Call:
    """A `POST /v1/completions` body as a Call: one prompt or several, each a string or a
    list of token ids, as vLLM takes them."""
    doc = document(body)
    prompts = _prompts(doc.get("prompt"))
    _bounded("prompt", sum(len(text.encode()) for text, _ in prompts))
    max_tokens = _field(doc, "max_tokens", int)
    logprobs = _field(doc, "logprobs", int)
    guide = response_guide(doc.get("response_format"))
    calls = [
        _call(doc, headers, text, _sampling(doc, kind, max_tokens, logprobs=logprobs, guide=guide))
        for text, kind in prompts
    ]
    first = calls[0]
    return Call(tuple(c.request for c in calls), first.stream, first.include_usage)


def _prompts(value: object) -> list[tuple[str, str]]:
    """The prompts of `prompt`, each as `text_input` and its input_format ("text" or
    "tokens": a JSON list of ids); InvalidField naming `prompt` otherwise."""
    if isinstance(value, str):
        return [(value, "text")]
    if _is_ids(value):
        return [(json.dumps(value), "tokens")]
    if isinstance(value, list) and value and len(value) <= MAX_PROMPTS:
        if all(isinstance(p, str) for p in value):
            return [(p, "text") for p in value]
        if all(_is_ids(p) for p in value):
            return [(json.dumps(p), "tokens") for p in value]
    raise InvalidField(
        "prompt",
        "prompt must be a string, a list of token ids, or a list of 1 to "
        f"{MAX_PROMPTS} of either (all of one kind)",
    )


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(type(i) is int for i in value)


def chat_call(body: Buffer, headers: Mapping[str, str]) -> Call:
    """A `POST /v1/chat/completions` body as a Call; the engine renders the messages."""
    doc = document(body)
    messages = _messages(doc.get("messages"))
    text = json.dumps(messages, ensure_ascii=False)
    # max_completion_tokens is OpenAI's newer name; it wins where a client sends both.
    newer = _field(doc, "max_completion_tokens", int)
    most = newer if newer is not None else _field(doc, "max_tokens", int)
    tools, use, forced = tool_use(doc.get("tools"), doc.get("tool_choice"))
    guide = response_guide(doc.get("response_format"))
    if forced is not None and guide is not None:
        raise InvalidField("response_format", "response_format and a forced tool_choice conflict")
    sampling = _sampling(
        doc, "chat", most, logprobs=_chat_logprobs(doc), tools=tools, guide=forced or guide
    )
    return _call(doc, headers, text, sampling, use)


def tokenize_call(body: Buffer, headers: Mapping[str, str]) -> Call:
    """vLLM's `POST /tokenize`: a `prompt`, or chat `messages` (and `tools`) as the chat
    template renders them with the assistant's header last."""
    doc = document(body)
    if doc.get("messages") is not None:
        text = json.dumps(_messages(doc["messages"]), ensure_ascii=False)
        tools, _, _ = tool_use(doc.get("tools"), "none")
        sampling = Sampling(task="tokenize", input_format="chat", tools=tools)
    else:
        prompt = doc.get("prompt")
        if not isinstance(prompt, str):
            raise InvalidField("prompt", "prompt must be a string (or send chat messages)")
        _bounded("prompt", len(prompt.encode()))
        text, sampling = prompt, Sampling(task="tokenize")
    return _call(doc, headers, text, sampling)


def detokenize_call(body: Buffer, headers: Mapping[str, str]) -> Call:
    """vLLM's `POST /detokenize`: `tokens`, a list of token ids, to their text."""
    doc = document(body)
    tokens = doc.get("tokens")
    if not isinstance(tokens, list) or not all(is_token_id(t) for t in tokens):
        raise InvalidField("tokens", "tokens must be a list of token ids (integers >= 0)")
    text = json.dumps(tokens)
    _bounded("tokens", len(text))
    return _call(doc, headers, text, Sampling(task="detokenize"))


def is_token_id(value: object) -> bool:
    """Whether a JSON value is a token id: an integer from 0 below 2**63 (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _chat_logprobs(doc: dict[str, Any]) -> int | None:
    """Chat's `logprobs` (true/false) and `top_logprobs` (alternatives) as one count."""
    wanted = _field(doc, "logprobs", bool)
    top = _field(doc, "top_logprobs", int)
    if top is not None and not wanted:
        raise InvalidField("top_logprobs", "top_logprobs needs logprobs set to true")
    if not wanted:
        return None
    try:
        return Sampling(logprobs=top or 0).logprobs  # bounded where every bound is
    except InvalidField as exc:
        raise InvalidField("top_logprobs", str(exc).replace("logprobs", "top_logprobs")) from None


def document(body: Buffer) -> dict[str, Any]:
    """The body as a JSON object; InvalidInput otherwise."""
    doc = decode_json(ANY_JSON, body, "OpenAI request")
    if not isinstance(doc, dict):
        raise InvalidInput("the request body must be a JSON object")
    return doc


def _sampling(
    doc: dict[str, Any],
    input_format: str,
    max_tokens: int | None,
    *,
    logprobs: int | None = None,
    tools: str = "",
    guide: Guide | None = None,
) -> Sampling:
    """The request's typed settings; Sampling checks their bounds (InvalidField naming one)."""
    for name, unused in _UNIMPLEMENTED.items():
        if doc.get(name) not in unused:
            raise InvalidField(name, f"{name} is not supported by this server; leave it out")
    settings = {name: _field(doc, name, kind) for name, kind in _SAMPLING_FIELDS}
    n = _field(doc, "n", int)
    if n not in (None, 1):
        raise InvalidField("n", f"n must be 1: one choice per request is supported, not {n}")
    return Sampling(
        max_tokens=MAX_TOKENS_DEFAULT if max_tokens is None else max_tokens,
        stop=_stop(doc.get("stop")),
        input_format=input_format,
        logprobs=logprobs,
        tools=tools,
        guide=guide,
        **{k: v for k, v in settings.items() if v is not None},
    )


def _stop(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise InvalidField("stop", "stop must be a string or a list of strings")


def _call(
    doc: dict[str, Any],
    headers: Mapping[str, str],
    text: str,
    sampling: Sampling,
    use: ToolUse | None = None,
) -> Call:
    model = _field(doc, "model", str)
    if not model:
        raise InvalidField("model", "model is required: the name of a served generative model")
    stream = bool(_field(doc, "stream", bool))
    options = _field(doc, "stream_options", dict)
    if options is not None and not stream:
        raise InvalidField("stream_options", "stream_options is only allowed when stream is true")
    include_usage = bool(_field(options or {}, "include_usage", bool, "stream_options."))
    parameters: Parameters = {}
    for name in ("priority", "timeout"):  # the queue's, as the Open Inference Protocol's
        value = _field(doc, name, int)
        if value is not None:
            parameters[name] = value
    inputs = {TEXT_INPUT: np.array([text.encode()], dtype=object)}
    request = InferenceRequest(
        model, inputs, id=request_id(headers), parameters=parameters, sampling=sampling
    )
    request.traceparent = headers.get("traceparent", "")  # continued by an OTLP trace
    return Call((request,), stream, include_usage, use or ToolUse())


def _field(doc: Mapping[str, Any], name: str, kind: type, prefix: str = "") -> Any:
    """`doc[name]` if it is a `kind` (null and absent: None), else InvalidField naming it."""
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
        raise InvalidField(prefix + name, f"{prefix}{name} must be {what}, not {_shown(value)}")
    if kind is int and not -(2**63) <= value < 2**63:  # request parameters are 64-bit
        raise InvalidField(prefix + name, f"{prefix}{name} is out of range: {_shown(value)}")
    return value


def _messages(value: object) -> list[dict[str, Any]]:
    """Chat messages as {role, content} strings (text parts of a content list joined), with an
    assistant's `tool_calls` and a tool's `tool_call_id` kept for the chat template."""
    if not isinstance(value, list) or not value:
        raise InvalidField("messages", "messages must be a non-empty list of {role, content}")
    if len(value) > MAX_MESSAGES:
        raise InvalidField("messages", f"at most {MAX_MESSAGES} messages, not {len(value)}")
    out: list[dict[str, Any]] = []
    total = 0
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise InvalidField(where, f"{where} must be an object with role and content")
        role = message.get("role")
        if role not in ROLES:
            raise InvalidField(f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)}")
        content = _content(message.get("content"), f"{where}.content")
        kept: dict[str, Any] = {"role": str(role), "content": content}
        for name, kind in (("tool_calls", list), ("tool_call_id", str)):
            if message.get(name) is not None:
                kept[name] = _field(message, name, kind, f"{where}.")
        total += len(json.dumps(kept).encode())
        out.append(kept)
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
                raise InvalidField(where, f"{where}: only text parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidField(where, f"{where}: a text part's text must be a string")
            texts.append(text)
        return "".join(texts)
    raise InvalidField(where, f"{where} must be a string or a list of text parts")


def _bounded(param: str, size: int) -> None:
    if size > MAX_PROMPT_BYTES:
        raise InvalidField(
            param, f"the {param} is {size} bytes, above this server's {MAX_PROMPT_BYTES} bytes"
        )


def request_id(headers: Mapping[str, str]) -> str:
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
    return clipped(text, 40)
