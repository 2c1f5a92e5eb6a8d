"""A vLLM user's habits against a real server: the zoo's llama-tiny served from its Hugging Face
folder with vLLM's flags (`dlscale serve DIR --served-model-name --max-model-len`), asked with
the real `openai` client (one chunk per token, vLLM's 400s naming their field, token-id prompts
and lists of prompts) and with tritonclient as Triton's vLLM-backend tutorial asks (the
`stream`, `sampling_parameters` and `exclude_input_in_output` inputs, gRPC streaming and REST
generate).

One server for the module: its KV cache holds 256 tokens and its max_model_len is 384, so that
a sequence may fit the context but not the cache.
"""

from __future__ import annotations

import json
import logging
import queue
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
from tests.toolkit.server import HOST, LocalServer

from dlscale.cli import parse
from dlscale.server_settings.flags import settings_from

transformers = pytest.importorskip("transformers")

NAME = "tiny"
MAX_MODEL_LEN = 384
#: llama-tiny's KV cache: 4 layers x 2 heads x 32 dims x K and V x 4 bytes = 2 KiB a token;
#: 4 pages of 64 tokens.
CACHE_TOKENS = 256
KV_BYTES = CACHE_TOKENS * 2048
PROMPT = "Once upon a time, the cat"


#: A chat template of the server's own (--chat-template), instead of the tokenizer's.
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"


@pytest.fixture(scope="module")
def server(llama_tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(TEMPLATE)
    argv = ["serve", str(llama_tiny / "1"), "--served-model-name", NAME]
    argv += ["--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-memory-bytes", str(KV_BYTES)]
    argv += ["--chat-template", str(template)]
    settings = settings_from(parse(argv)).replace(
        host=HOST, http_port=0, grpc_port=0, metrics_port=None, grace_s=5.0
    )
    with LocalServer(settings) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: LocalServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=120
    ) as c:
        yield c


@pytest.fixture(scope="module")
def tokenizer(llama_tiny: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(llama_tiny / "1")


def greedy(client: openai.OpenAI, prompt: Any, tokens: int = 8) -> str:
    answer = client.completions.create(model=NAME, prompt=prompt, max_tokens=tokens, temperature=0)
    return answer.choices[0].text


# -- item 2: a Hugging Face folder is one model, named as asked, with vLLM's max_model_len -------


def test_the_folder_is_one_model_named_by_served_model_name(client: openai.OpenAI) -> None:
    [card] = client.models.list().data
    assert card.id == NAME and card.model_extra == {"max_model_len": MAX_MODEL_LEN}
    assert greedy(client, PROMPT)


def test_chat_template_replaces_the_tokenizers(client: openai.OpenAI, tokenizer: Any) -> None:
    answer = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "hi there"}], max_tokens=2
    )
    rendered = "<user>hi there<assistant>"
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == len(
        tokenizer(rendered, add_special_tokens=False).input_ids
    )
    default = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi there"}], add_generation_prompt=True, tokenize=False
    )
    # The tokenizer's own template would have counted otherwise.
    assert len(tokenizer(default, add_special_tokens=False).input_ids) != answer.usage.prompt_tokens


# -- item 7: one chunk per token ------------------------------------------------------------------


