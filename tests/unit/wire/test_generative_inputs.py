"""Triton vLLM clients' optional inputs become request parameters, each checked for its form."""

from __future__ import annotations

import numpy as np
import pytest

from dlscale.errors import InvalidInput
from dlscale.wire.generative import lift_optional_inputs

TEXT = {"text_input": np.array([b"hi"], dtype=object)}


def test_each_optional_input_becomes_its_parameter_and_wins_over_one() -> None:
    inputs = {
        **TEXT,
        "stream": np.array([False]),
        "sampling_parameters": np.array([b'{"max_tokens": "4"}'], dtype=object),
        "exclude_input_in_output": np.array([[True]]),
    }
    kept, parameters = lift_optional_inputs(inputs, {"stream": True, "seed": 1}, set())
    assert list(kept) == ["text_input"]
    assert parameters == {
        "stream": False,
        "seed": 1,
        "sampling_parameters": '{"max_tokens": "4"}',
        "exclude_input_in_output": True,
    }


def test_an_input_the_model_declares_is_left_to_it() -> None:
    inputs = {**TEXT, "stream": np.array([True])}
    kept, parameters = lift_optional_inputs(inputs, {}, {"text_input", "stream"})
    assert set(kept) == {"text_input", "stream"} and parameters == {}


@pytest.mark.parametrize(
    ("name", "array", "said"),
    [
        ("stream", np.array([True, False]), "one BOOL element, not 2 of BOOL"),
        ("stream", np.array([1], dtype=np.int32), "one BOOL element, not 1 of INT32"),
        ("sampling_parameters", np.array([b"\xff"], dtype=object), "is not UTF-8"),
    ],
)
def test_a_malformed_input_is_refused_naming_it(name: str, array: np.ndarray, said: str) -> None:
    with pytest.raises(InvalidInput, match=said) as refused:
        lift_optional_inputs({**TEXT, name: array}, {}, set())
    assert refused.value.param == name
