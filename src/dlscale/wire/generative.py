"""The tensor names of a generative model, as every frontend, engine and bench reads them.

Triton's vLLM-backend signature (shared/reference/generative.md), so that Triton users'
clients work unchanged: one BYTES input `text_input`, and per streamed response `text_output`
(the new text), `num_input_tokens`, `num_output_tokens` (generated so far) and, on the final
response, `finish_reason`. What the engines do with them is backends/generative/contract.py.
The bounds on a prompt that every route shares live here too (the OpenAI frontend reads them).
"""

from __future__ import annotations

from collections.abc import Mapping, Set

import numpy as np

from dlscale.errors import InvalidInput
from dlscale.types import Datatype, Parameter, TensorSpec

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
FINISH_REASON = "finish_reason"
NUM_INPUT_TOKENS = "num_input_tokens"
NUM_OUTPUT_TOKENS = "num_output_tokens"
#: The response parameter that holds the new tokens' log-probabilities, when they were asked
#: for: a JSON list of `[token, logprob, [[alternative, logprob], ...]]`, one per token.
LOGPROBS = "logprobs"

#: The signature every generative model reports (no batch dim: engines batch themselves).
INPUTS = (TensorSpec(TEXT_INPUT, Datatype.BYTES, (1,)),)
OUTPUTS = (
    TensorSpec(TEXT_OUTPUT, Datatype.BYTES, (1,)),
    TensorSpec(FINISH_REASON, Datatype.BYTES, (1,)),
    TensorSpec(NUM_INPUT_TOKENS, Datatype.UINT32, (1,)),
    TensorSpec(NUM_OUTPUT_TOKENS, Datatype.UINT32, (1,)),
)
#: Inputs of Triton vLLM-backend clients beside `text_input` (its tutorial's client sends all
#: three): whether to stream, the sampling settings as one JSON object, and whether to leave the
#: prompt out of the text. Each is optional and means the request parameter of its name, so a
#: generative model takes them whatever its engine (lifted before the request is validated).
STREAM = "stream"
SAMPLING_PARAMETERS = "sampling_parameters"
EXCLUDE_INPUT_IN_OUTPUT = "exclude_input_in_output"
OPTIONAL_INPUTS = (
    TensorSpec(STREAM, Datatype.BOOL, (1,)),
    TensorSpec(SAMPLING_PARAMETERS, Datatype.BYTES, (1,)),
    TensorSpec(EXCLUDE_INPUT_IN_OUTPUT, Datatype.BOOL, (1,)),
)
#: Why a sequence ended, in OpenAI's words: its stop string or end token, its max_tokens,
#: or the server ended it (cancelled, disconnected, deadline).
FINISH_REASONS = ("stop", "length", "abort")

#: The most bytes of text this server lets one token stand for, on average over a prompt. Text
#: averages about 4 UTF-8 bytes a token; only a prompt made of a vocabulary's very longest tokens
#: (runs of spaces) could average more, and such a prompt is refused. So a prompt (or a chat's
#: messages, as the JSON that carries them) of more than `context * MAX_BYTES_PER_TOKEN` bytes
#: cannot fit in the model's context, and is refused before it is rendered or tokenized.
MAX_BYTES_PER_TOKEN = 32
#: Chat messages one request may hold, on every route that takes them (OpenAI's and OIP's).
MAX_MESSAGES = 1024


def check_prompt_bytes(size: int, context: int) -> None:
    """Refuse (InvalidInput, the context-length error) a prompt of `size` UTF-8 bytes that
    cannot fit in `context` tokens: the one byte bound every route shares, checked before any
    tokenizing, so that a huge prompt costs no more than reading it."""
    most = context * MAX_BYTES_PER_TOKEN
    if size > most:
        raise InvalidInput(
            f"the prompt is {size} bytes; this model's context is {context} tokens and this "
            f"server counts at most {MAX_BYTES_PER_TOKEN} bytes a token, so a prompt may have at "
            f"most {most} bytes (max_bytes_per_token): refused before tokenizing"
        )


def signature_toml() -> str:
    """The generative signature as config.toml's [[inputs]] and [[outputs]] tables, for a
    Python model that streams by this contract (its config must declare its tensors)."""
    tables = [("inputs", spec) for spec in INPUTS] + [("outputs", spec) for spec in OUTPUTS]
    return "".join(
        f'[[{kind}]]\nname = "{s.name}"\ndatatype = "{s.datatype.value}"\nshape = {list(s.shape)}\n'
        for kind, s in tables
    )


def lift_optional_inputs(
    inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Parameter], declared: Set[str]
) -> tuple[dict[str, np.ndarray], dict[str, Parameter]]:
    """The request with each optional input (OPTIONAL_INPUTS) the model does not declare
    itself turned into the request parameter of its name (the tensor wins over a parameter of
    the same name); InvalidInput naming the input when it is not one element of its type."""
    kept, lifted = dict(inputs), dict(parameters)
    for spec in OPTIONAL_INPUTS:
        array = kept.get(spec.name)
        if array is None or spec.name in declared:
            continue
        del kept[spec.name]
        if array.size != 1 or Datatype.from_numpy(array.dtype) is not spec.datatype:
            raise InvalidInput(
                f"input {spec.name!r} is one {spec.datatype.value} element, not "
                f"{array.size} of {Datatype.from_numpy(array.dtype).value}",
                spec.name,
            )
        value = array.reshape(-1)[0]
        if spec.datatype is Datatype.BOOL:
            lifted[spec.name] = bool(value)
        else:
            try:
                lifted[spec.name] = value.decode() if isinstance(value, bytes) else str(value)
            except UnicodeDecodeError:
                raise InvalidInput(f"input {spec.name!r} is not UTF-8", spec.name) from None
    return kept, lifted
