"""Prompts too big for a generative model's context, on every route that takes one (issue 33).

The zoo's llama-tiny (context 512 tokens) on the real transformers engine, served over REST and
gRPC, asked by the real clients. A prompt of more bytes than the context can hold
(context * MAX_BYTES_PER_TOKEN) is refused before it is tokenized: the refusal names the byte
bound, where before the fix a prompt of a few MB was tokenized on the event loop (seconds during
which no other request was answered) and only then refused by its token count. A chat of a huge
number of messages is refused the same way, or by the cap on messages. Meanwhile a normal request
on another connection is answered. The hypothesis fuzz draws prompts around the bound.
"""

from __future__ import annotations

import json
import queue
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.toolkit.fuzz import bounded
from tests.toolkit.server import LocalServer, serving

from dlscale.wire.generative import MAX_BYTES_PER_TOKEN, MAX_MESSAGES

pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
th = pytest.importorskip("tritonclient.http")
tg = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

MODEL = "llama-tiny"
CONTEXT = 512
BOUND = CONTEXT * MAX_BYTES_PER_TOKEN
#: A few MB: beyond the bound by far, within the body and gRPC message limits.
HUGE = "a " * 2**21
#: The OpenAI routes refuse a prompt above 2 MiB themselves (decode.MAX_PROMPT_BYTES): one below
#: that reaches the model's bound.
LARGE = "a " * 2**19
#: A chat of a huge number of (short) messages.
MANY = [{"role": "user", "content": "hi"}] * 100_000
PATIENCE_S = 120.0
#: What the refusal of a prompt by its bytes says (a prompt refused by its tokens says neither).
BY_BYTES = f"at most {BOUND} bytes"

Prompt = str | list[dict[str, str]]


@pytest.fixture(scope="module")
def server(llama_tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("bounds")
    shutil.copytree(llama_tiny, root / MODEL)
    # Bodies of a few MB, as the server's default limits (64 MiB) take them.
    with serving(root, max_body_bytes=16 * 2**20) as running:
        yield running


def _oip(prompt: Prompt) -> tuple[str, dict[str, Any]]:
    """The text_input and parameters of a prompt on the OIP routes (a chat: its JSON)."""
    if isinstance(prompt, str):
        return prompt, {"max_tokens": 2}
    return json.dumps(prompt, separators=(",", ":")), {"max_tokens": 2, "input_format": "chat"}


def _rest(route: str) -> Callable[[LocalServer, Prompt], str]:
    def send(server: LocalServer, prompt: Prompt) -> str:
        text, parameters = _oip(prompt)
        body = {"text_input": text, "parameters": parameters}
        url = f"http://{server.http_url}/v2/models/{MODEL}/{route}"
        answer = httpx.post(url, json=body, timeout=PATIENCE_S)
        assert answer.status_code == 400, answer.text
        message: str = answer.json()["error"]
        return message

    return send


def _infer(server: LocalServer, prompt: Prompt) -> str:
    text, parameters = _oip(prompt)
    client = th.InferenceServerClient(server.http_url, network_timeout=PATIENCE_S)
    tensor = th.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=object))
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.infer(MODEL, [tensor], parameters=parameters)
    finally:
        client.close()
    assert refused.value.status() == "400"
    return str(refused.value.message())


def _grpc_infer(server: LocalServer, prompt: Prompt) -> str:
    text, parameters = _oip(prompt)
    client = tg.InferenceServerClient(server.grpc_url)
    tensor = tg.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=object))
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.infer(MODEL, [tensor], parameters=parameters, client_timeout=PATIENCE_S)
    finally:
        client.close()
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    return str(refused.value.message())


def _grpc_stream(server: LocalServer, prompt: Prompt) -> str:
    text, parameters = _oip(prompt)
    client = tg.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    tensor = tg.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=object))
    try:
        client.async_stream_infer(MODEL, [tensor], parameters=parameters)
        result, error = results.get(timeout=PATIENCE_S)
    finally:
        client.stop_stream()
        client.close()
    assert result is None and error is not None  # the request's error, said in the stream
    return str(error.message())


