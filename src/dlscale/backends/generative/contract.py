"""The tensors and parameters of a generative model, for every engine and every frontend.

A generative model has Triton's vLLM-backend signature, so that Triton users' clients work
unchanged (shared/reference/generative.md): one BYTES input `text_input` (the prompt, or with
`input_format = "chat"` a JSON list of OpenAI chat messages the engine renders with the
model's chat template) and, per streamed response, `text_output` (the new text since the
previous response), `num_input_tokens`, `num_output_tokens` (generated so far) and, on the
final response, `finish_reason`. Sampling settings are request parameters (OIP generate puts
unknown JSON keys there; Triton's vLLM clients may send them as a JSON `sampling_parameters`
string): `Sampling.from_parameters` reads and bounds them in one place.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from dlscale.backends.base import StreamingBackend, StreamPart
from dlscale.errors import InvalidInput
from dlscale.types import Parameter

# The tensor names live with the wire codec, where frontends and the bench read them too;
# re-exported here for the engines.
from dlscale.wire.generative import (
    FINISH_REASON,
    FINISH_REASONS,
    INPUTS,
    MAX_MESSAGES,
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    OUTPUTS,
    TEXT_INPUT,
    TEXT_OUTPUT,
    check_prompt_bytes,
)

__all__ = [
    "FINISH_REASON",
    "FINISH_REASONS",
    "INPUTS",
    "MAX_MESSAGES",
    "NUM_INPUT_TOKENS",
    "NUM_OUTPUT_TOKENS",
    "OUTPUTS",
    "TEXT_INPUT",
    "TEXT_OUTPUT",
    "EngineStats",
    "GenerativeBackend",
    "Sampling",
    "chat_messages",
    "check_context",
    "join",
    "part",
    "prompt_text",
    "prompt_tokens",
]

#: Bounds on what a client may ask, checked before anything reaches an engine.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_TOKENS_DEFAULT = 16
MAX_SEED = 2**63 - 1
#: What `text_input` holds: the prompt, chat messages (JSON), or the prompt's token ids (JSON).
INPUT_FORMATS = ("text", "chat", "tokens")
#: Triton vLLM clients' settings: a JSON object in one string (a parameter or a BYTES input).
PACKED = "sampling_parameters"


@dataclass(frozen=True)
class Sampling:
    """How to generate: the request's sampling settings, validated."""

    max_tokens: int = MAX_TOKENS_DEFAULT
    #: 0 is greedy decoding.
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    #: "text": `text_input` is the prompt; "chat": a JSON list of {role, content} messages;
    #: "tokens": a JSON list of the prompt's token ids (OpenAI's `prompt: [1, 2, 3]`).
    input_format: str = "text"
    extra: Mapping[str, Parameter] = field(default_factory=dict)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Parameter]) -> Sampling:
        """The settings a request's parameters name; InvalidInput naming the field otherwise."""
        merged: dict[str, object] = dict(parameters)
        packed = merged.pop(PACKED, None)
        if packed is not None:
            merged.update(_unpack(packed))
        max_tokens = _integer(merged, "max_tokens", MAX_TOKENS_DEFAULT, low=1)
        temperature = _number(merged, "temperature", 1.0, low=0.0, high=2.0)
        top_p = _number(merged, "top_p", 1.0, low=0.0, high=1.0)
        if top_p == 0.0:
            raise InvalidInput("top_p must be greater than 0 and at most 1", "top_p")
        seed = merged.get("seed")
        if seed is not None:
            seed = _integer(merged, "seed", 0, low=0, high=MAX_SEED)
        input_format = str(merged.get("input_format", "text"))
        if input_format not in INPUT_FORMATS:
            raise InvalidInput(
                f"input_format must be one of {', '.join(INPUT_FORMATS)}, not {input_format!r}",
                "input_format",
            )
        return cls(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed if isinstance(seed, int) else None,
            stop=_stop_strings(merged.get("stop")),
            ignore_eos=_flag(merged, "ignore_eos"),
            input_format=input_format,
        )


def _unpack(packed: object) -> dict[str, object]:
    """Triton vLLM clients' `sampling_parameters`: a JSON object in a string parameter."""
    try:
        value = json.loads(packed) if isinstance(packed, str | bytes) else None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"sampling_parameters is not JSON: {exc}", PACKED) from None
    if not isinstance(value, dict):
        raise InvalidInput("sampling_parameters must be a JSON object", PACKED)
    return value


