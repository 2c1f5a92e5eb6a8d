"""The OpenAI API with the real `openai` client, against a served generative Python model.

One server for the module: the colours model (tests/toolkit/generative.py), which streams by
the generative contract, and a classic ONNX model beside it. The same routes over a real
engine (llama-tiny on transformers) are in test_openai_engine.py.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as th
from tests.toolkit.generative import (
    MAX_MODEL_LEN,
    greedy_words,
    next_outcome,
    outcomes,
    write_colours,
)
from tests.toolkit.models import identity_graph, write_model
from tests.toolkit.server import LocalServer, serving

MODEL = "colours"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("repo")
    write_colours(root)
    write_model(root, "identity", identity_graph(4), "max_batch_size = 8\n")
    with serving(root, grpc_port=None) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: LocalServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60
    ) as c:
        yield c


@pytest.fixture(scope="module")
def http(server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=60) as c:
        yield c


def test_models_lists_the_generative_ones(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]  # the ONNX model is not generative
    assert models[0].object == "model" and models[0].model_extra == {"max_model_len": MAX_MODEL_LEN}
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("absent")


def test_a_classic_model_answers_tf_serving_status_on_the_shared_path(http: httpx.Client) -> None:
    # GET /v1/models/NAME is OpenAI's retrieve and TensorFlow Serving's model status: a model
    # that is not generative answers the latter (docs/tfserving.md).
    status = http.get("/v1/models/identity").json()["model_version_status"]
    assert [(s["version"], s["state"]) for s in status] == [("1", "AVAILABLE")]
    assert http.get(f"/v1/models/{MODEL}").json()["object"] == "model"


def test_a_completion_answers_with_usage(client: openai.OpenAI, server: LocalServer) -> None:
    prompt = "one two three"
    before = outcomes(server.http_url, MODEL)
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
    assert next_outcome(server.http_url, MODEL, before) == (1, 0)  # answered, not cancelled
    assert answer.object == "text_completion" and answer.id.startswith("cmpl-")
    choice = answer.choices[0]
    assert choice.text == " ".join(greedy_words(prompt, 4)) and choice.finish_reason == "length"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (3, 4)
    assert answer.usage.total_tokens == 7


def test_a_chat_answers_as_the_assistant(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "be"}, {"role": "user", "content": "kind"}],
        max_completion_tokens=2,
        temperature=0,
    )
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    message = answer.choices[0].message
    assert message.role == "assistant" and message.content == " ".join(greedy_words("be kind", 2))
    assert answer.usage is not None and answer.usage.completion_tokens == 2


def test_a_streamed_completion_is_the_same_text(client: openai.OpenAI, server: LocalServer) -> None:
    prompt = "a b"
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0)
    before = outcomes(server.http_url, MODEL)
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) == 5 and "".join(texts) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None and last.usage.total_tokens == 7
    assert all(c.usage is None for c in chunks[:-1])
    assert next_outcome(server.http_url, MODEL, before) == (1, 0)


def test_a_streamed_chat_names_the_role_first(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=3,
        temperature=0,
        stream=True,
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == " ".join(greedy_words("hello", 3))
    assert chunks[-1].choices[0].finish_reason == "length"
    assert len({c.id for c in chunks}) == 1


def test_a_stop_string_ends_the_answer(client: openai.OpenAI) -> None:
    words = greedy_words("x", 8)
    answer = client.completions.create(
        model=MODEL, prompt="x", max_tokens=8, temperature=0, stop=[words[2]]
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and choice.text == " ".join(words[:2]) + " "


def test_a_seed_gives_the_same_sample_again(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        answer = client.completions.create(
            model=MODEL, prompt="p", max_tokens=12, temperature=1.0, seed=seed
        )
        return answer.choices[0].text

    assert sample(5) == sample(5)
    assert sample(5) != sample(6)


def test_the_request_id_comes_from_the_client(client: openai.OpenAI) -> None:
    answer = client.completions.create(
        model=MODEL, prompt="p", max_tokens=1, extra_headers={"X-Request-Id": "abc-1"}
    )
    assert answer.id == "cmpl-abc-1"


# -- errors ---------------------------------------------------------------------------------------


def test_an_unknown_model_is_404_in_openais_words(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="nope", prompt="p")
    assert caught.value.body == {
        "message": "The model `nope` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"max_tokens": -1}, "max_tokens must be at least 1"),
        ({"prompt": "w " * (MAX_MODEL_LEN + 1)}, "max_model_len"),
        ({"temperature": 3.0}, "temperature must be between"),
        ({"n": 2}, "n must be 1"),
        ({"max_tokens": "many"}, "max_tokens must be an integer"),
        ({"stop": [""]}, "stop takes at most"),
    ],
)
def test_bad_requests_are_400_with_the_reason(
    client: openai.OpenAI, fields: dict[str, object], said: str
) -> None:
    request: dict[str, object] = {"model": MODEL, "prompt": "p", **fields}
    with pytest.raises(openai.BadRequestError, match=said) as caught:
        client.completions.create(**request)  # type: ignore[call-overload]
    assert caught.value.status_code == 400


def test_a_model_that_is_not_generative_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="identity", prompt="p")


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"{not json", "malformed JSON"),
        (b"[]", "JSON object"),
        (b'{"model": "colours", "messages": "hi"}', "messages must be"),
        (b'{"model": "colours", "messages": [{"role": "user", "content": 1}]}', "content"),
    ],
)
def test_malformed_bodies_are_400(http: httpx.Client, body: bytes, said: str) -> None:
    answer = http.post("/v1/chat/completions", content=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert said in error["message"] and error["code"] == 400 and error["type"] == "BadRequestError"


def test_a_compressed_body_is_held_to_the_body_limit(http: httpx.Client) -> None:
    # 8 MiB of prompt in 8 KiB of gzip: inflated no further than the server's 4 MiB limit.
    body = b'{"model": "colours", "prompt": "' + b"a" * (8 * 2**20) + b'"}'
    headers = {"content-encoding": "gzip", "content-type": "application/json"}
    answer = http.post("/v1/completions", content=gzip.compress(body), headers=headers)
    assert answer.status_code == 413 and "decompressed body" in answer.json()["error"]["message"]
    unknown = http.post("/v1/completions", content=b"{}", headers={"content-encoding": "br"})
    assert unknown.status_code == 415 and unknown.json()["error"]["code"] == 415


def test_wrong_methods_and_routes(http: httpx.Client) -> None:
    wrong = http.get("/v1/completions")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    missing = http.get("/v1/responses")
    assert missing.status_code == 404 and "error" in missing.json()


def test_a_failure_mid_stream_is_an_error_event_then_done(
    client: openai.OpenAI, http: httpx.Client
) -> None:
    body = {"model": MODEL, "prompt": "fail", "max_tokens": 8, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as answer:
        assert answer.status_code == 200
        events = [line for line in answer.iter_lines() if line]
    assert len(events) == 4 and events[-1] == "data: [DONE]"
    assert '"error"' in events[-2] and "failed" in events[-2]
    with pytest.raises(openai.APIError, match="failed"):
        list(client.completions.create(model=MODEL, prompt="fail", max_tokens=8, stream=True))


# -- the queue ------------------------------------------------------------------------------------


def test_a_client_that_leaves_frees_its_sequence(
    client: openai.OpenAI, server: LocalServer
) -> None:
    # Two seats: two endless generations hold both. Each is recorded as cancelled once its
    # client leaves, and the next request is answered (it would wait forever otherwise).
    for _ in range(2):
        before = outcomes(server.http_url, MODEL)
        stream = client.completions.create(
            model=MODEL, prompt="forever", max_tokens=10**6, stream=True
        )
        next(iter(stream))
        stream.close()
        assert next_outcome(server.http_url, MODEL, before) == (0, 1)
    answer = client.completions.create(
        model=MODEL, prompt="after", max_tokens=2, temperature=0, extra_body={"timeout": 30_000_000}
    )
    assert answer.choices[0].text == " ".join(greedy_words("after", 2))


def test_oip_and_openai_requests_share_the_model(
    client: openai.OpenAI, server: LocalServer
) -> None:
    def by_oip(index: int) -> str:
        text = th.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([f"w{index}".encode()], dtype=object))
        oip = th.InferenceServerClient(server.http_url)  # gevent's: one per thread
        try:
            result = oip.infer(MODEL, [text], parameters={"max_tokens": 2, "temperature": 0})
        finally:
            oip.close()
        return bytes(result.as_numpy("text_output")[0]).decode()

    def by_openai(index: int) -> str:
        answer = client.completions.create(
            model=MODEL, prompt=f"w{index}", max_tokens=2, temperature=0, extra_body={"priority": 1}
        )
        return answer.choices[0].text

    want = " ".join(greedy_words("w", 2))
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(f, i) for i in range(4) for f in (by_oip, by_openai)]
        assert [f.result() for f in futures] == [want] * 8


def test_a_priority_the_model_lacks_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="priority"):
        client.completions.create(model=MODEL, prompt="p", extra_body={"priority": 7})


def test_many_streams_at_once_are_all_answered(client: openai.OpenAI) -> None:
    barrier = threading.Barrier(6)

    def stream(index: int) -> str:
        barrier.wait()
        chunks = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "z"}],
            max_tokens=3,
            temperature=0,
            stream=True,
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks)

    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(stream, range(6))) == [" ".join(greedy_words("z", 3))] * 6