def _openai_refusal(server: LocalServer, create: Callable[[Any], object]) -> str:
    """The message of an OpenAI route's 400, checked to be in OpenAI's error shape."""
    base = f"http://{server.http_url}/v1"
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=PATIENCE_S)
    with client, pytest.raises(openai.BadRequestError) as refused:
        create(client)
    error = refused.value.body
    assert isinstance(error, dict) and error["type"] == "BadRequestError" and error["code"] == 400
    return str(error["message"])


def _completions(server: LocalServer, prompt: Prompt) -> str:
    assert isinstance(prompt, str)
    return _openai_refusal(
        server, lambda c: c.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    )


def _chat(server: LocalServer, prompt: Prompt) -> str:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return _openai_refusal(
        server, lambda c: c.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    )


#: Every route that takes a prompt, OIP's (with the chat form) and OpenAI's.
OIP = {
    "generate": _rest("generate"),
    "generate_stream": _rest("generate_stream"),
    "infer": _infer,
    "grpc ModelInfer": _grpc_infer,
    "grpc ModelStreamInfer": _grpc_stream,
}
ROUTES = {**OIP, "/v1/completions": _completions, "/v1/chat/completions": _chat}


def _normal(server: LocalServer) -> int:
    """A normal request on a connection of its own: the tokens it was answered."""
    # ignore_eos: the default draw (temperature 1) may end on the end token after one token.
    body = {"text_input": "the cat sat", "parameters": {"max_tokens": 2, "ignore_eos": True}}
    url = f"http://{server.http_url}/v2/models/{MODEL}/generate"
    answer = httpx.post(url, json=body, timeout=PATIENCE_S)
    assert answer.status_code == 200, answer.text
    tokens: int = answer.json()["num_output_tokens"]
    return tokens


def _refused_beside_a_normal_request(
    server: LocalServer, send: Callable[[LocalServer, Prompt], str], prompt: Prompt
) -> str:
    """`send`'s refusal of `prompt`, while a normal request on another connection is answered."""
    with ThreadPoolExecutor(2) as pool:
        refused = pool.submit(send, server, prompt)
        answered = pool.submit(_normal, server)
        assert answered.result(timeout=PATIENCE_S) == 2
        return refused.result(timeout=PATIENCE_S)


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_prompt_too_long_for_the_context_is_refused_by_its_bytes(
    server: LocalServer, route: str
) -> None:
    prompt = LARGE if route.startswith("/v1") else HUGE
    message = _refused_beside_a_normal_request(server, ROUTES[route], prompt)
    assert BY_BYTES in message and "before tokenizing" in message, message


@pytest.mark.parametrize("route", [*OIP, "/v1/chat/completions"])
def test_a_chat_of_a_huge_number_of_messages_is_refused(server: LocalServer, route: str) -> None:
    # Four times the bound through the openai client: it spends 40 s building a body of
    # 100,000 messages, which the server refuses in 0.25 s (measured with httpx).
    many = MANY if route in OIP else MANY[: 4 * MAX_MESSAGES]
    message = _refused_beside_a_normal_request(server, ROUTES[route], many)
    # OpenAI's route counts the messages it reads; OIP's chat form is refused by its bytes,
    # before its JSON is read: either way nothing was rendered or tokenized.
    assert (f"at most {MAX_MESSAGES} messages" if route.startswith("/v1") else BY_BYTES) in message


_pieces = st.sampled_from(["a", "a ", "\n", "é", "字", "🙂 ", "the cat "])
_paths = st.sampled_from([f"/v2/models/{MODEL}/generate", "/v1/completions"])


@bounded(20)
@given(piece=_pieces, size=st.integers(1, 3 * BOUND), path=_paths)
def test_prompts_around_the_bound_are_answered_or_refused_by_their_size(
    server: LocalServer, piece: str, size: int, path: str
) -> None:
    prompt = piece * -(-size // len(piece.encode()))
    body = {"model": MODEL, "max_tokens": 1}
    body["prompt" if path.startswith("/v1") else "text_input"] = prompt
    answer = httpx.post(f"http://{server.http_url}{path}", json=body, timeout=PATIENCE_S)
    if answer.status_code == 200:
        assert len(prompt.encode()) <= BOUND
        return
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    message = error if isinstance(error, str) else error["message"]
    # Beyond the bound: refused by its bytes; within it, only by its tokens.
    by_tokens = "maximum context length is 512 tokens"
    assert (BY_BYTES if len(prompt.encode()) > BOUND else by_tokens) in message