def _from_text(value: object, kind: type[int] | type[float]) -> object:
    """A number written as a string, as Triton's vLLM clients send every setting
    (`{"max_tokens": "100"}`, parameters of type string): read as its number."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return kind(value.strip())
    return value


def _integer(
    values: Mapping[str, object], name: str, default: int, low: int, high: int | None = None
) -> int:
    value = _from_text(values.get(name, default), int)
    # NaN and the infinities (JSON's 1e400 reads as one) are no integer: int() would raise.
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} must be an integer, not {value!r}", name)
    if value < low or (high is not None and value > high):
        bound = f"at least {low}" if high is None else f"between {low} and {high}"
        raise InvalidInput(f"{name} must be {bound}, not {value}", name)
    return value


def _number(
    values: Mapping[str, object], name: str, default: float, low: float, high: float
) -> float:
    value = _from_text(values.get(name, default), float)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"{name} must be a number, not {value!r}", name)
    if not low <= value <= high:
        raise InvalidInput(f"{name} must be between {low} and {high}, not {value}", name)
    return float(value)


def _flag(values: Mapping[str, object], name: str) -> bool:
    value = values.get(name, False)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"  # a Triton vLLM client's string
    if not isinstance(value, bool):
        raise InvalidInput(f"{name} must be true or false, not {value!r}", name)
    return value


def _stop_strings(value: object) -> tuple[str, ...]:
    """`stop`: a string, a JSON list of strings in a string parameter, or a list."""
    if value is None:
        return ()
    if isinstance(value, str) and value.startswith("["):
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(value)
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
        raise InvalidInput("stop must be a string or a list of strings", "stop")
    if len(strings) > MAX_STOP_STRINGS or any(not s or len(s) > MAX_STOP_CHARS for s in strings):
        raise InvalidInput(
            f"stop takes at most {MAX_STOP_STRINGS} strings of 1 to {MAX_STOP_CHARS} characters",
            "stop",
        )
    return tuple(strings)


def prompt_text(inputs: Mapping[str, np.ndarray], context: int | None = None) -> str:
    """The one prompt of a request's `text_input` (UTF-8), InvalidInput otherwise; with the
    model's `context` (tokens), refused unread if it has more bytes than can fit in it."""
    array = inputs.get(TEXT_INPUT)
    if array is None or array.size != 1:
        raise InvalidInput(f"a generative model takes one {TEXT_INPUT} element per request")
    value = array.reshape(-1)[0]
    if context is not None:
        check_prompt_bytes(
            len(value) if isinstance(value, bytes) else len(str(value).encode()), context
        )
    try:
        return value.decode() if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError:
        raise InvalidInput(f"{TEXT_INPUT} is not UTF-8") from None


def prompt_tokens(text: str, vocabulary: int) -> list[int]:
    """The token ids `text_input` holds when `input_format = "tokens"`: a JSON list of ids,
    each one of the model's `vocabulary`; InvalidInput naming the prompt otherwise."""
    try:
        ids = json.loads(text)
    except json.JSONDecodeError:
        ids = None
    if not isinstance(ids, list) or not ids or not all(type(i) is int for i in ids):
        raise InvalidInput("a token-id prompt is a non-empty list of integers", "prompt")
    wrong = next((i for i in ids if not 0 <= i < vocabulary), None)
    if wrong is not None:
        raise InvalidInput(
            f"token id {wrong} is out of this model's vocabulary (0 to {vocabulary - 1})", "prompt"
        )
    return ids


def check_context(prompt: int, max_tokens: int, context: int, input_format: str) -> None:
    """Refuse a request whose prompt and max_tokens (tokens) do not fit in the model's
    `context` (its max_model_len), in the words of vLLM's OpenAI server, naming the field at
    fault: the prompt (or messages) when it alone fills the context, else max_tokens."""
    where = "messages" if input_format == "chat" else "prompt"
    if prompt >= context:
        raise InvalidInput(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt} tokens in the {where}. Please reduce the length of the {where}.",
            where,
        )
    if prompt + max_tokens > context:
        raise InvalidInput(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt + max_tokens} tokens ({prompt} in the {where}, {max_tokens} in the "
            f"completion). Please reduce the length of the {where} or completion.",
            "max_tokens",
        )


def chat_messages(text: str) -> list[dict[str, str]]:
    """The chat messages `text_input` holds when `input_format = "chat"`, at most MAX_MESSAGES."""
    try:
        messages = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"chat messages are not JSON: {exc}") from None
    if isinstance(messages, list) and len(messages) > MAX_MESSAGES:
        raise InvalidInput(f"a chat may have at most {MAX_MESSAGES} messages, not {len(messages)}")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in messages
        )
    ):
        raise InvalidInput("chat messages must be a non-empty list of {role, content} strings")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def part(
    text: str, input_tokens: int, output_tokens: int, finish_reason: str | None = None
) -> StreamPart:
    """One streamed response: the new text and the counts so far; final with a finish reason."""
    outputs = {
        TEXT_OUTPUT: np.array([text.encode()], dtype=object),
        NUM_INPUT_TOKENS: np.array([input_tokens], dtype=np.uint32),
        NUM_OUTPUT_TOKENS: np.array([output_tokens], dtype=np.uint32),
    }
    if finish_reason is not None:
        outputs[FINISH_REASON] = np.array([finish_reason.encode()], dtype=object)
    return StreamPart(outputs, final=finish_reason is not None)


def join(parts: Iterable[StreamPart]) -> StreamPart:
    """A whole answer from its streamed parts (text concatenated, last counts and reason)."""
    text: list[bytes] = []
    last: StreamPart | None = None
    for each in parts:
        if TEXT_OUTPUT in each.outputs:
            text.append(bytes(each.outputs[TEXT_OUTPUT].reshape(-1)[0]))
        if NUM_OUTPUT_TOKENS in each.outputs:
            last = each
    if last is None:
        raise InvalidInput("the generation ended before its first token")
    whole = dict(last.outputs)
    whole[TEXT_OUTPUT] = np.array([b"".join(text)], dtype=object)
    return StreamPart(whole, dict(last.parameters), final=True)


@dataclass(frozen=True)
class EngineStats:
    """What an engine reports for the server's metrics, read when they are scraped."""

    running: int
    waiting: int
    #: Share of the KV cache that sequences hold now, 0 to 1 (blocks kept only for a later
    #: prefix match are not in use: the engine evicts them when it needs the room).
    kv_cache_usage: float
    #: Share of the KV cache kept for prefix matches that no sequence holds, 0 to 1.
    kv_cache_cached: float = 0.0
    #: Prompt tokens looked up in the prefix cache, and those found, since the engine started
    #: (None: the engine does not report them).
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None


@runtime_checkable
class GenerativeBackend(StreamingBackend, Protocol):
    """A generative engine (`Capabilities.generates_text`): streams by this contract and reports
    its state for the metrics (running and waiting sequences, KV-cache use)."""

    def engine_stats(self) -> EngineStats: ...
