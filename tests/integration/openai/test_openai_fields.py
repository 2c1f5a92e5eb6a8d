"""OpenAI's sampling, logprobs, structured-output and tool fields on a real engine, with the
real `openai` client: the zoo's llama-tiny on the transformers backend (conftest.py's server).

Each field is shown to change the answer as it should (top_k=1 is greedy, min_tokens holds
back the end token, a repetition penalty repeats less, logprobs are the model's own, a schema
is followed); each bad value is a 400 in OpenAI's shape naming its field, after which the
server still answers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from tests.integration.openai.conftest import LLAMA
from tests.toolkit.server import LocalServer

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("xgrammar")

HI: list[Any] = [{"role": "user", "content": "Hi"}]
COLOR = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green"]}},
    "required": ["color"],
    "additionalProperties": False,
}
PAINT: list[Any] = [
    {"type": "function", "function": {"name": "paint", "description": "d", "parameters": COLOR}}
]


@pytest.fixture(scope="module")
def client(llama_server: LocalServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"http://{llama_server.http_url}/v1", api_key="x", max_retries=0, timeout=120
    ) as c:
        yield c


def _chat(client: openai.OpenAI, **fields: Any) -> Any:
    return client.chat.completions.create(model=LLAMA, **{"messages": HI, **fields})


def _bad(client: openai.OpenAI, param: str, **fields: Any) -> None:
    """The request is a 400 in OpenAI's shape naming `param`, and the server goes on."""
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(client, max_tokens=2, **fields)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == param and error["code"] == 400
    assert error["type"] == "BadRequestError"
    answer = _chat(client, max_tokens=2)
    assert answer.usage is not None and answer.usage.completion_tokens >= 1


# -- logprobs ----------------------------------------------------------------------------------


def test_chat_logprobs_are_the_models_own(client: openai.OpenAI, llama_tiny: Path) -> None:
    answer = _chat(
        client, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    entries = answer.choices[0].logprobs.content
    assert (
        len(entries) == 4 and "".join(e.token for e in entries) == answer.choices[0].message.content
    )
    for entry in entries:
        assert entry.bytes == list(entry.token.encode()) and len(entry.top_logprobs) == 3
        best = [t.logprob for t in entry.top_logprobs]
        assert best == sorted(best, reverse=True) and all(lp <= 0 for lp in best)
        assert entry.logprob == best[0]  # greedy takes the best
    # The first token's log-probabilities, as transformers computes them on the same prompt.
    folder = llama_tiny / "1"
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    text = tokenizer.apply_chat_template(HI, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        raw = torch.log_softmax(model(ids).logits[0, -1].float(), dim=-1)
    values, top = raw.topk(3)
    first = entries[0]
    assert [t.token for t in first.top_logprobs] == [tokenizer.decode([int(i)]) for i in top]
    assert [t.logprob for t in first.top_logprobs] == pytest.approx(values.tolist(), abs=1e-4)


def test_streamed_logprobs_add_up_to_the_whole_answers(client: openai.OpenAI) -> None:
    # A long stop string holds the last 20 characters back: tokens go out before their text.
    fields: dict[str, Any] = {
        "max_tokens": 6, "temperature": 0, "logprobs": True, "stop": ["never said, not once"]
    }  # fmt: skip
    whole = _chat(client, **fields).choices[0].logprobs.content
    chunks = list(_chat(client, stream=True, **fields))
    streamed = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole]
    assert all(e.top_logprobs == [] for e in streamed)  # no top_logprobs asked: none listed


def test_completion_logprobs_take_the_legacy_shape(client: openai.OpenAI) -> None:
    answer = client.completions.create(
        model=LLAMA, prompt="Once upon", max_tokens=5, temperature=0, logprobs=2,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and len(logprobs.tokens or []) == 5
    assert "".join(logprobs.tokens or []) == answer.choices[0].text
    assert logprobs.text_offset == [0, *[len("".join(logprobs.tokens[:i])) for i in range(1, 5)]]
    # Greedy: each token is the best of the 2 alternatives listed for it, at its logprob.
    assert logprobs.token_logprobs is not None and len(logprobs.token_logprobs) == 5
    assert logprobs.top_logprobs is not None and len(logprobs.top_logprobs) == 5
    rows = zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True)
    for token, chosen, best in rows:
        assert len(best) == 2 and best[token] == chosen == max(best.values()), (token, best)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ],
)
def test_logprobs_out_of_bounds_are_400(
    client: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    _bad(client, param, **fields)


# -- sampling fields ---------------------------------------------------------------------------


def test_top_k_of_one_is_greedy(client: openai.OpenAI) -> None:
    greedy = _chat(client, max_tokens=12, temperature=0).choices[0].message.content
    drawn = _chat(client, max_tokens=12, temperature=1.5, seed=4).choices[0].message.content
    top1 = _chat(client, max_tokens=12, temperature=1.5, seed=4, extra_body={"top_k": 1})
    assert top1.choices[0].message.content == greedy != drawn


def test_min_tokens_holds_the_end_token_back(client: openai.OpenAI) -> None:
    def ask(seed: int, **more: Any) -> Any:
        return client.completions.create(
            model=LLAMA, prompt="The", max_tokens=128, temperature=1.0, seed=seed, extra_body=more
        )

    # A nearly uniform model draws its end token now and then: find a seed where it does.
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(48)))
    ended = [(s, a) for s, a in enumerate(answers) if a.choices[0].finish_reason == "stop"]
    assert ended, "no seed drew the end token within 128 tokens"
    seed, early = ended[0]
    assert early.usage is not None
    length = early.usage.completion_tokens
    held = ask(seed, min_tokens=length + 3)
    assert held.usage is not None and held.usage.completion_tokens >= length + 3


