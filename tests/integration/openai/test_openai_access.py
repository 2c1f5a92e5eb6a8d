"""The OpenAI API behind `--api-key`, served by REST worker processes (`--http-workers`).

One server for the module: the colours model (tests/toolkit/generative.py), one REST worker
that forwards each Plane call, streams included, to the model process.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as th
from tests.toolkit.generative import greedy_words, next_outcome, outcomes, write_colours
from tests.toolkit.server import LocalServer, serving
from tritonclient.utils import InferenceServerException

from dlscale.errors import ConfigError
from dlscale.frontends.access import Restriction
from dlscale.frontends.api_key import ApiKey
from dlscale.server_settings import Security

MODEL = "colours"
KEY = "sk-test-key"
BEARER = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("repo")
    write_colours(root)
    with serving(root, grpc_port=None, api_key=KEY, http_workers=1) as running:
        yield running


def _client(server: LocalServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://{server.http_url}/v1", api_key=key, max_retries=0, timeout=60
    )


def test_without_the_key_the_openai_routes_answer_401(server: LocalServer) -> None:
    with _client(server, "wrong") as client:
        with pytest.raises(openai.AuthenticationError) as caught:
            client.models.list()
        assert caught.value.status_code == 401
        assert caught.value.body["type"] == "AuthenticationError"  # type: ignore[index]
        with pytest.raises(openai.AuthenticationError):
            client.completions.create(model=MODEL, prompt="p")
    answer = httpx.post(f"http://{server.http_url}/v1/completions", json={"model": MODEL})
    assert answer.status_code == 401 and "Authorization" in answer.json()["error"]["message"]


def test_with_the_key_a_worker_streams_the_answer(server: LocalServer) -> None:
    with _client(server, KEY) as client:
        assert [m.id for m in client.models.list().data] == [MODEL]
        chunks = list(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "q"}],
                max_tokens=3,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == " ".join(greedy_words("q", 3))
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_a_client_that_leaves_a_worker_ends_its_generation(server: LocalServer) -> None:
    before = outcomes(server.http_url, MODEL, BEARER)
    with _client(server, KEY) as client:
        stream = client.completions.create(
            model=MODEL, prompt="forever", max_tokens=10**6, stream=True
        )
        next(iter(stream))
        stream.close()
    assert next_outcome(server.http_url, MODEL, before, BEARER) == (0, 1)


def test_a_worker_holds_the_oip_routes_to_the_key_too(server: LocalServer) -> None:
    """--api-key's default scope is every route: a REST worker process applies it as well."""
    client = th.InferenceServerClient(server.http_url)
    text = th.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"w"], dtype=object))
    parameters = {"max_tokens": 2, "temperature": 0}
    try:
        with pytest.raises(InferenceServerException, match="no Authorization header") as caught:
            client.infer(MODEL, [text], parameters=parameters)
        assert caught.value.status() == "401"
        result = client.infer(MODEL, [text], parameters=parameters, headers=dict(BEARER))
        assert bytes(result.as_numpy("text_output")[0]).decode() == " ".join(greedy_words("w", 2))
        assert client.is_server_ready()  # readiness stays open
    finally:
        client.close()
    url = f"http://{server.http_url}/v2/models/{MODEL}/generate_stream"
    wrong = httpx.post(url, json={"text_input": "w"}, headers={"authorization": "Bearer no"})
    assert wrong.status_code == 401 and "not this server's key" in wrong.json()["error"]


def test_the_api_key_is_no_restriction_and_goes_with_one() -> None:
    """The key is checked before any restricted group: a group may still have its own header."""
    security = Security(api_key=KEY)
    assert security.http_restricted == () and security.key == ApiKey(KEY)
    admin = Restriction.parse("openai,model-repository:admin-key=a")
    assert Security(http_restricted=(admin,), api_key=KEY).http_access()
    with pytest.raises(ConfigError, match="scope"):
        Security(api_key=KEY, api_key_scope="grpc")


@pytest.mark.parametrize(("key", "answered"), [(KEY, True), (None, False)])
def test_the_generative_bench_sends_its_api_key(
    server: LocalServer, key: str | None, answered: bool
) -> None:
    """`dlscale bench --generative ... --api-key` measures a server started with --api-key."""
    import asyncio

    from dlscale.bench.generative.client import StreamClient
    from dlscale.bench.generative.endpoints import Ask, Endpoint

    async def one() -> tuple[bool, str | None]:
        url = f"http://{server.http_url}"
        async with StreamClient(url, Endpoint.parse("chat"), MODEL, api_key=key) as client:
            record = await client.stream(Ask("q", 2))
        return record.ok, record.error

    ok, error = asyncio.run(one())
    assert ok == answered
    assert answered or "401" in (error or "")


def test_vllms_health_is_open_and_its_version_needs_the_key(server: LocalServer) -> None:
    base = f"http://{server.http_url}"
    health = httpx.get(f"{base}/health")  # no key: probes need none, as on /v2/health/*
    assert health.status_code == 200 and health.content == b""
    refused = httpx.get(f"{base}/version")
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "AuthenticationError"
    version = httpx.get(f"{base}/version", headers=BEARER)
    assert version.status_code == 200 and version.json()["version"]
    wrong = httpx.post(f"{base}/health")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET"


def test_tokenize_needs_the_key_and_a_tokenizing_engine(server: LocalServer) -> None:
    url = f"http://{server.http_url}/tokenize"
    body = {"model": MODEL, "prompt": "red"}
    assert httpx.post(url, json=body).status_code == 401
    answer = httpx.post(url, json=body, headers=BEARER)  # a Python model: no tokenizer
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "model"
