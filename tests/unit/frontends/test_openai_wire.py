"""The OpenAI frontend's reading of requests and writing of answers, without a server."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlscale.backends.generative.contract import part
from dlscale.errors import (
    DlscaleError,
    InvalidField,
    InvalidInput,
    NotFound,
    PermissionDenied,
    Unsupported,
)
from dlscale.frontends.rest.openai.decode import (
    MAX_MESSAGES,
    MAX_PROMPT_BYTES,
    chat_call,
    completion_call,
)
from dlscale.frontends.rest.openai.encode import DONE, Answer, Piece
from dlscale.frontends.rest.openai.errors import status_and_document
from dlscale.types import InferenceRequest, InferenceResponse


def _body(**fields: object) -> bytes:
    return json.dumps({"model": "llm", **fields}).encode()  # orjson stops at 64-bit integers


def test_a_completion_becomes_the_contracts_request() -> None:
    call = completion_call(
        _body(prompt="Hello", max_tokens=5, temperature=0, top_p=0.5, seed=7, stop=["\n", "."]),
        {"x-request-id": "abc"},
    )
    request = call.request
    assert request.model_name == "llm" and request.id == "abc" and not call.stream
    assert request.inputs["text_input"].tolist() == [b"Hello"]
    sampling = request.sampling  # typed here, once: the engine maps it
    assert sampling is not None and request.parameters == {}
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.seed) == (
        5,
        0.0,
        0.5,
        7,
    )
    assert sampling.stop == ("\n", ".") and sampling.input_format == "text"


def test_a_chat_sends_its_messages_for_the_engines_template() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": t} for t in ("Hi ", "!")]},
    ]
    call = chat_call(
        _body(messages=messages, max_tokens=3, max_completion_tokens=4, stop="x", stream=True),
        {},
    )
    sampling = call.request.sampling
    assert sampling is not None
    assert sampling.input_format == "chat" and sampling.max_tokens == 4  # the newer name wins
    sent = json.loads(call.request.inputs["text_input"][0])
    assert sent == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi !"}]
    assert sampling.stop == ("x",) and call.stream
    assert call.request.id  # a new id when the client sent none


def test_priority_and_timeout_are_the_queues() -> None:
    call = completion_call(_body(prompt="a", priority=1, timeout=5000), {})
    assert call.request.priority == 1 and call.request.timeout_us == 5000


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": True}, "top_p"),
        ({"seed": [1]}, "seed"),
        ({"stop": [1, 2]}, "stop"),
        ({"stream": "yes"}, "stream"),
        ({"n": 2}, "n"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ({"prompt": ["a", [1, 2]]}, "prompt"),  # strings and token ids mixed
        ({"prompt": [1.5, 2]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["a"] * 65}, "prompt"),  # more than MAX_PROMPTS
        ({"model": 3}, "model"),
        ({"model": ""}, "model"),
        ({"priority": "high"}, "priority"),
        ({"max_tokens": 10**300}, "max_tokens"),
        ({"seed": 2**64}, "seed"),
    ],
)
def test_a_field_of_the_wrong_type_is_named(fields: dict[str, object], param: str) -> None:
    doc = {"prompt": "a", **fields}
    with pytest.raises(InvalidField) as caught:
        completion_call(_body(**doc), {})
    status, body = status_and_document(caught.value, "llm")
    assert status == 400 and body["error"]["param"] == param
    assert body["error"]["type"] == "BadRequestError" and body["error"]["code"] == 400


@pytest.mark.parametrize(
    "fields",
    [{"echo": True}, {"best_of": 3}, {"presence_penalty": 0.5}, {"logit_bias": {"1": 2}}],
)
def test_what_is_not_implemented_is_a_400_naming_it(fields: dict[str, object]) -> None:
    # Not 501: the openai client retries a 5xx twice, then reports the server at fault.
    with pytest.raises(InvalidField, match=next(iter(fields))) as caught:
        completion_call(_body(prompt="a", **fields), {})
    assert caught.value.param == next(iter(fields))
    # Their defaults are accepted: clients send them.
    completion_call(_body(prompt="a", logprobs=None, echo=False, presence_penalty=0), {})


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"[1]",
        b'{"model": "llm", "prompt": "\xff"}',
        b"nul",
        b"[" * 100_000,
        b'{"model": "llm", "prompt": "p", "temperature": 1e400}',
    ],
)
def test_malformed_bodies_are_400(body: bytes) -> None:
    with pytest.raises(InvalidInput):
        completion_call(body, {})


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "hello",
        [{"role": "wizard", "content": "x"}],
        [{"role": "user", "content": 3}],
        [{"role": "user", "content": [{"type": "text", "text": 3}]}],
        ["user: hi"],
        [{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1),
    ],
)
def test_bad_messages_are_400(messages: object) -> None:
    with pytest.raises(InvalidField) as caught:
        chat_call(_body(messages=messages), {})
    assert caught.value.param.startswith("messages")


def test_images_are_a_400_naming_the_part() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    with pytest.raises(InvalidField, match="only text parts") as caught:
        chat_call(_body(messages=[{"role": "user", "content": [image]}]), {})
    assert caught.value.param == "messages[0].content"


def test_prompts_are_bounded_before_the_engine_sees_them() -> None:
    with pytest.raises(InvalidField, match=str(MAX_PROMPT_BYTES)):
        completion_call(_body(prompt="a" * (MAX_PROMPT_BYTES + 1)), {})
    big = [{"role": "user", "content": "a" * (MAX_PROMPT_BYTES // 2 + 1)}] * 2
    with pytest.raises(InvalidField, match=str(MAX_PROMPT_BYTES)):
        chat_call(_body(messages=big), {})


def test_a_client_request_id_is_bounded() -> None:
    assert len(completion_call(_body(prompt="a"), {"x-request-id": "i" * 5000}).request.id) == 128


def _response(text: str, tokens: int, reason: str | None = None) -> InferenceResponse:
    streamed = part(text, 4, tokens, reason)
    return InferenceResponse("llm", streamed.outputs)


def test_an_answer_joins_its_pieces_with_usage() -> None:
    answer = Answer("r1", "llm", chat=False)
    for response in (_response("He", 1), _response("llo", 2, "length")):
        answer.add(Piece.of(response))
    whole = answer.whole()
    assert whole["id"] == "cmpl-r1" and whole["object"] == "text_completion"
    assert whole["choices"] == [
        {"index": 0, "finish_reason": "length", "text": "Hello", "logprobs": None}
    ]
    assert whole["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}


def _events(chunks: list[bytes]) -> list[dict[str, object]]:
    out = []
    for chunk in chunks:
        assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n")
        out.append(json.loads(chunk[6:]))
    return out


def test_chat_chunks_name_the_role_first_and_end_with_usage() -> None:
    answer = Answer("r2", "llm", chat=True)
    chunks = [answer.chunk(None, include_usage=True, first=True)]
    for response in (_response("Hi", 1), _response("", 1, "stop")):
        piece = Piece.of(response)
        answer.add(piece)
        chunks.append(answer.chunk(piece, include_usage=True))
    chunks.append(answer.usage_chunk())
    events = _events(chunks)
    assert all(e["object"] == "chat.completion.chunk" and e["id"] == "chatcmpl-r2" for e in events)
    deltas = [e["choices"][0]["delta"] for e in events[:3]]  # type: ignore[index]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "Hi"}, {}]
    assert [e["choices"][0]["finish_reason"] for e in events[:3]] == [None, None, "stop"]  # type: ignore[index]
    assert [e["usage"] for e in events[:3]] == [None, None, None]
    assert events[3]["choices"] == [] and events[3]["usage"]["total_tokens"] == 5  # type: ignore[index]
    assert DONE == b"data: [DONE]\n\n"


def test_a_model_without_text_output_is_not_generative() -> None:
    with pytest.raises(InvalidInput, match="generative models only"):
        Piece.of(InferenceResponse("mlp", {"y": np.zeros(1)}))


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (NotFound("unknown model 'x'"), 404, "NotFoundError"),
        (PermissionDenied("restricted"), 401, "AuthenticationError"),
        (Unsupported("no"), 501, "NotImplementedError"),
        (InvalidInput("bad"), 400, "BadRequestError"),
    ],
)
def test_errors_take_openais_shape(error: DlscaleError, status: int, kind: str) -> None:
    got, doc = status_and_document(error, "x")
    assert got == status and doc["error"]["type"] == kind and doc["error"]["code"] == status
    if status == 404:
        assert doc["error"]["message"] == "The model `x` does not exist."


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_FIELDS = st.sampled_from(
    [
        "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
        "top_p", "seed", "stop", "n", "stream", "stream_options", "priority", "timeout",
        "ignore_eos", "logprobs", "response_format", "echo",
    ]
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_FIELDS, _JSON, max_size=6), st.booleans())
def test_any_json_is_read_or_refused_with_a_4xx(fields: dict[str, object], chat: bool) -> None:
    body = json.dumps(fields).encode()
    try:
        (chat_call if chat else completion_call)(body, {})
    except DlscaleError as exc:
        assert 400 <= exc.http_status < 500 or exc.http_status == 501


def test_prompts_as_vllm_takes_them_are_one_request_each() -> None:
    texts = completion_call(_body(prompt=["a", "b"]), {}).requests
    assert [bytes(r.inputs["text_input"][0]) for r in texts] == [b"a", b"b"]
    assert {_format(r) for r in texts} == {"text"}
    [ids] = completion_call(_body(prompt=[1, 2, 3]), {}).requests
    assert bytes(ids.inputs["text_input"][0]) == b"[1, 2, 3]"
    assert _format(ids) == "tokens"
    lists = completion_call(_body(prompt=[[1], [2, 3]]), {}).requests
    assert [_format(r) for r in lists] == ["tokens", "tokens"]


def _format(request: InferenceRequest) -> str:
    """How the engine reads the request's `text_input` (its typed settings say)."""
    assert request.sampling is not None
    return request.sampling.input_format