def test_a_repetition_penalty_repeats_less(client: openai.OpenAI) -> None:
    def tokens(**more: Any) -> list[str]:
        answer = client.completions.create(
            model=LLAMA, prompt="Once upon a time, the cat", max_tokens=40, temperature=0,
            logprobs=0, extra_body={"ignore_eos": True, **more},
        )  # fmt: skip
        return list(answer.choices[0].logprobs.tokens)

    plain, penalised = tokens(), tokens(repetition_penalty=1.5)
    assert len(set(penalised)) > len(set(plain))  # the greedy tiny model loops; penalised less


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_k": -2}, "top_k"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"echo": True}, "echo"),
        ({"presence_penalty": 1.0}, "presence_penalty"),
    ],
)
def test_sampling_fields_out_of_bounds_are_400(
    client: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=LLAMA, prompt="a", max_tokens=2, extra_body=fields)
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == param


# -- response_format ---------------------------------------------------------------------------


def test_a_json_schema_is_followed(client: openai.OpenAI) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "c", "schema": COLOR}}
    for seed in range(3):
        answer = _chat(client, max_tokens=40, temperature=1.0, seed=seed, response_format=schema)
        assert answer.choices[0].finish_reason == "stop"
        assert json.loads(answer.choices[0].message.content) in (
            {"color": "red"},
            {"color": "green"},
        )
    completion = client.completions.create(
        model=LLAMA, prompt="a", max_tokens=40, extra_body={"response_format": schema}
    )
    assert json.loads(completion.choices[0].text)["color"] in ("red", "green")


def test_json_object_answers_an_object(client: openai.OpenAI) -> None:
    answer = _chat(client, max_tokens=24, temperature=0, response_format={"type": "json_object"})
    text = answer.choices[0].message.content
    plain = _chat(client, max_tokens=24, temperature=0).choices[0].message.content
    assert text.startswith("{") and not plain.startswith("{")
    if answer.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}},
            "response_format.json_schema.schema",
        ),
        ("json", "response_format"),
    ],
)
def test_a_bad_response_format_is_400(
    client: openai.OpenAI, response_format: Any, param: str
) -> None:
    _bad(client, param, response_format=response_format)


# -- tools ---------------------------------------------------------------------------------------


def test_the_template_renders_the_tools(client: openai.OpenAI) -> None:
    bare = _chat(client, max_tokens=1, tool_choice="none", tools=PAINT).usage
    without = _chat(client, max_tokens=1).usage
    assert bare is not None and without is not None
    assert bare.prompt_tokens > without.prompt_tokens + 20  # the tools' system turn


