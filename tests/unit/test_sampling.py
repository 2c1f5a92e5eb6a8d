"""The typed generation settings: every bound checked where a Sampling is built, each refusal
naming its field; an OIP request's parameters read once into one."""

from __future__ import annotations

import pytest

from dlscale.errors import InvalidField
from dlscale.sampling import MAX_LOGPROBS, Guide, Sampling


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_tokens": 17}, "min_tokens"),  # above the default max_tokens, 16
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"seed": -1}, "seed"),
        ({"logprobs": MAX_LOGPROBS + 1}, "logprobs"),
        ({"input_format": "xml"}, "input_format"),
        ({"stop": ("",)}, "stop"),
        ({"stop": ("x",) * 17}, "stop"),
    ],
)
def test_each_bound_names_its_field(fields: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidField) as caught:
        Sampling(**fields)  # type: ignore[arg-type]
    assert caught.value.param == param and caught.value.http_status == 400


def test_a_guide_is_a_known_kind_with_a_schema() -> None:
    assert Guide("json_object").json_schema == '{"type": "object"}'
    with pytest.raises(InvalidField, match="unknown response_format"):
        Guide("yaml")
    with pytest.raises(InvalidField) as caught:
        Guide("json_schema")
    assert caught.value.param == "response_format.json_schema"


def test_oip_parameters_are_read_once_into_the_same_settings() -> None:
    parameters = {
        "max_tokens": 8,
        "temperature": 0.5,
        "top_k": 4,
        "min_tokens": 2,
        "repetition_penalty": 1.2,
        "stop": '["\\n"]',
        "logprobs": 3,
    }
    sampling = Sampling.from_parameters(parameters)
    assert sampling == Sampling(
        max_tokens=8,
        temperature=0.5,
        top_k=4,
        min_tokens=2,
        repetition_penalty=1.2,
        stop=("\n",),
        logprobs=3,
    )
    # Written back for a Python model (Triton's contract), it reads the same.
    assert Sampling.from_parameters(sampling.as_parameters()) == sampling
    assert Sampling.from_parameters({"top_k": -1}).top_k == 0  # vLLM's "every token"


def test_packed_sampling_parameters_are_read_too() -> None:
    sampling = Sampling.from_parameters({"sampling_parameters": '{"max_tokens": 3, "top_k": 2}'})
    assert (sampling.max_tokens, sampling.top_k) == (3, 2)
    with pytest.raises(InvalidField) as caught:
        Sampling.from_parameters({"top_k": "many"})
    assert caught.value.param == "top_k"


def test_a_field_error_crosses_processes_whole() -> None:
    import pickle

    again = pickle.loads(pickle.dumps(InvalidField("top_k", "top_k must be at least 0")))
    assert isinstance(again, InvalidField) and again.param == "top_k"
    assert str(again) == "top_k must be at least 0"
