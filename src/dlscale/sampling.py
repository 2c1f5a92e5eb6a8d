"""How to generate: one typed `Sampling` per request, its bounds checked in one place.

A frontend builds it once: the OpenAI decoder from its JSON fields, or the core from an Open
Inference Protocol request's parameters (`Sampling.from_parameters`, the one reader of that
dict). The core passes it typed to the engine, which maps it to its own settings and never
reads the parameters again. Every bound is checked in `__post_init__`, so that a `Sampling`
that exists is valid, whoever built it; each refusal is an `InvalidField` naming the field by
its OpenAI name (docs/openai.md).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from dlscale.errors import InvalidField

#: Bounds on what a client may ask, checked before anything reaches an engine.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_TOKENS_DEFAULT = 16
MAX_SEED = 2**63 - 1
#: Alternatives a token's log-probability may list: vLLM's default `max_logprobs`, and
#: OpenAI's bound on `top_logprobs`.
MAX_LOGPROBS = 20
#: vLLM takes any positive penalty; above this one a model says nothing useful.
MAX_REPETITION_PENALTY = 10.0
#: What a request asks of a generative model: text, or its prompt's token ids (vLLM's
#: `/tokenize`), or the text of token ids (`/detokenize`), without a generation step.
TASKS = ("generate", "tokenize", "detokenize")
#: What `text_input` holds: the prompt, chat messages (JSON), or the prompt's token ids (JSON).
INPUT_FORMATS = ("text", "chat", "tokens")
#: Triton vLLM clients' settings: a JSON object in one string (a parameter or a BYTES input).
PACKED = "sampling_parameters"
#: The kinds of structured output (OpenAI's response_format types besides "text").
GUIDE_KINDS = ("json_object", "json_schema")


@dataclass(frozen=True)
class Guide:
    """Structured output: the text must be JSON (an object), or match a JSON schema."""

    kind: str
    #: The schema as JSON text ("" for json_object: any object).
    schema: str = ""

    def __post_init__(self) -> None:
        if self.kind not in GUIDE_KINDS:
            raise InvalidField("response_format.type", f"unknown response_format {self.kind!r}")
        if self.kind == "json_schema" and not self.schema:
            raise InvalidField("response_format.json_schema", "json_schema needs a schema")

    @property
    def json_schema(self) -> str:
        """The schema the engine's grammar follows: any object for json_object."""
        return self.schema or '{"type": "object"}'