def test_a_stream_sends_one_chunk_per_token(client: openai.OpenAI) -> None:
    # A random model's tokens often decode to nothing alone (a byte of a character, a special
    # token): each still has its chunk, as vLLM sends.
    chunks = list(
        client.completions.create(
            model=NAME,
            prompt=PROMPT,
            max_tokens=60,
            temperature=1.0,
            seed=11,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 60
    assert len([c for c in chunks if c.choices]) == usage.completion_tokens

    chat = list(
        client.chat.completions.create(
            model=NAME,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=40,
            temperature=1.0,
            seed=5,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert chat[-1].usage is not None and chat[-1].usage.completion_tokens == 40
    # The first chunk names the role; then one per token.
    assert len([c for c in chat if c.choices]) == 1 + 40


# -- item 7: refusals in vLLM's words, each naming its field --------------------------------------


@pytest.mark.parametrize(
    ("fields", "said", "param"),
    [
        (
            {"prompt": " the" * 400, "max_tokens": 1},
            f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you "
            "requested 401 tokens in the prompt",
            "prompt",
        ),
        (
            {"max_tokens": MAX_MODEL_LEN},
            f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you "
            f"requested {MAX_MODEL_LEN + 3} tokens (3 in the prompt, {MAX_MODEL_LEN} in the "
            "completion)",
            "max_tokens",
        ),
        ({"max_tokens": -1}, "max_tokens must be at least 1", "max_tokens"),
        ({"temperature": 5}, "temperature must be between", "temperature"),
        ({"top_p": 2}, "top_p must be above 0", "top_p"),
        ({"seed": -4}, "seed must be between", "seed"),
        ({"prompt": [3, 99999]}, "token id 99999 is out of this model's vocabulary", "prompt"),
        ({"prompt": [[1, 2], "mixed"]}, "all of one kind", "prompt"),
        ({"priority": -1}, "parameter 'priority' must be a non-negative integer", "priority"),
    ],
)
def test_refusals_are_400s_naming_their_field(
    client: openai.OpenAI, fields: dict[str, Any], said: str, param: str
) -> None:
    body = dict(fields)
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=NAME, prompt=body.pop("prompt", "hi"), extra_body=body)
    assert refused.value.status_code == 400 and said in refused.value.message
    assert refused.value.param == param


def test_a_sequence_larger_than_the_kv_cache_is_a_400_and_the_engine_lives(
    client: openai.OpenAI,
) -> None:
    # Within max_model_len (300 + 10 < 384), beyond the cache's 256 tokens: the engine's
    # scheduler could neither place it nor offload it, and stopped for every request.
    with pytest.raises(openai.BadRequestError, match="KV cache") as refused:
        client.completions.create(model=NAME, prompt=" the" * 299, max_tokens=10)
    assert refused.value.param == "max_tokens"
    assert greedy(client, PROMPT) == greedy(client, PROMPT)


# -- item 7: token-id prompts and lists of prompts ------------------------------------------------


def test_a_token_id_prompt_answers_as_its_text(client: openai.OpenAI, tokenizer: Any) -> None:
    ids = tokenizer(PROMPT).input_ids
    assert greedy(client, ids) == greedy(client, PROMPT)


def test_a_list_of_prompts_gets_one_choice_each_in_order(
    client: openai.OpenAI, tokenizer: Any
) -> None:
    prompts = ["the cat", PROMPT, "a"]
    alone = [greedy(client, p) for p in prompts]
    answer = client.completions.create(model=NAME, prompt=prompts, max_tokens=8, temperature=0)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert [c.text for c in answer.choices] == alone
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == sum(len(tokenizer(p).input_ids) for p in prompts)

    by_ids = [tokenizer(p).input_ids for p in prompts]
    answer = client.completions.create(model=NAME, prompt=by_ids, max_tokens=8, temperature=0)
    assert [c.text for c in answer.choices] == alone

    chunks = list(
        client.completions.create(
            model=NAME, prompt=prompts, max_tokens=8, temperature=0, stream=True
        )
    )
    texts = ["", "", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == alone


# -- item 4: Triton's vLLM-backend clients --------------------------------------------------------


def _tutorial_request(prompt: str, stream: bool, exclude: bool) -> dict[str, Any]:
    """A request as Triton's vLLM tutorial client builds it: settings as strings, both as a
    JSON input and as request parameters; only text_output asked for."""
    settings = {"temperature": "0", "max_tokens": "8"}
    inputs = []
    for name, datatype, value in (
        ("text_input", "BYTES", np.array([prompt.encode()], dtype=object)),
        ("stream", "BOOL", np.array([stream], dtype=bool)),
        ("sampling_parameters", "BYTES", np.array([json.dumps(settings).encode()], dtype=object)),
        ("exclude_input_in_output", "BOOL", np.array([exclude], dtype=bool)),
    ):
        tensor = grpcclient.InferInput(name, [1], datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return {
        "model_name": NAME,
        "inputs": inputs,
        "outputs": [grpcclient.InferRequestedOutput("text_output")],
        "request_id": "1",
        "parameters": settings,
    }


def _grpc_texts(server: LocalServer, request: dict[str, Any]) -> list[str]:
    results: queue.SimpleQueue[Any] = queue.SimpleQueue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(
            callback=partial(lambda q, result, error: q.put((result, error)), results)
        )
        client.async_stream_infer(**request)
        client.stop_stream()  # waits for the stream's end
    finally:
        client.close()
    texts = []
    while not results.empty():
        result, error = results.get()
        assert error is None, error
        texts.append(bytes(result.as_numpy("text_output")[0]).decode())
    return texts


def test_the_triton_vllm_tutorial_client_streams_over_grpc(
    server: LocalServer, client: openai.OpenAI
) -> None:
    want = greedy(client, PROMPT)
    streamed = _grpc_texts(server, _tutorial_request(PROMPT, stream=True, exclude=True))
    assert len(streamed) > 1 and "".join(streamed) == want
    assert _grpc_texts(server, _tutorial_request(PROMPT, stream=False, exclude=True)) == [want]
    whole = _grpc_texts(server, _tutorial_request(PROMPT, stream=False, exclude=False))
    assert whole == [PROMPT + want]


def test_rest_generate_takes_the_same_fields(server: LocalServer, client: openai.OpenAI) -> None:
    want = greedy(client, PROMPT)
    body = {
        "text_input": PROMPT,
        "stream": False,
        "sampling_parameters": json.dumps({"temperature": "0", "max_tokens": "8"}),
        "exclude_input_in_output": False,
    }
    url = f"http://{server.http_url}/v2/models/{NAME}"
    answer = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["text_output"] == PROMPT + want
    # stream false on generate_stream: one event holding the whole text.
    events = httpx.post(f"{url}/generate_stream", json=body, timeout=60).text
    datas = [json.loads(line[6:]) for line in events.splitlines() if line.startswith("data: ")]
    assert [d["text_output"] for d in datas] == [PROMPT + want]
    bad = httpx.post(f"{url}/generate", json={**body, "sampling_parameters": "[1]"}, timeout=60)
    assert bad.status_code == 400 and "sampling_parameters must be a JSON object" in bad.text


def test_a_path_without_models_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: `dlscale serve DIR` on a folder of weights, or an empty one, said it was ready
    # with nothing to serve and nothing else.
    settings = settings_from(parse(["serve", str(tmp_path)])).replace(
        host=HOST, http_port=0, grpc_port=None, metrics_port=None
    )
    with caplog.at_level(logging.WARNING, logger="dlscale.server"), LocalServer(settings):
        pass
    assert f"{tmp_path} holds no models" in caplog.text
