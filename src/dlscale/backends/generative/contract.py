"""The tensors and parameters of a generative model, for every engine and every frontend.

A generative model has Triton's vLLM-backend signature, so that Triton users' clients work
unchanged (shared/reference/generative.md): one BYTES input `text_input` (the prompt, or with
`input_format = "chat"` a JSON list of OpenAI chat messages the engine renders with the
model's chat template) and, per streamed response, `text_output` (the new text since the
previous response), `num_input_tokens`, `num_output_tokens` (generated so far) and, on the
final response, `finish_reason`. Sampling settings are request parameters (OIP generate puts
unknown JSON keys there; Triton's vLLM clients may send them as a JSON `sampling_parameters`
string): the core reads them once into a typed `Sampling` (dlscale/sampling.py), which an
engine's `generate` takes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from dlscale.backends.base import StreamingBackend, StreamPart
from dlscale.errors import ConfigError, InvalidField, InvalidInput
from dlscale.sampling import Sampling

# The tensor names live with the wire codec, where frontends and the bench read them too;
# re-exported here for the engines.
from dlscale.wire.generative import (
    FINISH_REASON,
    FINISH_REASONS,
    INPUTS,
    LOGPROBS,
    MAX_MESSAGES,
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    OUTPUTS,
    TEXT_INPUT,
    TEXT_OUTPUT,
    check_prompt_bytes,
)

#: A tokenizer's decode: token ids to text.
Decode = Callable[[Sequence[int]], str]

__all__ = [
    "FINISH_REASON",
    "FINISH_REASONS",
    "INPUTS",
    "LOGPROBS",
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
    "converted",
    "join",
    "part",
    "prompt_text",
    "prompt_tokens",
]


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


def chat_template_file(options: Mapping[str, object], where: str) -> Path | None:
    """The Jinja chat template file an engine's [backend_options] `chat_template` names to
    replace the tokenizer's (vLLM's --chat-template), None when it names none; `where` prefixes
    the option's name in errors."""
    value = options.get("chat_template")
    if value is None:
        return None
    if not isinstance(value, str) or not Path(value).is_file():
        raise ConfigError(f"{where}chat_template {value!r} is not a file")
    return Path(value)


def chat_messages(text: str) -> list[dict[str, object]]:
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
    return [_message(m) for m in messages]


def _message(message: dict[str, object]) -> dict[str, object]:
    """A message as the chat template reads it: role and content, and the tool calls an
    assistant made or the id of the call a tool answers (OpenAI's fields)."""
    kept: dict[str, object] = {"role": message["role"], "content": message["content"]}
    if isinstance(message.get("tool_calls"), list):
        kept["tool_calls"] = message["tool_calls"]
    if isinstance(message.get("tool_call_id"), str):
        kept["tool_call_id"] = message["tool_call_id"]
    return kept


def converted(
    sampling: Sampling,
    text: str,
    tokenize: Callable[[str], list[int]],
    decode: Decode,
    vocab_size: int,
) -> StreamPart:
    """The one part of a tokenize or detokenize request (no generation step): the prompt's
    token ids as a JSON list, or the text of the JSON list of ids `text` holds."""
    if sampling.task == "tokenize":
        ids = tokenize(text)
        return part(json.dumps(ids), len(ids), 0, "stop")
    try:
        listed: object = json.loads(text)
    except json.JSONDecodeError:
        listed = None
    if not isinstance(listed, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in listed
    ):
        raise InvalidField("tokens", "tokens must be a list of token ids (integers >= 0)")
    unknown = [i for i in listed if i >= vocab_size]
    if unknown:  # a tokenizer decodes them as nothing, silently
        raise InvalidField(
            "tokens", f"token id {unknown[0]} is not in this model's vocabulary of {vocab_size}"
        )
    try:
        return part(decode(listed), len(listed), 0, "stop")
    except (IndexError, OverflowError, TypeError, ValueError) as exc:
        raise InvalidField("tokens", f"tokens are not this model's: {exc}") from None


