"""The tensor names of a generative model, as every frontend, engine and bench reads them.

Triton's vLLM-backend signature (shared/reference/generative.md), so that Triton users'
clients work unchanged: one BYTES input `text_input`, and per streamed response `text_output`
(the new text), `num_input_tokens`, `num_output_tokens` (generated so far) and, on the final
response, `finish_reason`. What the engines do with them is backends/generative/contract.py.
"""

from __future__ import annotations

from dlscale.types import Datatype, TensorSpec

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
FINISH_REASON = "finish_reason"
NUM_INPUT_TOKENS = "num_input_tokens"
NUM_OUTPUT_TOKENS = "num_output_tokens"

#: The signature every generative model reports (no batch dim: engines batch themselves).
INPUTS = (TensorSpec(TEXT_INPUT, Datatype.BYTES, (1,)),)
OUTPUTS = (
    TensorSpec(TEXT_OUTPUT, Datatype.BYTES, (1,)),
    TensorSpec(FINISH_REASON, Datatype.BYTES, (1,)),
    TensorSpec(NUM_INPUT_TOKENS, Datatype.UINT32, (1,)),
    TensorSpec(NUM_OUTPUT_TOKENS, Datatype.UINT32, (1,)),
)
#: Why a sequence ended, in OpenAI's words: its stop string or end token, its max_tokens,
#: or the server ended it (cancelled, disconnected, deadline).
FINISH_REASONS = ("stop", "length", "abort")


def signature_toml() -> str:
    """The generative signature as config.toml's [[inputs]] and [[outputs]] tables, for a
    Python model that streams by this contract (its config must declare its tensors)."""
    tables = [("inputs", spec) for spec in INPUTS] + [("outputs", spec) for spec in OUTPUTS]
    return "".join(
        f'[[{kind}]]\nname = "{s.name}"\ndatatype = "{s.datatype.value}"\nshape = {list(s.shape)}\n'
        for kind, s in tables
    )
