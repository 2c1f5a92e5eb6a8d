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

from dlscale.errors import ConfigError
from dlscale.frontends.access import Restriction
from dlscale.server_settings import Security

MODEL = "colours"
KEY = "sk-test-key"


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
    assert answer.status_code == 401 and "authorization" in answer.json()["error"]["message"]


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
    before = outcomes(server.http_url, MODEL)
    with _client(server, KEY) as client:
        stream = client.completions.create(
            model=MODEL, prompt="forever", max_tokens=10**6, stream=True
        )
        next(iter(stream))
        stream.close()
    assert next_outcome(server.http_url, MODEL, before) == (0, 1)


def test_the_oip_routes_stay_open(server: LocalServer) -> None:
    client = th.InferenceServerClient(server.http_url)
    try:
        text = th.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"w"], dtype=object))
        result = client.infer(MODEL, [text], parameters={"max_tokens": 2, "temperature": 0})
        assert bytes(result.as_numpy("text_output")[0]).decode() == " ".join(greedy_words("w", 2))
    finally:
        client.close()


def test_the_api_key_is_a_restriction_of_the_openai_group() -> None:
    security = Security(api_key=KEY)
    bearer = Restriction(frozenset({"openai"}), "authorization", f"Bearer {KEY}")
    assert security.http_restricted == (bearer,)
    # Settings are copied when changed: the key's restriction is not added twice.
    assert Security(http_restricted=security.http_restricted, api_key=KEY) == security
    with pytest.raises(ConfigError, match="several restricted groups"):
        Security(http_restricted=(Restriction.parse("openai:k=v"),), api_key=KEY)


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
