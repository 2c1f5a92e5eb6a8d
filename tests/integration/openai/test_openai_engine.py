"""The OpenAI API over a real engine: the zoo's llama-tiny on the transformers backend, served,
with the real `openai` client; greedy answers equal transformers' own `generate`.

One server, shared with test_openai_fields.py (conftest.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import tritonclient.http as th
from tests.toolkit.generative import next_outcome, outcomes
from tests.toolkit.server import LocalServer

transformers = pytest.importorskip("transformers")

MODEL = "llama-tiny"
PROMPT = "Once upon a time, the cat"


@pytest.fixture(scope="module")
def server(llama_server: LocalServer) -> LocalServer:
    return llama_server  # the folder's one engine server (conftest.py)


@pytest.fixture(scope="module")
def client(server: LocalServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=120
    ) as c:
        yield c


@pytest.fixture(scope="module")
def reference(llama_tiny: Path) -> Any:
    """transformers' own greedy generation on the same weights: (text, tokens) of a prompt."""
    folder = llama_tiny / "1"
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)

    def generate(prompt: str, max_tokens: int, chat: bool = False) -> tuple[str, int]:
        ids = (
            tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
            if chat
            else tokenizer(prompt, return_tensors="pt")
        )
        out = model.generate(**ids, max_new_tokens=max_tokens, do_sample=False)[0]
        new = out[ids.input_ids.shape[1] :]
        return tokenizer.decode(new, skip_special_tokens=True), len(new)

    generate.tokenizer = tokenizer  # type: ignore[attr-defined]
    return generate


def test_models_names_the_engines_context(client: openai.OpenAI) -> None:
    [card] = client.models.list().data
    assert card.id == MODEL and card.model_extra == {"max_model_len": 512}


def test_greedy_completions_equal_generate(
    client: openai.OpenAI, server: LocalServer, reference: Any
) -> None:
    want_text, want_tokens = reference(PROMPT, 12)
    before = outcomes(server.http_url, MODEL)
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    assert next_outcome(server.http_url, MODEL, before) == (1, 0)  # answered, not cancelled
    assert answer.choices[0].text == want_text
    assert answer.usage is not None and answer.usage.completion_tokens == want_tokens
    assert answer.choices[0].finish_reason == ("length" if want_tokens == 12 else "stop")
    prompt_tokens = len(reference.tokenizer(PROMPT).input_ids)
    assert answer.usage.prompt_tokens == prompt_tokens

    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want_text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == want_tokens


def test_a_greedy_chat_equals_generate_on_the_template(
    client: openai.OpenAI, reference: Any
) -> None:
    messages: list[Any] = [{"role": "user", "content": "Tell me about the sky"}]
    rendered = reference.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    want_text, _ = reference(rendered, 10, chat=True)
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want_text


def test_max_tokens_ends_with_length(client: openai.OpenAI) -> None:
    answer = client.completions.create(
        model=MODEL,
        prompt="a",
        max_tokens=5,
        temperature=0.8,
        seed=3,
        extra_body={"ignore_eos": True},
    )
    again = client.completions.create(
        model=MODEL,
        prompt="a",
        max_tokens=5,
        temperature=0.8,
        seed=3,
        extra_body={"ignore_eos": True},
    )
    assert answer.choices[0].finish_reason == "length" and answer.usage is not None
    assert answer.usage.completion_tokens == 5
    assert again.choices[0].text == answer.choices[0].text  # the seed gives the same draw


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"prompt": " the" * 600, "max_tokens": 1}, "maximum context length is 512 tokens"),
        ({"max_tokens": -3}, "max_tokens must be at least 1"),
        ({"top_p": 0}, "top_p"),
    ],
)
def test_the_engines_refusals_are_400(
    client: openai.OpenAI, fields: dict[str, object], said: str
) -> None:
    request: dict[str, object] = {"model": MODEL, "prompt": "hi", **fields}
    with pytest.raises(openai.BadRequestError, match=said):
        client.completions.create(**request)  # type: ignore[call-overload]


def test_a_client_that_leaves_ends_its_generation(
    client: openai.OpenAI, server: LocalServer
) -> None:
    before = outcomes(server.http_url, MODEL)
    stream = client.completions.create(
        model=MODEL, prompt="hello", max_tokens=500, stream=True, extra_body={"ignore_eos": True}
    )
    next(iter(stream))
    stream.close()
    # 500 tokens take seconds: the generation is recorded as cancelled, not as answered.
    assert next_outcome(server.http_url, MODEL, before) == (0, 1)
    answer = client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert answer.usage is not None and answer.usage.completion_tokens >= 1


def test_oip_and_openai_requests_interleave(
    client: openai.OpenAI, server: LocalServer, reference: Any
) -> None:
    want, _ = reference(PROMPT, 6)

    def by_oip(_: int) -> str:
        text = th.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
        oip = th.InferenceServerClient(server.http_url)  # gevent's: one per thread
        try:
            result = oip.infer(MODEL, [text], parameters={"max_tokens": 6, "temperature": 0})
        finally:
            oip.close()
        return bytes(result.as_numpy("text_output")[0]).decode()

    def by_openai(_: int) -> str:
        answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
        return answer.choices[0].text

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(f, i) for i in range(3) for f in (by_oip, by_openai)]
        assert [f.result() for f in futures] == [want] * 6


def test_the_docs_example_runs_as_written(
    server: LocalServer, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = Path(__file__).resolve().parents[3] / "docs" / "openai.md"
    [example] = re.findall(r"```python\n(.*?)```", docs.read_text(), re.S)
    exec(example.replace("127.0.0.1:8000", server.http_url), {})  # our own docs, as written
    assert "CompletionUsage(" in capsys.readouterr().out  # the usage chunk, printed last