def test_a_named_tool_choice_calls_it(client: openai.OpenAI) -> None:
    choice = {"type": "function", "function": {"name": "paint"}}
    answer = _chat(client, max_tokens=40, temperature=0, tools=PAINT, tool_choice=choice)
    message = answer.choices[0].message
    [call] = message.tool_calls
    assert message.content is None and call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "paint"
    assert json.loads(call.function.arguments)["color"] in ("red", "green")
    chunks = list(
        _chat(client, max_tokens=40, temperature=0, tools=PAINT, tool_choice=choice, stream=True)
    )
    calls = [
        t
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
        for t in c.choices[0].delta.tool_calls
    ]
    assert [(t.index, t.function.name, t.function.arguments) for t in calls] == [
        (0, "paint", call.function.arguments)
    ]


def test_a_required_tool_choice_calls_one(client: openai.OpenAI) -> None:
    answer = _chat(
        client, max_tokens=60, temperature=0.7, seed=1, tools=PAINT, tool_choice="required"
    )
    calls = answer.choices[0].message.tool_calls
    assert calls and all(c.function.name == "paint" for c in calls)
    assert all(set(json.loads(c.function.arguments)) == {"color"} for c in calls)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}
                ]
            },
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
            "tools[0].function.name",
        ),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        (
            {"tools": PAINT, "tool_choice": {"type": "function", "function": {"name": "draw"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": PAINT, "tool_choice": "sometimes"}, "tool_choice"),
        (
            {"tools": PAINT, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
        ),
    ],
)
def test_bad_tools_are_400(client: openai.OpenAI, fields: dict[str, Any], param: str) -> None:
    _bad(client, param, **fields)


def test_no_field_is_a_501(llama_server: LocalServer) -> None:
    """Fields this server lacks are a client's 400, not a 501 that the client retries."""
    body = {"model": LLAMA, "prompt": "a", "max_tokens": 1, "suffix": "b"}
    answer = httpx.post(f"http://{llama_server.http_url}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "suffix"


# -- tokenize and detokenize (vLLM's routes) -----------------------------------------------------


def test_tokenize_and_detokenize_are_the_models_tokenizer(
    llama_server: LocalServer, llama_tiny: Path
) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(llama_tiny / "1")
    base = f"http://{llama_server.http_url}"
    prompt = "Once upon a time, the cat"
    said = httpx.post(f"{base}/tokenize", json={"model": LLAMA, "prompt": prompt}).json()
    want = tokenizer(prompt).input_ids
    assert said == {"count": len(want), "tokens": want, "max_model_len": 512}
    chat = httpx.post(f"{base}/tokenize", json={"model": LLAMA, "messages": HI}).json()
    rendered = tokenizer.apply_chat_template(HI, add_generation_prompt=True, tokenize=False)
    assert chat["tokens"] == tokenizer(rendered, add_special_tokens=False).input_ids
    text = httpx.post(f"{base}/detokenize", json={"model": LLAMA, "tokens": want}).json()
    assert text == {"prompt": tokenizer.decode(want)} and text["prompt"].endswith(prompt)


@pytest.mark.parametrize(
    ("route", "fields", "param"),
    [
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ("/detokenize", {"tokens": "1 2 3"}, "tokens"),
        ("/detokenize", {"tokens": [1, -2]}, "tokens"),
        ("/detokenize", {"tokens": [1, 5000]}, "tokens"),  # past the vocabulary (1024)
        ("/detokenize", {"tokens": [2**40]}, "tokens"),
        ("/detokenize", {"model": "nope", "tokens": [1]}, "model"),
    ],
)
def test_bad_tokenize_requests_are_400_or_404(
    llama_server: LocalServer, route: str, fields: dict[str, Any], param: str
) -> None:
    base = f"http://{llama_server.http_url}"
    answer = httpx.post(base + route, json={"model": LLAMA, **fields}, timeout=60)
    assert answer.status_code == (404 if fields.get("model") == "nope" else 400)
    assert answer.json()["error"]["param"] == param
    ok = httpx.post(f"{base}/detokenize", json={"model": LLAMA, "tokens": [10]}, timeout=60)
    assert ok.status_code == 200
