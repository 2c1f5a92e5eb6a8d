"""Property-based fuzzing of the streamed-answer routes (hypothesis), bounded to a few seconds.

Whatever JSON a client sends to Triton's generate extension (`/generate`, `/generate_stream`) or
to the OpenAI routes, the server answers with a 4xx (or, once a stream has begun, an error
event), never a 5xx; whatever requests a gRPC ModelStreamInfer stream carries, each gets its
answers or its error in the stream, which ends cleanly; and the next good request is answered
correctly. The settings drawn include NaN, infinities, 1e400 and integers beyond 64 bits (in a
JSON body, in Triton's JSON `sampling_parameters`, as gRPC doubles), and prompts up to twice the
body limit; explicit cases pin each non-finite value of each numeric setting. The models are the
streaming Python models of tests/toolkit/streaming_models.py (a generative one, a Triton
decoupled one, one that answers once).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.toolkit.fuzz import JSON_VALUES, bounded
from tests.toolkit.server import LocalServer, serving
from tests.toolkit.streaming_models import streaming_repository
from tritonclient.grpc import service_pb2

#: A couple of hundred examples a route and no per-example deadline: seconds, not minutes.
FUZZ = bounded(150)
MODELS = ["echo", "repeat", "plain", "missing"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    repo = streaming_repository(tmp_path_factory.mktemp("fuzz-generate"))
    with serving(repo, max_body_bytes=2**20) as running:
        yield running


@pytest.fixture(scope="module")
def http(server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def channel(server: LocalServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_url) as opened:
        yield opened


_json = JSON_VALUES
#: The sampling settings the core reads as numbers.
NUMERIC = ["max_tokens", "seed", "temperature", "top_p"]
#: Numbers where a setting is read: non-finite, huge, beyond 64 bits (a REST body's JSON cannot
#: say NaN or Infinity: those bodies are refused whole).
_numbers = (
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, 2**64, -(2**63) - 1]) | st.floats()
)
#: JSON texts of a value, with what Python's json reads and orjson does not: NaN, 1e400.
_literals = (
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
    | _numbers.map(json.dumps)
    | _json.map(json.dumps)
)
#: Triton's vLLM clients' `sampling_parameters`: a JSON object in a string.
_packed = st.dictionaries(st.sampled_from(NUMERIC), _literals, max_size=3).map(
    lambda d: "{" + ", ".join(f'"{k}": {v}' for k, v in d.items()) + "}"
)
#: Prompts up to twice the fuzz server's body limit, of many words.
_huge = st.integers(1, 2**21).map(lambda n: "a " * (n // 2) + "a")
#: The sampling settings and Triton's own keys, with any JSON for their values.
_settings = st.dictionaries(
    st.sampled_from(
        [
            "max_tokens",
            "temperature",
            "top_p",
            "seed",
            "stop",
            "ignore_eos",
            "input_format",
            "sampling_parameters",
            "priority",
            "timeout",
            "stream",
            "COUNT",
            "text_input",
        ]
    ),
    _json | _numbers,
    max_size=4,
) | st.fixed_dictionaries({"sampling_parameters": _packed})
_generate = st.fixed_dictionaries(
    {},
    optional={
        "text_input": _json | st.text(max_size=40) | _huge,
        "id": _json,
        "parameters": _settings | _json,
        "max_tokens": _json,
        "COUNT": _json,
    },
)
_openai = st.fixed_dictionaries(
    {"model": st.sampled_from(MODELS) | _json},
    optional={
        "prompt": _json | st.text(max_size=40) | _huge,
        "messages": st.lists(
            st.fixed_dictionaries({"role": _json | st.just("user"), "content": _json}),
            max_size=3,
        )
        | st.integers(0, 3000).map(lambda n: [{"role": "user", "content": "hi"}] * n)
        | _json,
        "stream": _json,
        "stream_options": _json,
        "max_tokens": _json | _numbers,
        "n": _json,
        "stop": _json,
        "temperature": _json | _numbers,
        "seed": _json | _numbers,
    },
)


def _events(response: httpx.Response) -> list[str]:
    return [line for line in response.iter_lines() if line.startswith("data:")]


def _good(http: httpx.Client) -> None:
    body = {"text_input": "one two three", "parameters": {"max_tokens": 2}}
    response = http.post("/v2/models/echo/generate", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["text_output"] == "one two"


def _sent(http: httpx.Client, path: str, body: bytes) -> None:
    """A request whose answer must be a client error or an answer, streamed or not."""
    with http.stream("POST", path, content=body) as response:
        # 501: a valid OpenAI request for what this server does not do (image parts, n > 1...),
        # as vLLM answers it (docs/openai.md); any other 5xx is the server's fault.
        assert response.status_code < 500 or response.status_code == 501, response.read()
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            for event in _events(response):  # a stream that fails says so in an event
                if event.strip() != "data: [DONE]":
                    json.loads(event[5:])
        elif response.status_code >= 400:
            assert json.loads(response.read())["error"]


@FUZZ
@given(
    doc=_generate,
    model=st.sampled_from(MODELS),
    route=st.sampled_from(["generate", "generate_stream"]),
    tail=st.binary(max_size=16),
)
def test_generate_answers_any_request_with_a_client_error(
    http: httpx.Client, doc: dict[str, Any], model: str, route: str, tail: bytes
) -> None:
    _sent(http, f"/v2/models/{model}/{route}", json.dumps(doc).encode() + tail)
    _good(http)


@FUZZ
@given(
    settings=_settings,
    route=st.sampled_from(["generate", "generate_stream"]),
    prompt=st.text(min_size=1, max_size=40) | _huge,
)
def test_generate_answers_any_settings_of_a_good_prompt_or_refuses_them(
    http: httpx.Client, settings: dict[str, Any], route: str, prompt: str
) -> None:
    # A prompt the model takes, so that every drawn setting reaches the sampling rules.
    body = json.dumps({"text_input": prompt, "parameters": settings}).encode()
    _sent(http, f"/v2/models/echo/{route}", body)
    _good(http)


@FUZZ
@given(
    doc=_openai,
    route=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
    tail=st.binary(max_size=16),
)
def test_openai_answers_any_request_with_a_client_error(
    http: httpx.Client, doc: dict[str, Any], route: str, tail: bytes
) -> None:
    _sent(http, route, json.dumps(doc).encode() + tail)
    _good(http)


_param = st.one_of(
    st.booleans().map(lambda v: ("bool_param", v)),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: ("int64_param", v)),
    st.text(max_size=12).map(lambda v: ("string_param", v)),
    _numbers.map(lambda v: ("double_param", float(v))),
)
_stream_request = st.fixed_dictionaries(
    {
        "model": st.sampled_from(MODELS),
        "name": st.sampled_from(["text_input", "IN", "COUNT", "x"]),
        "datatype": st.sampled_from(["BYTES", "INT32", "FP32", "UINT8"]) | st.text(max_size=4),
        "shape": st.lists(st.integers(-1, 3), max_size=3),
        "params": st.dictionaries(
            st.sampled_from(
                ["max_tokens", "temperature", "top_p", "stop", "seed", "priority", "timeout",
                 "triton_enable_empty_final_response", "sampling_parameters"]
            ),
            _param,
            max_size=3,
        ),
    },
    optional={"bytes": st.lists(st.binary(max_size=12), max_size=3), "raw": st.binary(max_size=16)},
)  # fmt: skip


def _stream_message(r: dict[str, Any]) -> Any:
    message = service_pb2.ModelInferRequest(model_name=r["model"])
    for key, (field, value) in r["params"].items():
        setattr(message.parameters[key], field, value)
    entry = message.inputs.add(name=r["name"], datatype=r["datatype"], shape=r["shape"])
    entry.contents.bytes_contents.extend(r.get("bytes", []))
    if "raw" in r:
        message.raw_input_contents.append(r["raw"])
    return message


def _stream(channel: grpc.Channel, messages: list[Any]) -> list[Any]:
    call = channel.stream_stream(
        "/inference.GRPCInferenceService/ModelStreamInfer",
        request_serializer=service_pb2.ModelInferRequest.SerializeToString,
        response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
    )
    return list(call(iter(messages), timeout=30))


def _good_stream(channel: grpc.Channel) -> None:
    message = service_pb2.ModelInferRequest(model_name="echo")
    message.parameters["max_tokens"].int64_param = 2
    entry = message.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    entry.contents.bytes_contents.append(b"one two three")
    answers = _stream(channel, [message])
    assert [a.error_message for a in answers] == ["", ""]
    text = [a.infer_response.outputs[0] for a in answers]
    assert text and all(t.name for t in text)


@FUZZ
@given(requests=st.lists(_stream_request, min_size=1, max_size=3))
def test_a_grpc_stream_answers_any_requests_in_the_stream(
    channel: grpc.Channel, requests: list[dict[str, Any]]
) -> None:
    answers = _stream(channel, [_stream_message(r) for r in requests])
    for answer in answers:  # an error is the request's, said in the stream
        assert answer.error_message or answer.HasField("infer_response")
        assert not answer.error_message.startswith("internal error"), answer.error_message
    _good_stream(channel)


def _infer(channel: grpc.Channel, message: Any) -> Any:
    call = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=service_pb2.ModelInferRequest.SerializeToString,
        response_deserializer=service_pb2.ModelInferResponse.FromString,
    )
    return call(message, timeout=30)


@FUZZ
@given(params=st.dictionaries(st.sampled_from(NUMERIC), _param, min_size=1, max_size=3))
def test_grpc_infer_answers_any_settings_or_refuses_them_as_invalid(
    channel: grpc.Channel, params: dict[str, tuple[str, Any]]
) -> None:
    message = _stream_message(
        {"model": "echo", "name": "text_input", "datatype": "BYTES", "shape": [1],
         "params": params, "bytes": [b"one two"]}
    )  # fmt: skip
    try:
        _infer(channel, message)
    except grpc.RpcError as refused:
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.details()
    _good_stream(channel)


#: Non-finite and huge numbers as a JSON text says them (Python's json reads them all).
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400"]


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("name", NUMERIC)
def test_non_finite_settings_in_sampling_parameters_are_a_400_naming_them(
    http: httpx.Client, name: str, value: str
) -> None:
    # Before: max_tokens and seed answered 500 "cannot convert float NaN to integer".
    body = {
        "text_input": "one two",
        "parameters": {"sampling_parameters": f'{{"{name}": {value}}}'},
    }
    for route in ("generate", "generate_stream"):
        response = http.post(f"/v2/models/echo/{route}", json=body)
        assert response.status_code == 400, response.text
        assert name in response.json()["error"]
    _good(http)


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("name", NUMERIC)
def test_non_finite_settings_in_a_json_body_are_a_400(
    http: httpx.Client, name: str, value: str
) -> None:
    # JSON itself has no NaN nor Infinity, and 1e400 is beyond a double: the body is refused.
    body = f'{{"text_input": "one two", "{name}": {value}}}'
    response = http.post("/v2/models/echo/generate", content=body.encode())
    assert response.status_code == 400, response.text
    assert response.json()["error"]


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("name", NUMERIC)
def test_non_finite_settings_as_grpc_doubles_are_invalid_naming_them(
    channel: grpc.Channel, name: str, value: str
) -> None:
    # Before: max_tokens and seed answered INTERNAL "cannot convert float NaN to integer".
    message = service_pb2.ModelInferRequest(model_name="echo")
    message.parameters[name].double_param = float(value)
    entry = message.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    entry.contents.bytes_contents.append(b"one two")
    with pytest.raises(grpc.RpcError) as refused:
        _infer(channel, message)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert name in str(refused.value.details())
    [answer] = _stream(channel, [message])  # the same in a stream: its error, in the stream
    assert name in answer.error_message
    _good_stream(channel)
