"""The generative contract: sampling settings are read and bounded in one place."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dlscale.backends.generative.contract import (
    FINISH_REASON,
    MAX_MESSAGES,
    NUM_OUTPUT_TOKENS,
    TEXT_INPUT,
    TEXT_OUTPUT,
    Sampling,
    chat_messages,
    join,
    part,
    prompt_text,
)
from dlscale.errors import InvalidInput
from dlscale.wire.generative import MAX_BYTES_PER_TOKEN


def test_defaults_and_settings_from_parameters() -> None:
    assert Sampling.from_parameters({}) == Sampling()
    s = Sampling.from_parameters(
        {"max_tokens": 8, "temperature": 0, "top_p": 0.5, "seed": 3, "stop": '["a", "b"]'}
    )
    assert (s.max_tokens, s.greedy, s.top_p, s.seed, s.stop) == (8, True, 0.5, 3, ("a", "b"))


def test_triton_vllm_sampling_parameters_are_unpacked() -> None:
    s = Sampling.from_parameters({"sampling_parameters": '{"max_tokens": 4, "ignore_eos": true}'})
    assert s.max_tokens == 4 and s.ignore_eos


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"seed": -2}, "seed"),
        ({"stop": "x" * 300}, "stop"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"sampling_parameters": "{"}, "sampling_parameters"),
        ({"input_format": "xml"}, "input_format"),
    ],
)
def test_bad_settings_name_the_field(parameters: dict[str, object], named: str) -> None:
    with pytest.raises(InvalidInput, match=named):
        Sampling.from_parameters(parameters)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["max_tokens", "seed", "temperature", "top_p"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_and_huge_settings_name_the_field(name: str, value: str) -> None:
    # As gRPC double parameters and as Triton's JSON sampling_parameters (which reads NaN,
    # Infinity and 1e400, an infinity) carry them; int() of any of them used to raise.
    packed = f'{{"{name}": {value}}}'
    for parameters in ({name: float(value)}, {"sampling_parameters": packed}):
        with pytest.raises(InvalidInput, match=name):
            Sampling.from_parameters(parameters)


def test_a_prompt_too_long_in_bytes_for_the_context_is_refused_unread() -> None:
    context = 16
    fits = "a" * (context * MAX_BYTES_PER_TOKEN)
    assert prompt_text({TEXT_INPUT: np.array([fits.encode()], dtype=object)}, context) == fits
    beyond = np.array([(fits + "é").encode()], dtype=object)  # 2 bytes, one character
    with pytest.raises(InvalidInput, match=f"at most {context * MAX_BYTES_PER_TOKEN} bytes"):
        prompt_text({TEXT_INPUT: beyond}, context)


def test_a_chat_has_at_most_max_messages() -> None:
    message = {"role": "user", "content": ""}
    assert len(chat_messages(json.dumps([message] * MAX_MESSAGES))) == MAX_MESSAGES
    with pytest.raises(InvalidInput, match=f"at most {MAX_MESSAGES} messages"):
        chat_messages(json.dumps([message] * (MAX_MESSAGES + 1)))


def test_prompt_and_chat_messages() -> None:
    assert prompt_text({TEXT_INPUT: np.array([b"hi"], dtype=object)}) == "hi"
    with pytest.raises(InvalidInput, match="one text_input"):
        prompt_text({TEXT_INPUT: np.array([b"a", b"b"], dtype=object)})
    with pytest.raises(InvalidInput, match="UTF-8"):
        prompt_text({TEXT_INPUT: np.array([b"\xff"], dtype=object)})
    assert chat_messages('[{"role": "user", "content": "x"}]') == [{"role": "user", "content": "x"}]
    with pytest.raises(InvalidInput, match="role"):
        chat_messages('[{"role": 1}]')


def test_join_concatenates_text_and_keeps_last_counts() -> None:
    whole = join([part("he", 3, 1), part("llo", 3, 2), part("", 3, 2, "length")])
    assert whole.final
    assert whole.outputs[TEXT_OUTPUT][0] == b"hello"
    assert int(whole.outputs[NUM_OUTPUT_TOKENS][0]) == 2
    assert whole.outputs[FINISH_REASON][0] == b"length"