def part(
    text: str,
    input_tokens: int,
    output_tokens: int,
    finish_reason: str | None = None,
    logprobs: str = "",
) -> StreamPart:
    """One streamed response: the new text and the counts so far; final with a finish reason."""
    outputs = {
        TEXT_OUTPUT: np.array([text.encode()], dtype=object),
        NUM_INPUT_TOKENS: np.array([input_tokens], dtype=np.uint32),
        NUM_OUTPUT_TOKENS: np.array([output_tokens], dtype=np.uint32),
    }
    if finish_reason is not None:
        outputs[FINISH_REASON] = np.array([finish_reason.encode()], dtype=object)
    parameters: dict[str, bool | int | float | str] = {LOGPROBS: logprobs} if logprobs else {}
    return StreamPart(outputs, parameters, final=finish_reason is not None)


def join(parts: Iterable[StreamPart]) -> StreamPart:
    """A whole answer from its streamed parts (text concatenated, last counts and reason)."""
    text: list[bytes] = []
    logprobs: list[object] = []
    last: StreamPart | None = None
    for each in parts:
        if TEXT_OUTPUT in each.outputs:
            text.append(bytes(each.outputs[TEXT_OUTPUT].reshape(-1)[0]))
        if NUM_OUTPUT_TOKENS in each.outputs:
            last = each
        logprobs.extend(json.loads(str(each.parameters.get(LOGPROBS, "[]"))))
    if last is None:
        raise InvalidInput("the generation ended before its first token")
    whole = dict(last.outputs)
    whole[TEXT_OUTPUT] = np.array([b"".join(text)], dtype=object)
    parameters = dict(last.parameters)
    if logprobs:
        parameters[LOGPROBS] = json.dumps(logprobs)
    return StreamPart(whole, parameters, final=True)


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
    its state for the metrics (running and waiting sequences, KV-cache use). The core calls
    `generate` with the request's settings typed, read once; `stream` (the protocol's, with
    parameters) is for callers that hold only a dict."""

    def engine_stats(self) -> EngineStats: ...

    def generate(
        self, request_id: str, inputs: Mapping[str, np.ndarray], sampling: Sampling
    ) -> AsyncIterator[StreamPart]: ...


@runtime_checkable
class AdapterHost(Protocol):
    """A generative engine that serves LoRA adapters of its model, each chosen per request by
    `Sampling.adapter` (docs/generative.md, "LoRA adapters")."""

    def load_adapter(self, name: str, folder: Path) -> None:
        """Read, check and place the adapter in `folder` under `name` (ConfigError,
        PermissionDenied or QueueFull when it cannot)."""
        ...

    def unload_adapter(self, name: str) -> None:
        """Free the adapter; none of its sequences runs any more."""
        ...


class StepGate(Protocol):
    """Paces an engine's steps by its device's scheduler (serving/qos/steps.py): each step
    takes a slot of the device, as a batch of a classic model does."""

    def step(self, rows: int) -> AbstractContextManager[None]:
        """Held around one engine step of `rows` sequences, on the engine's own thread: entering
        blocks until the device grants the step (at once while nobody there has [qos]); the
        slot is kept until the next step asks for its own, or `rest`."""
        ...

    def rest(self) -> None:
        """The engine has no step to run next: the last step's slot goes back now."""
        ...


@runtime_checkable
class PacedBackend(Protocol):
    """An engine whose steps the server can pace (`Capabilities.paces_steps`)."""

    def pace(self, gate: StepGate) -> None:
        """From now on, run each engine step inside `gate.step` (called once, after `load`)."""
        ...


@runtime_checkable
class PausableBackend(Protocol):
    """An engine whose steps run outside the server (vLLM's engine core, in its own process)
    but which stops between two steps when asked (`Capabilities.pauses_steps`): its device time
    is then leased from the device's scheduler (serving/qos/leases.py)."""

    async def pause(self) -> None:
        """Return once the step in flight has ended; no step runs until `resume`. Sequences
        (and their cache) are kept, and new ones wait."""
        ...

    async def resume(self) -> None:
        """Let the engine step again."""
        ...