@dataclass(frozen=True)
class Sampling:
    """How to generate one answer: the request's settings, valid once built."""

    max_tokens: int = MAX_TOKENS_DEFAULT
    #: 0 is greedy decoding.
    temperature: float = 1.0
    top_p: float = 1.0
    #: Draw among the k most likely tokens only; 0 keeps them all.
    top_k: int = 0
    #: The end token is held back until this many tokens are generated.
    min_tokens: int = 0
    #: Above 1, tokens already in the prompt or the answer become less likely (vLLM's).
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    #: "text": `text_input` is the prompt; "chat": a JSON list of {role, content} messages;
    #: "tokens": a JSON list of the prompt's token ids (OpenAI's `prompt: [1, 2, 3]`).
    input_format: str = "text"
    #: Log-probabilities to report: None for none, N for the chosen token's and N more.
    logprobs: int | None = None
    guide: Guide | None = None
    #: OpenAI's `tools` as JSON, for the chat template to render ("" for none).
    tools: str = ""
    #: One of TASKS.
    task: str = "generate"
    #: The LoRA adapter that answers ("" for the base model): set by the server from the model
    #: a request names (an adapter's), never read from a request's parameters.
    adapter: str = ""

    def __post_init__(self) -> None:
        _bounded("max_tokens", self.max_tokens, 1)
        _bounded("temperature", self.temperature, 0.0, 2.0)
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidField("top_p", f"top_p must be above 0 and at most 1, not {self.top_p}")
        _bounded("top_k", self.top_k, 0)
        _bounded("min_tokens", self.min_tokens, 0, self.max_tokens)
        if not 0.0 < self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise InvalidField(
                "repetition_penalty",
                f"repetition_penalty must be above 0 and at most {MAX_REPETITION_PENALTY}, "
                f"not {self.repetition_penalty}",
            )
        _bounded("seed", self.seed, 0, MAX_SEED)
        _bounded("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        if self.task not in TASKS:
            raise InvalidField("task", f"task must be one of {', '.join(TASKS)}, not {self.task!r}")
        if self.input_format not in INPUT_FORMATS:
            raise InvalidField(
                "input_format",
                f"input_format must be one of {', '.join(INPUT_FORMATS)}, "
                f"not {self.input_format!r}",
            )
        if len(self.stop) > MAX_STOP_STRINGS or any(
            not s or len(s) > MAX_STOP_CHARS for s in self.stop
        ):
            raise InvalidField(
                "stop",
                f"stop takes at most {MAX_STOP_STRINGS} strings of 1 to {MAX_STOP_CHARS} "
                "characters",
            )

    @property
    def greedy(self) -> bool:
        """Whether the most likely token is always taken (temperature 0)."""
        return self.temperature == 0.0

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, object]) -> Sampling:
        """The settings an OIP request's parameters name (Triton vLLM clients may pack them
        in a JSON `sampling_parameters` string); InvalidField naming the field otherwise."""
        merged: dict[str, object] = dict(parameters)
        packed = merged.pop(PACKED, None)
        if packed is not None:
            merged.update(_unpack(packed))
        seed = merged.get("seed")
        logprobs = merged.get("logprobs")
        return cls(
            max_tokens=_integer(merged, "max_tokens", MAX_TOKENS_DEFAULT),
            temperature=_number(merged, "temperature", 1.0),
            top_p=_number(merged, "top_p", 1.0),
            top_k=max(0, _integer(merged, "top_k", 0)),  # vLLM's -1 means "all" too
            min_tokens=_integer(merged, "min_tokens", 0),
            repetition_penalty=_number(merged, "repetition_penalty", 1.0),
            seed=None if seed is None else _integer(merged, "seed", 0),
            stop=_stop_strings(merged.get("stop")),
            ignore_eos=_flag(merged, "ignore_eos"),
            input_format=str(merged.get("input_format", "text")),
            task=str(merged.get("task", "generate")),
            logprobs=None if logprobs is None else _integer(merged, "logprobs", 0),
        )

    def as_parameters(self) -> dict[str, bool | int | float | str]:
        """The settings that differ from the defaults, as request parameters: what a Python
        model (Triton's contract: it reads its parameters) is given."""
        out: dict[str, bool | int | float | str] = {}
        for each in fields(self):
            value = getattr(self, each.name)
            if each.name in ("guide", "tools", "adapter") or value is None:
                continue
            if value != each.default or each.name == "max_tokens":
                out[each.name] = json.dumps(list(value)) if each.name == "stop" else value
        return out


def _bounded(name: str, value: float | None, low: float, high: float | None = None) -> None:
    """An InvalidField unless `value` is within the bounds, or None (not asked for)."""
    if value is not None and (value < low or (high is not None and value > high)):
        bound = f"at least {low}" if high is None else f"between {low} and {high}"
        raise InvalidField(name, f"{name} must be {bound}, not {value}")


def _unpack(packed: object) -> dict[str, object]:
    """Triton vLLM clients' `sampling_parameters`: a JSON object in a string parameter."""
    try:
        value = json.loads(packed) if isinstance(packed, str | bytes) else None
    except json.JSONDecodeError as exc:
        raise InvalidField(PACKED, f"sampling_parameters is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidField(PACKED, "sampling_parameters must be a JSON object")
    return value


def _from_text(value: object, kind: type[int] | type[float]) -> object:
    """A number written as a string, as Triton's vLLM clients send every setting
    (`{"max_tokens": "100"}`, parameters of type string): read as its number."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return kind(value.strip())
    return value


def _integer(values: Mapping[str, object], name: str, default: int) -> int:
    value = _from_text(values.get(name, default), int)
    # NaN and the infinities (JSON's 1e400 reads as one) are no integer: int() would raise.
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidField(name, f"{name} must be an integer, not {value!r}")
    return value


def _number(values: Mapping[str, object], name: str, default: float) -> float:
    value = _from_text(values.get(name, default), float)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidField(name, f"{name} must be a number, not {value!r}")
    return float(value)


def _flag(values: Mapping[str, object], name: str) -> bool:
    value = values.get(name, False)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"  # a Triton vLLM client's string
    if not isinstance(value, bool):
        raise InvalidField(name, f"{name} must be true or false, not {value!r}")
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
        raise InvalidField("stop", "stop must be a string or a list of strings")
    return tuple(strings)
